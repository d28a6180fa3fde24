package setup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// Preflight is what a one-shot command that writes checks before it
// starts, a dry run too (it is how a change is tried): the throttle's
// query, and a connection to each listed standby. A standby refused for a
// reason of the configuration's is a ConfigError; one that does not answer
// is warned about.
func (c *Command) Preflight(ctx context.Context, pool *pgxpool.Pool, dryRun bool) error {
	if err := c.checkThrottleQuery(ctx, pool); err != nil {
		return err
	}
	errs, unread := c.CheckReplicas(ctx)
	if len(errs) > 0 {
		return pass.ConfigError{Err: errors.Join(errs...)}
	}
	c.warnUnread(unread, dryRun)
	c.unreadAtStart = len(unread) > 0 && !c.Cfg.ReplicaFailOpen
	return nil
}

// CheckReplicas connects once to each INBOXKEEPER_REPLICA_URLS entry. A
// connection refused for a reason of the configuration's (a password, a
// grant, a database's name, a certificate not trusted, a CA file that
// cannot be read) is a configuration error, naming the entry: a one-shot
// pass would otherwise wait on that standby. A standby that does not
// answer is unread: the throttle holds for it (fail closed), in once for
// at most REPLICA_WAIT.
func (c *Command) CheckReplicas(ctx context.Context) (errs, unread []error) {
	for i, u := range c.Cfg.ReplicaURLs {
		cctx, cancel := context.WithTimeout(ctx, c.Cfg.HeartbeatInterval*4+time.Second)
		conn, err := dbconn.Dial(cctx, u, dbconn.AppName(c.Name))
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			continue
		}
		if ctx.Err() != nil {
			return errs, unread
		}
		err = fmt.Errorf("INBOXKEEPER_REPLICA_URLS entry %d: %w", i+1, err)
		if dbconn.IsConfigError(err) {
			errs = append(errs, err)
		} else {
			unread = append(unread, err)
		}
	}
	return errs, unread
}

// warnUnread says which listed standbys do not answer as once starts, and
// what the pass does about it: a dry run warns of what the real run would
// do, rather than end as if nothing were in the way.
func (c *Command) warnUnread(unread []error, dryRun bool) {
	for _, err := range unread {
		switch {
		case c.Cfg.ReplicaFailOpen:
			c.Log.Warn("inboxkeeper: a listed standby does not answer; batches go on without it (INBOXKEEPER_REPLICA_FAIL_OPEN)", "error", err)
		case dryRun:
			c.Log.Warn("inboxkeeper: a listed standby does not answer; the real run holds every batch for it (fail closed) and fails (exit 1) if it still does not after INBOXKEEPER_REPLICA_WAIT",
				"replica_wait", c.Cfg.ReplicaWait, "error", err)
		default:
			c.Log.Warn("inboxkeeper: a listed standby does not answer; every batch waits for it (fail closed), at most INBOXKEEPER_REPLICA_WAIT, then once fails (exit 1)",
				"replica_wait", c.Cfg.ReplicaWait, "error", err)
		}
	}
}

// checkThrottleQuery runs INBOXKEEPER_THROTTLE_QUERY once: one that fails
// is a configuration error.
func (c *Command) checkThrottleQuery(ctx context.Context, pool *pgxpool.Pool) error {
	if c.Cfg.ThrottleQuery != "" {
		if err := throttle.CheckQuery(ctx, pool, c.Cfg.ThrottleQuery); err != nil && ctx.Err() == nil {
			return pass.ConfigError{Err: err}
		}
	}
	return nil
}

// StartThrottle starts the throttle's collectors, after checking its query;
// the caller stops them. Its failures that are only the database not
// answering are part of outages' outage of it, when set (run).
func (c *Command) StartThrottle(ctx context.Context, pool *pgxpool.Pool, m *throttle.Metrics, outages *outage.Log) (*throttle.Throttler, error) {
	if err := c.checkThrottleQuery(ctx, pool); err != nil {
		return nil, err
	}
	t := pass.NewThrottle(ctx, pool, c.Cfg, c.Log, m)
	t.ShareOutages(outages)
	t.Start(ctx)
	return t, nil
}

