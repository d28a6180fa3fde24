package pass

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/horizon"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Daemon is a pass of `run`, when this instance may: not against a
// standby, only while it holds the lease, not while the database does not
// answer; and what the daemon measures and remembers around its passes, so
// that state changes are logged once, not every pass. Scheduling passes is
// the caller's.
type Daemon struct {
	*Driver
	lease   *lease.Lease
	metrics *Metrics
	horizon *horizon.Watch
	state   string
	inForce map[string]bool
	// outages is the account of the database's outages, shared with the
	// lease and the throttle (whichever meets one first says it, in the
	// daemon's words: sayDown, sayUp): while one lasts, passes are
	// skipped, and counted in skipped.
	outages *outage.Log
	skipped atomic.Int64

	mu     sync.Mutex
	scrape []*catalog.Table // the tables in force, for what a scrape measures
}

// NewDaemon runs d's passes under ls, exporting to d's Metrics (required),
// and says the database's outages in outages (nil: a log of its own).
// What changes slowly (the tiers' sizes, the installed rules, the retained
// first-seen ranges) is measured when /metrics is scraped, not every pass:
// a daemon that is not scraped does not read it at all.
func NewDaemon(d *Driver, ls *lease.Lease, outages *outage.Log) *Daemon {
	d.Lease = ls.Check
	d.slowAtScrape = true
	if outages == nil {
		outages = outage.New(nil)
	}
	dm := &Daemon{Driver: d, lease: ls, metrics: d.Metrics, horizon: horizon.NewWatch(d.Pool, d.Metrics.Horizon, d.Log), outages: outages}
	outages.SayDatabase(dm.sayDown, dm.sayUp)
	d.outages = outages
	d.Metrics.MeasureAtScrape(dm.measureFacts)
	return dm
}

// measureFacts measures, for a scrape, the facts of the tables in force,
// when this instance is the active one (a waiting instance exports nothing
// per table).
func (d *Daemon) measureFacts(ctx context.Context) {
	if !d.lease.Held() || d.outages.Open(outage.Database) {
		return // an outage: nothing to measure, and it is said already
	}
	d.mu.Lock()
	tables := d.scrape
	d.mu.Unlock()
	d.measureSlow(ctx, tables)
	if _, err := d.horizon.Update(ctx, false); err != nil && ctx.Err() == nil {
		d.warn("inboxkeeper: read the xmin horizon for metrics", err)
	}
}

// Use puts a (re)loaded policy's tables in force: the next pass builds its
// stages for them, and what was measured of a table the policy no longer
// names is no longer exported.
func (d *Daemon) Use(tables []*catalog.Table) {
	d.Driver.Use(tables)
	d.mu.Lock()
	d.scrape = tables
	d.mu.Unlock()
	d.inForce = map[string]bool{}
	for _, t := range tables {
		d.inForce[t.Name] = true
	}
	d.metrics.Facts.KeepTables(func(table string) bool { return d.inForce[table] })
}

// ReloadFailed says the policy file on disk is not the one in force: its
// last change failed its checks.
func (d *Daemon) ReloadFailed() { d.metrics.Daemon.ReloadOK.Set(0) }

func (d *Daemon) say(state string, args ...any) { d.sayAt(slog.LevelInfo, state, args...) }

// sayAt logs a new state at level, once.
func (d *Daemon) sayAt(level slog.Level, state string, args ...any) {
	if state != d.state {
		d.Log.Log(context.Background(), level, "inboxkeeper: "+state, args...)
		d.state = state
	}
}

// inactive clears what this instance measured while it was the active one:
// stale per-table gauges from a waiting instance would contradict the
// active one's. Counters and last-success timestamps keep their history.
func (d *Daemon) inactive() {
	d.metrics.Inactive()
}

