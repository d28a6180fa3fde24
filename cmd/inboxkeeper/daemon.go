package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/sqlident"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// daemon is `inboxkeeper run`: passes on a schedule that never overlap, one
// active instance per database, metrics on a listener, nothing done against
// a standby, and a clean stop on SIGTERM.
func (a *app) daemon(ctx context.Context, args []string) error {
	fs := a.newFlags("run")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("run: unexpected argument %q", fs.Arg(0))
	}
	var sched cron.Schedule
	if a.cfg.Schedule != "" {
		s, err := cron.ParseStandard(a.cfg.Schedule)
		if err != nil {
			return configError{fmt.Errorf("INBOXKEEPER_SCHEDULE: %v", err)}
		}
		sched = s
	}
	ms := newMetricSet(true)
	reg, metrics, tmetrics, pmetrics, dm := ms.reg, ms.expiry, ms.tiering, ms.partitions, ms.daemon
	if a.cfg.MetricsAddr != "" {
		stopServer, err := serveMetrics(a, reg)
		if err != nil {
			return err
		}
		defer stopServer()
	}

	pool, tables, err := a.prepareWithRetry(ctx, dm.PolicyMismatch)
	if err != nil || ctx.Err() != nil {
		return err
	}
	if err := a.sessionForPartitions(ctx, tables, false); err != nil {
		return err
	}
	th, err := a.startThrottle(ctx, pool, reg)
	if err != nil {
		return err
	}
	defer th.Stop()

	ls := lease.New(pool, a.cfg.LeaseTTL, a.log)
	leaseCtx, stopLease := context.WithCancel(ctx)
	leaseDone := make(chan struct{})
	go func() { defer close(leaseDone); ls.Keep(leaseCtx) }()
	defer func() {
		stopLease()
		<-leaseDone
		// Hand over at once instead of making the next instance wait a ttl.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ls.Release(rctx)
	}()

	a.log.Info("inboxkeeper: running", "tables", len(tables), "interval", a.cfg.Interval, "schedule", a.cfg.Schedule,
		"database", config.RedactURL(a.cfg.DatabaseURL), "instance", ls.Name())
	p := &passer{a: a, pool: pool, ls: ls, dm: dm, m: metrics, pmm: pmetrics, tm: tmetrics, ms: ms, th: th}
	// use puts a (re)loaded policy's tables in force; the next pass builds
	// its stages for them.
	use := func(tables []*catalog.Table) {
		p.list, p.watch = tables, nil // the next pass builds its stages anew
		p.tables, p.scopeIdx, p.seenKnown = map[string]*catalog.Table{}, map[string]*expiry.ScopeIndexes{}, false
		for _, t := range tables {
			p.tables[t.Name] = t
		}
		// What was measured of a table the policy no longer names is no
		// longer exported.
		ms.facts.KeepTables(func(table string) bool { return p.tables[table] != nil })
		dm.ReloadOK.Set(1)
		dm.ReloadTime.Set(float64(time.Now().Unix()))
	}
	use(tables)
	loaded := policyDigest(a.cfg.PolicyFile)
	// reload re-reads the policy file: on SIGHUP, and before a pass when its
	// content changed (a ConfigMap volume updates in place). A policy that
	// fails its checks is not applied; the one in force stays.
	reload := func(why string) {
		loaded = policyDigest(a.cfg.PolicyFile)
		tables, err := a.reloadPolicy(ctx, pool)
		if err != nil {
			if ctx.Err() == nil {
				dm.ReloadOK.Set(0)
				a.log.Error("inboxkeeper: the policy file cannot be applied; the policy in force stays", "trigger", why, "file", a.cfg.PolicyFile, "error", err)
			}
			return
		}
		use(tables)
		a.log.Info("inboxkeeper: policy reloaded", "trigger", why, "file", a.cfg.PolicyFile, "tables", len(tables))
	}
	for {
		if d := policyDigest(a.cfg.PolicyFile); d != loaded {
			reload("file changed")
		}
		start := time.Now()
		if err := p.run(ctx); err != nil {
			a.log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", true)
			return nil
		}
		if p.watch != nil && p.watch.changed {
			continue // a runtime setting changed mid-pass: a new pass applies it now
		}
		next := start.Add(a.cfg.Interval)
		if sched != nil {
			next = sched.Next(time.Now())
		}
		timer := time.NewTimer(time.Until(next))
		// While it waits, the cleanup lag and rows_due keep up: rows fall due
		// between passes too.
		refresh := time.NewTicker(dueRefreshBetweenPasses)
	wait:
		select {
		case <-ctx.Done():
			timer.Stop()
			refresh.Stop()
			a.log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", false)
			return nil
		case <-sighup:
			reload("SIGHUP")
			goto wait
		case <-refresh.C:
			p.refreshDue(ctx)
			goto wait
		case <-timer.C:
		}
		refresh.Stop()
	}
}