// TakeLease waits for the lease, RUN_TIME at most (a cron job must end
// within its slot), and keeps it until keep's returned function is called;
// nothing says what was not done when another instance held it throughout.
func (c *Command) TakeLease(ctx context.Context, pool *pgxpool.Pool, nothing string) (ls *lease.Lease, keep func(), err error) {
	ls = lease.New(pool, c.Cfg.LeaseTTL, c.Log)
	ls.Publish(settings.Publish(c.Cfg)) // status and settings read this environment there
	var held lease.ErrHeld
	if err := ls.Wait(ctx, c.Cfg.RunTime); errors.As(err, &held) {
		return nil, nil, fmt.Errorf("another instance (%s) held the lease for the whole INBOXKEEPER_RUN_TIME (%s); %s", held.Holder.Name, humantime.Format(held.For), nothing)
	} else if err != nil {
		return nil, nil, err
	}
	return ls, ls.Start(ctx), nil
}

// Once runs d's one pass for `once`: unless a dry run, under the lease and
// the throttle, with waiting told what holds the pass back (now and every
// minute: a pass held by `pause --for 1h` says so rather than going
// quiet). A standby the throttle cannot read holds every batch (fail
// closed): at most REPLICA_WAIT, then the pass stops and once fails, rather
// than wait for ever or end as a success (a StandbyUnread).
func (c *Command) Once(ctx context.Context, pool *pgxpool.Pool, d *pass.Driver, dryRun bool, waiting func(pass.Wait)) (failed, total int, err error) {
	if !dryRun {
		ls, keep, err := c.TakeLease(ctx, pool, "nothing deleted")
		if err != nil {
			return 0, 0, err
		}
		defer keep()
		d.Lease = ls.Check
		if d.Throttle, err = c.StartThrottle(ctx, pool, d.Metrics.ThrottleMetrics(), nil); err != nil {
			return 0, 0, err
		}
		defer d.Throttle.Stop()
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			pass.WatchWaits(wctx, d.Throttle, pool, time.Minute, waiting)
		}()
		// The throttle stops first: the watch waits for its first reading,
		// and what the throttle would start after it must not start only
		// to be cancelled mid-statement (pgx waits 100 ms after that).
		defer func() { stopWatch(); d.Throttle.Stop(); <-watched }()
	}
	pctx, stopPass := context.WithCancelCause(ctx)
	defer stopPass(nil)
	if d.Throttle != nil {
		go pass.GiveUpOnStandbys(pctx, d.Throttle, c.Cfg.ReplicaWait, func(r throttle.Reading) {
			stopPass(StandbyUnread{r, c.Cfg.ReplicaWait})
		})
	}
	failed, total, err = d.Once(pctx)
	var unreadErr StandbyUnread
	if errors.As(context.Cause(pctx), &unreadErr) {
		err = unreadErr
	} else if d.Throttle != nil && err == nil {
		if r, ok := pass.UnreadStandby(d.Throttle); ok {
			// The pass ended (RUN_TIME) while the standby held it back.
			err = StandbyUnread{Reading: r}
		} else if c.unreadAtStart {
			// A pass with nothing to delete can end before the throttle's
			// first reading of a standby that did not answer at the start:
			// it ends as the start said it would unless that standby
			// answers now.
			if _, unread := c.CheckReplicas(ctx); len(unread) > 0 {
				err = StandbyUnread{Reading: throttle.Reading{Kind: throttle.ReplicaUnreachable, Over: true, Detail: unread[0].Error()}}
			}
		}
	}
	return failed, total, err
}

// StandbyUnread is a pass of once that a standby it could not read held
// back: for REPLICA_WAIT (Wait set), or until the pass ended. Exit 1.
type StandbyUnread struct {
	Reading throttle.Reading
	Wait    time.Duration
}