// Pass does one pass if this instance may; it returns an error only when
// ctx ended the pass.
func (d *Daemon) Pass(ctx context.Context) error {
	start := time.Now()
	if d.Throttle != nil {
		// Between passes the signals are read slowly, and only what exists.
		defer d.Throttle.Idle()
	}
	dm := d.metrics.Daemon
	outcome := daemonmetrics.PassSkipped
	defer func() { d.metrics.PassEnded(outcome) }()
	// Holding the lease means the database took a write (its renewal)
	// less than LEASE_TTL ago: it is no standby, and one read a pass is
	// saved. Without it, a standby is told apart before the lease is tried.
	if !d.lease.Held() {
		var standby bool
		err := twice(ctx, func() (err error) { standby, err = dbconn.InRecovery(ctx, d.Pool); return err })
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			outcome = daemonmetrics.PassFailed
			dm.Active.Set(0)
			d.unreachable(err)
			return nil
		}
		d.answers()
		if standby {
			dm.InRecovery.Set(1)
			d.inactive()
			d.say("the database is a standby (in recovery): doing nothing until it is promoted")
			return nil
		}
		dm.InRecovery.Set(0)
		// Try now rather than wait for the keeper's next tick: a promoted
		// standby or a restarted database should not wait a ttl. As the
		// daemon starts the keeper is trying too: Acquire takes what its
		// attempt found, rather than a second statement.
		if held, h, _ := d.lease.Acquire(ctx); !held {
			d.inactive()
			d.say("another instance is active; waiting", "holder", h.Name)
			return nil
		}
	}
	dm.Active.Set(1)
	d.say("active")
	// The settings are the first read of a pass under the lease: a failed
	// connection there is an outage, and the pass is skipped rather than
	// failed table by table (five lines a pass where it was not).
	if err := twice(ctx, func() error { return d.tune(ctx) }); err != nil && ctx.Err() == nil {
		if outage.ConnectionFailed(err) {
			outcome = daemonmetrics.PassFailed
			d.unreachable(err)
			return nil
		}
		d.Log.Error("inboxkeeper: the runtime settings cannot be applied; what was in force stays", "error", err)
	} else if err == nil {
		d.answers()
	}
	dm.PassesInFlight.Set(1)
	defer dm.PassesInFlight.Set(0)
	res, err := d.runner.Run(ctx)
	if err != nil {
		return err
	}
	d.record(ctx, res)
	outcome = res.Outcome()
	failed, _, total := res.Counts()
	if deleted(res) {
		// The rows just deleted stay on disk while something holds the
		// xmin horizon: who, and for how long, after every pass that
		// deleted some (and at every scrape).
		if _, err := d.horizon.Update(ctx, true); err != nil && ctx.Err() == nil {
			d.warn("inboxkeeper: read the xmin horizon", err)
		}
	}
	// A pass that went as planned is said at info by its tables' lines,
	// when they did something; its own line is for debugging then.
	// So is one the throttle held back from start to end: the throttle
	// says once that it pauses and once that it resumes, however many
	// passes it holds.
	logf := d.Log.Debug
	if outcome != daemonmetrics.PassOK && !heldBack(res) {
		logf = d.Log.Info
	}
	logf("inboxkeeper: pass done", "outcome", outcome, "tables", total, "failed", failed,
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// unreachable takes a pass that found the database not answering into its
// outage: said once (sayDown), whoever met it first; the pass is counted.
// Any other failure to reach it (a reason of the configuration's, which
// the pool reports as a failed connection too) is said the same way.
func (d *Daemon) unreachable(err error) {
	d.skipped.Add(1)
	if d.outages.DatabaseFailed(err) {
		return
	}
	// Not a connection's failure: the query itself was refused.
	if cause := outage.Cause(err); d.outages.Failed(outage.Database, cause) {
		d.sayDown(cause, err)
	}
}

// twice runs f, and once more at once when it failed on a connection: a
// pooled connection may have been closed under it (idle_session_timeout,
// a restart long over), which is no outage; the second takes another.
func twice(ctx context.Context, f func() error) error {
	err := f()
	if err != nil && ctx.Err() == nil && retry.KindOf(err) == retry.KindConnection {
		err = f()
	}
	return err
}

// answers ends the database's outage, if one was said.
func (d *Daemon) answers() { d.outages.DatabaseAnswers() }

// sayDown says the database's outage as it starts (or its cause changes):
// what it holds back. A cause of the configuration's (a password rotated,
// a grant revoked, a certificate not trusted) is an ERROR someone must fix.
func (d *Daemon) sayDown(cause string, err error) {
	err = dbconn.Classify(err)
	level, msg := slog.LevelWarn, "inboxkeeper: the database does not answer; passes are skipped until it does (said once, and when it ends)"
	var ce *dbconn.ConnectError
	if errors.As(err, &ce) && ce.Config() {
		level, msg = slog.LevelError, "inboxkeeper: cannot connect: "+string(ce.Cause)+"; passes are skipped until the configuration or the database changes"
	}
	d.Log.Log(context.Background(), level, msg, "cause", cause, "tables", d.tableNames(), "lease_held", d.lease.Held(), "error", err)
}

// sayUp says the end of an outage of the database: how long it lasted and
// how many passes it skipped.
func (d *Daemon) sayUp(e outage.Episode) {
	d.Log.Info("inboxkeeper: the database answers again; passes resume", "down_for", e.Lasted.Round(time.Millisecond),
		"passes_failed", d.skipped.Swap(0), "since", e.Since.UTC().Format(time.RFC3339))
}

// tableNames are the tables in force: what an outage holds back.
func (d *Daemon) tableNames() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.scrape))
	for _, t := range d.scrape {
		names = append(names, t.Name)
	}
	return names
}

// Refresh counts what is due on every table between passes, when this
// instance is the active one (a waiting instance exports nothing per
// table): the cleanup lag grows while the daemon waits for its next pass.
func (d *Daemon) Refresh(ctx context.Context) {
	if !d.lease.Held() || d.outages.Open(outage.Database) {
		return
	}
	// After a reload the stages are still the old policy's until the next
	// pass: a table it no longer names is not counted (or exported) again.
	inForce := func(table string) bool { return d.inForce[table] }
	for _, del := range d.deleters {
		if err := del.Refresh(ctx, inForce); err != nil && ctx.Err() == nil {
			d.warn("inboxkeeper: could not count the due rows between passes", err)
		}
	}
}

// heldBack reports a pass the throttle held back from start to end: no
// table failed, every one that stopped early did while throttled, and
// nothing was deleted or demoted.
func heldBack(res Result) bool {
	held := false
	for _, t := range res.Tables {
		switch {
		case t.Err != nil:
			return false
		case t.StoppedEarly.Kind == retry.KindThrottled:
			held = true
		case t.StoppedEarly.Stopped():
			return false
		}
	}
	return held && !deleted(res)
}

// deleted reports whether a pass deleted rows, or demoted payloads in
// place: it left dead tuples behind.
func deleted(res Result) bool {
	for _, r := range Of[expiry.TableResult](res.Tables) {
		if r.Deleted > 0 {
			return true
		}
	}
	for _, r := range Of[tiering.Result](res.Tables) {
		if r.Demoted > 0 {
			return true
		}
	}
	return false
}