// sighup delivers SIGHUP, which never ends the process: run reloads its
// policy on it, and the other commands ignore it (main sets it up).
var sighup = make(chan os.Signal, 1)

// policyDigest fingerprints the policy file's content; "" when unreadable
// (a reload then says why).
func policyDigest(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// reloadPolicy loads and checks the policy file against the database, as
// at startup, without touching anything.
func (a *app) reloadPolicy(ctx context.Context, pool *pgxpool.Pool) ([]*catalog.Table, error) {
	p, err := a.loadPolicy()
	if err != nil {
		return nil, err
	}
	tables, err := resolveAll(ctx, pool, p)
	if err != nil {
		return nil, err
	}
	if err := a.ensureKeyTables(ctx, pool, tables); err != nil {
		return nil, err
	}
	if err := a.sessionForPartitions(ctx, tables, false); err != nil {
		return nil, err
	}
	a.warnLocalTime(ctx, pool, tables)
	return tables, nil
}

// passer runs the daemon's passes and keeps what it must remember between
// them, so that state changes are logged once, not every pass.
type passer struct {
	a         *app
	pool      *pgxpool.Pool
	pmm       *partitions.Metrics
	ls        *lease.Lease
	dm        *daemonmetrics.Metrics
	m         *expiry.Metrics
	tm        *tiering.Metrics
	ms        *metricSet
	th        *throttle.Throttler
	lastState string

	// The tables in force, and the stages built for them with the runtime
	// settings of watch's version; rebuilt when that version moves.
	list     []*catalog.Table
	runner   pass.Runner
	deleters []*expiry.Deleter // the expiry stages', for counts between passes
	watch    *settingsWatch

	// Per-scope ranges are measured only where an index makes them cheap;
	// which indexes exist is looked up once.
	tables    map[string]*catalog.Table
	scopeIdx  map[string]*expiry.ScopeIndexes
	seenIdx   map[string]bool // table -> an index leads with first_seen
	seenKnown bool
}

// dueRefreshBetweenPasses is how often the daemon counts what is due while
// it waits for its next pass.
const dueRefreshBetweenPasses = 15 * time.Second

// refreshDue counts what is due on every table, when this instance is the
// active one (a waiting instance exports nothing per table).
func (p *passer) refreshDue(ctx context.Context) {
	if !p.ls.Held() {
		return
	}
	// After a reload the stages are still the old policy's until the next
	// pass: a table it no longer names is not counted (or exported) again.
	inForce := func(table string) bool { return p.tables[table] != nil }
	for _, d := range p.deleters {
		if err := d.Refresh(ctx, inForce); err != nil && ctx.Err() == nil {
			p.a.log.Warn("inboxkeeper: could not count the due rows between passes", "error", err)
		}
	}
}

// tune rebuilds the pass's stages when the runtime settings changed since
// they were built (or never were). Settings that do not hold together are
// logged, and what was in force stays.
func (p *passer) tune(ctx context.Context) {
	tn, err := p.a.loadTuning(ctx, p.pool, p.list)
	if err != nil {
		if ctx.Err() == nil {
			p.a.log.Error("inboxkeeper: the runtime settings cannot be applied; what was in force stays", "error", err)
		}
		if p.watch != nil {
			// Wait for the next change rather than stop every pass for this one.
			if tn.version > 0 {
				p.watch.version = tn.version
			}
			p.watch.changed = false
			return
		}
		// Nothing was in force yet: the environment and the policy then.
		tn = tuning{version: -1, global: p.a.cfg, tables: map[string]config.Config{}}
	}
	if p.watch != nil && p.watch.version == tn.version {
		return
	}
	p.watch = &settingsWatch{pool: p.pool, version: tn.version}
	applyLimits(p.th, tn.global)
	var stages []pass.Stage
	stages, p.deleters = p.a.stages(p.pool, p.list, tn, false, p.ms, p.th, both(p.ls.Check, p.watch.check), p.a.progressPrinter())
	p.runner = pass.Runner{Stages: stages, RunTime: tn.global.RunTime}
}

func (p *passer) say(state string, args ...any) {
	if state != p.lastState {
		p.a.log.Info("inboxkeeper: "+state, args...)
		p.lastState = state
	}
}

// run does one pass if this instance may; it returns an error only when
// ctx ended the pass.
func (p *passer) run(ctx context.Context) error {
	start := time.Now()
	outcome := daemonmetrics.PassSkipped
	defer func() {
		p.dm.Passes.WithLabelValues(outcome).Inc()
		p.dm.LastPass.Set(float64(time.Now().Unix()))
	}()
	standby, err := dbconn.InRecovery(ctx, p.pool)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		outcome = daemonmetrics.PassFailed
		p.dm.Active.Set(0)
		p.say("database unreachable; retrying next pass", "error", err)
		return nil
	}
	if standby {
		p.dm.InRecovery.Set(1)
		p.inactive()
		p.say("the database is a standby (in recovery): doing nothing until it is promoted")
		return nil
	}
	p.dm.InRecovery.Set(0)
	if !p.ls.Held() {
		// Try now rather than wait for the keeper's next tick: a promoted
		// standby or a restarted database should not wait a ttl.
		if held, h, _ := p.ls.TryAcquire(ctx); !held {
			p.inactive()
			p.say("another instance is active; waiting", "holder", h.Name)
			return nil
		}
	}
	p.dm.Active.Set(1)
	p.say("active")
	p.dm.PassesInFlight.Set(1)
	defer p.dm.PassesInFlight.Set(0)
	p.tune(ctx)
	res, err := p.runner.Run(ctx)
	if err != nil {
		return err
	}
	for _, r := range pass.Of[expiry.TableResult](res.Tables) {
		p.record(r)
	}
	outcome = res.Outcome()
	failed, _, total := res.Counts()
	p.measureTiers(ctx)
	if err := p.controlStats(ctx); err != nil && ctx.Err() == nil {
		p.a.log.Warn("inboxkeeper: read the control schema for metrics", "error", err)
	}
	p.a.log.Info("inboxkeeper: pass done", "outcome", outcome, "tables", total, "failed", failed,
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// inactive clears what this instance measured while it was the active one:
// stale per-table gauges from a waiting instance would contradict the
// active one's. Counters and last-success timestamps keep their history.
func (p *passer) inactive() {
	p.dm.Active.Set(0)
	p.ms.facts.Clear()
}

// record exports what a pass measured about one table.
func (p *passer) record(r expiry.TableResult) {
	if r.Err != nil {
		return
	}
	p.dm.RowsProtected.Set(float64(r.ProtectedByHolds), r.Table, "hold")
	p.dm.RowsProtected.Set(float64(r.ProtectedByReplays), r.Table, "replay")
	if r.Oldest != nil {
		p.dm.OldestExpiry.Set(float64(r.Oldest.Unix()), r.Table)
		p.dm.NewestExpiry.Set(float64(r.Newest.Unix()), r.Table)
	} else {
		p.dm.OldestExpiry.Delete(r.Table)
		p.dm.NewestExpiry.Delete(r.Table)
	}
	if r.BytesPerKey > 0 {
		p.dm.BytesPerKey.Set(r.BytesPerKey, r.Table, "all")
	} else {
		p.dm.BytesPerKey.Delete(r.Table, "all") // unknown before the first ANALYZE
	}
	p.countPermanent(r)
}

// firstSeenStats exports, per table whose first_seen column leads an
// index, the first receipt of the oldest and newest identity retained.
func (p *passer) firstSeenStats(ctx context.Context) error {
	if !p.seenKnown {
		p.seenIdx = map[string]bool{}
		for name, t := range p.tables {
			ok, err := expiry.FirstSeenIndexed(ctx, p.pool, t)
			if err != nil {
				return err
			}
			p.seenIdx[name] = ok
		}
		p.seenKnown = true
	}
	p.dm.FirstSeen.Reset()
	for name, ok := range p.seenIdx {
		if !ok {
			continue
		}
		oldest, newest, err := expiry.FirstSeenRange(ctx, p.pool, p.tables[name])
		if err != nil {
			return err
		}
		if oldest != nil {
			p.dm.FirstSeen.Set(float64(oldest.Unix()), name, "oldest")
			p.dm.FirstSeen.Set(float64(newest.Unix()), name, "newest")
		}
	}
	return nil
}

// scopeStats exports the retained range of one scope that has a retention
// rule: bounded label values, and four index probes per scope.
func (p *passer) scopeStats(ctx context.Context, table, scope string) error {
	t := p.tables[table]
	if t == nil || t.Scope == nil {
		return nil
	}
	si := p.scopeIdx[table]
	if si == nil {
		found, err := expiry.FindScopeIndexes(ctx, p.pool, t)
		if err != nil {
			return err
		}
		si = &found
		p.scopeIdx[table] = si
		if !si.Expiry || (t.FirstSeen != nil && !si.FirstSeen) {
			p.a.log.Info("inboxkeeper: per-scope retained ranges need an index leading with the scope column: without it they would scan the scope every pass",
				"table", table, "expiry_indexed", si.Expiry, "first_seen_indexed", si.FirstSeen)
		}
	}
	r, err := expiry.ScopeRanges(ctx, p.pool, t, *si, scope)
	if err != nil {
		return err
	}
	set := func(g *daemonmetrics.Fact, end string, v *time.Time) {
		if v != nil {
			g.Set(float64(v.Unix()), table, scope, end)
		}
	}
	set(p.dm.ScopeExpiry, "oldest", r.OldestExpiry)
	set(p.dm.ScopeExpiry, "newest", r.NewestExpiry)
	set(p.dm.ScopeFirstSeen, "oldest", r.OldestFirstSeen)
	set(p.dm.ScopeFirstSeen, "newest", r.NewestFirstSeen)
	return nil
}

// controlStats exports the installed retention rules (the configured replay
// and redrive horizons) and the replays forced past the window.
func (p *passer) controlStats(ctx context.Context) error {
	rules, err := inbox.InstalledRules(ctx, p.pool)
	if err != nil {
		return err
	}
	// Only the tables the policy names, as every per-table fact: rules
	// installed for a table this instance does not manage are not its own.
	managed := rules[:0:0]
	for _, r := range rules {
		if p.tables[sqlident.QualifiedName{Schema: r.Schema, Name: r.Table}.String()] != nil {
			managed = append(managed, r)
		}
	}
	rules = managed
	p.dm.ReplayHorizon.Reset()
	p.dm.PostReceipt.Reset()
	p.dm.Margin.Reset()
	for _, r := range rules {
		name := sqlident.QualifiedName{Schema: r.Schema, Name: r.Table}.String()
		if r.HasPostReceipt {
			p.dm.PostReceipt.Set(r.PostReceipt.Seconds(), name, r.Scope)
		}
		if r.HasReplay {
			p.dm.ReplayHorizon.Set(r.Replay.Seconds(), name, r.Scope)
		}
		p.dm.Margin.Set(r.Margin.Seconds(), name, r.Scope)
	}
	if err := p.firstSeenStats(ctx); err != nil {
		return err
	}
	p.dm.ScopeExpiry.Reset()
	p.dm.ScopeFirstSeen.Reset()
	for _, r := range rules {
		name := sqlident.QualifiedName{Schema: r.Schema, Name: r.Table}.String()
		if err := p.scopeStats(ctx, name, r.Scope); err != nil {
			if ctx.Err() != nil {
				return err
			}
			p.a.log.Warn("inboxkeeper: per-scope retained range", "table", name, "scope", r.Scope, "error", err)
		}
	}
	beyond, err := holds.ReplaysBeyondWindow(ctx, p.pool)
	if err != nil {
		return err
	}
	p.dm.ReplaysBeyond.Reset()
	for table, n := range beyond {
		if p.tables[table] != nil {
			p.dm.ReplaysBeyond.Set(float64(n), table)
		}
	}
	return nil
}

// prepareWithRetry is prepare for a daemon: a database that is not up yet,
// a control schema a migrate job has not created yet, or tables the
// application's migration has not created yet, are waited for with backoff
// instead of crash-looping (a crash-looping native sidecar would take its
// database pod out of service). The policy file is read again on every try,
// so a corrected ConfigMap is picked up. A bad environment or a policy file
// that does not parse still ends it (exit 2).
func (a *app) prepareWithRetry(ctx context.Context, mismatch prometheus.Gauge) (*pgxpool.Pool, []*catalog.Table, error) {
	wait := time.Second
	for {
		pool, tables, err := a.prepare(ctx)
		if err == nil {
			// A deletion writes its permanent keys in the same statement:
			// the key tables must exist before anything runs.
			if err = a.ensureKeyTables(ctx, pool, tables); err == nil {
				mismatch.Set(0)
				return pool, tables, nil
			}
		}
		var ce configError
		var ue usageError
		switch {
		case errors.Is(err, tiering.ErrKeyTable):
			mismatch.Set(1)
			a.log.Error("inboxkeeper: waiting for a permanent key table; nothing is touched until it exists", "error", err, "retry_in", wait)
		case errors.As(err, &ce) || errors.As(err, &ue):
			return nil, nil, err
		case errors.Is(err, catalog.ErrInvalid):
			mismatch.Set(1)
			a.log.Error("inboxkeeper: the policy does not match the database; nothing is touched until it does", "error", err, "retry_in", wait)
		case errors.Is(err, migrations.ErrNotMigrated):
			a.log.Warn("inboxkeeper: waiting for the control schema", "error", err, "retry_in", wait)
		default:
			a.log.Warn("inboxkeeper: waiting for the database", "error", err, "retry_in", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, nil
		case <-t.C:
		}
		wait = min(wait*2, 30*time.Second)
	}
}

// waitForLease makes `once` the active instance, waiting (and saying so)
// while another instance holds the lease.
func (a *app) waitForLease(ctx context.Context, pool *pgxpool.Pool) (*lease.Lease, func(), error) {
	ls := lease.New(pool, a.cfg.LeaseTTL, a.log)
	tick := time.NewTicker(a.cfg.LeaseTTL / 3)
	defer tick.Stop()
	// RUN_TIME bounds the wait too: a cron job must end within its slot.
	var giveUp <-chan time.Time
	if a.cfg.RunTime > 0 {
		t := time.NewTimer(a.cfg.RunTime)
		defer t.Stop()
		giveUp = t.C
	}
	for {
		held, h, err := ls.TryAcquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		if held {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-giveUp:
			return nil, nil, fmt.Errorf("another instance (%s) held the lease for the whole INBOXKEEPER_RUN_TIME (%s); nothing deleted", h.Name, a.cfg.RunTime)
		case <-tick.C:
		}
	}
	keepCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ls.Keep(keepCtx) }()
	return ls, func() {
		stop()
		<-done
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ls.Release(rctx)
	}, nil
}