func (e StandbyUnread) Error() string {
	what := "the pass ended while a standby could not be read"
	if e.Wait > 0 {
		what = "a standby could not be read for " + humantime.Format(e.Wait) + " (INBOXKEEPER_REPLICA_WAIT); the pass stopped"
	}
	return what + ": " + e.Reading.String() + "; every batch waits for it (fail closed): make it readable, take it out of INBOXKEEPER_REPLICA_URLS, or set INBOXKEEPER_REPLICA_FAIL_OPEN=true"
}

// Compact is `compact --table T`'s run: the compaction of the one ordinary
// table t now, forced (its policy's free_ratio aside), under the lease and
// the throttle unless a dry run, as a pass would. A partitioned or
// distributed table is a UsageError (CompactTarget). print prints the
// results and says how many failed; a refusal of the table
// (compact.ErrRefused) is a ConfigError.
func (c *Command) Compact(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table, dryRun bool, allow compact.Allow,
	print func([]compact.Result) (failed int)) error {
	tables := []*catalog.Table{t}
	tn, err := settings.Read(ctx, pool, c.Cfg, tables)
	if err != nil {
		return pass.SettingsError{Err: err}
	}
	w := c.Wiring(pool, dryRun, nil, nil)
	opts := compact.Options{Force: true, Allow: allow, Progress: c.compactProgress()}
	if !dryRun {
		ls, keep, err := c.TakeLease(ctx, pool, "nothing moved")
		if err != nil {
			return err
		}
		defer keep()
		w.Active, w.BatchActive = ls.Check, ls.Check
		if w.Throttle, err = c.StartThrottle(ctx, pool, nil, nil); err != nil {
			return err
		}
		defer w.Throttle.Stop()
	}
	results, err := w.Compactor(tn.For(t.Name), tables, opts).RunPass(ctx)
	failed := print(results)
	switch {
	case err != nil:
		return fmt.Errorf("interrupted: %w", err)
	case len(results) == 1 && errors.Is(results[0].Err, compact.ErrRefused):
		return pass.ConfigError{Err: results[0].Err}
	case failed > 0:
		return errors.New("the compaction failed (see above)")
	}
	return nil
}

// CompactTarget refuses a table compact cannot take: its space comes back
// another way.
func CompactTarget(t *catalog.Table) error {
	switch {
	case t.Partitioned():
		return pass.Usagef("compact: %s is managed by partition: its space comes back as whole partitions are dropped", t.Name)
	case t.Distributed():
		return pass.Usagef("compact: %s is distributed by Citus: compact its shards on the workers (VACUUM FULL or pg_repack there)", t.Name)
	case t.ThroughCitus():
		return pass.Usagef("compact: %s is a Citus reference or Citus local table: Citus refuses the moves' row locks (FOR UPDATE SKIP LOCKED) there; compact its copy on each node (VACUUM FULL or pg_repack there)", t.Name)
	}
	return nil
}

// compactProgress logs how far a compaction has come, every 10 s.
func (c *Command) compactProgress() func(compact.Progress) {
	var last time.Time
	return func(p compact.Progress) {
		if time.Since(last) < 10*time.Second {
			return
		}
		last = time.Now()
		c.Log.Info("compact: moving", "table", p.Table, "moved", p.Moved, "page", p.Cursor, "down_to", p.Target, "truncated_bytes", p.Truncated)
	}
}

// Status reads what `status` shows, with the throttle as the active
// instance sees it: its environment, as it published it (st.Env), not this
// shell's, measured once.
func (c *Command) Status(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table) (pass.Status, *throttle.Throttler, error) {
	st, err := pass.ReadStatus(ctx, c.Wiring(pool, false, nil, nil), c.Cfg, tables)
	if err != nil {
		return st, nil, err
	}
	th := pass.NewThrottle(ctx, pool, st.Env.Config, c.Log, nil)
	th.MeasureOnce(ctx)
	return st, th, nil
}
