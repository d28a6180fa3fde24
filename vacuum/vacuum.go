// Package vacuum keeps the space of the rows the daemon deletes reclaimed.
//
// A deleted row's space is reusable only after VACUUM. Autovacuum visits a
// database at most every autovacuum_naptime (a minute by default, a
// server-wide setting) and a table only once its dead tuples pass
// autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor x its rows,
// so an inbox whose rows turn over in seconds carries a minute of churn as
// dead tuples: measured, four times its live size. The daemon knows what it
// just deleted, so after a table's pass it vacuums the table itself when
// the dead tuples reach INBOXKEEPER_VACUUM_DEAD_RATIO of its tuples (and
// minDead): VACUUM (SKIP_LOCKED, TRUNCATE false), which never waits for a
// lock (it skips the table when another session holds a conflicting one;
// it is tried again for 1.5 s, then by the next pass) and never takes
// ACCESS EXCLUSIVE to cut empty pages off the end (the writer would queue
// behind it, and the table grows back). One that an older snapshot kept
// from the pass's deleted rows is run once more. The throttle is asked
// first: VACUUM writes WAL too.
//
// Autovacuum stays the backstop; Advise says which of a table's autovacuum
// settings cannot keep up with a deletion rate, and what to set.
//
// Daemon internals: the deleter's pass and `status` use it.
package vacuum

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// minDead is the fewest dead tuples worth a VACUUM: fewer fill a few pages,
// not worth its own transaction and a scan of every index.
const minDead = 1000

// admitWait bounds how long a VACUUM waits for the throttle: it is not
// needed now, and the next pass asks again.
const admitWait = time.Second

// Metrics are the vacuum's metrics.
type Metrics struct {
	Vacuums    *prometheus.CounterVec
	Pacing     *prometheus.CounterVec // table, outcome: paced, stopped, passed_over
	DeadTuples *daemonmetrics.Fact
}

// NewMetrics registers them on reg; the dead tuples are a fact of facts.
func NewMetrics(reg prometheus.Registerer, facts *daemonmetrics.Facts) *Metrics {
	return &Metrics{
		Vacuums: daemonmetrics.CounterVec(reg, "inboxkeeper_vacuums_total",
			"VACUUMs of a table the daemon ran (VACUUM (SKIP_LOCKED, TRUNCATE false)) after a pass that left INBOXKEEPER_VACUUM_DEAD_RATIO of its tuples dead, each one (one an older snapshot held back and its second count two); one that found the table locked and passed it over does not count.", "table"),
		Pacing: daemonmetrics.CounterVec(reg, "inboxkeeper_vacuum_pacing_total",
			"The daemon's VACUUMs of the table while a standby streams, by outcome: paced (it ran to its end with its session's vacuum_cost_delay and vacuum_cost_limit set from the standby's apply rate), stopped (it was cancelled because the standby fell behind anyway, a throttle signal went over its threshold or a session queued behind it; tried again at half the pace), passed_over (not run for the standby: it could not be paced, behind a transaction pooler or for a standby too slow; autovacuum keeps the table).", "table", "outcome"),
		DeadTuples: facts.Gauge(reg, "inboxkeeper_dead_tuples",
			"Dead tuples of the table after the daemon's last pass that deleted rows (and its VACUUM, when it ran one), as status shows them: pg_stat_user_tables.n_dead_tup, read once the pass's own counts have reached the statistics.", "table"),
	}
}

// Options tune a Vacuumer; the base gives the logger, the throttle and the
// active check.
type Options struct {
	service.Base
	// DeadRatio: vacuum a table after a pass once its dead tuples are at
	// least this fraction of its tuples (live and dead). 0 never does.
	DeadRatio float64
	Metrics   *Metrics // may be nil
}

// Vacuumer vacuums tables after the passes that leave them with enough
// dead tuples.
type Vacuumer struct {
	pool *pgxpool.Pool
	opts Options

	mu      sync.Mutex
	since   map[string]int64   // rows deleted since this process last vacuumed the table
	allowed map[string]bool    // whether this role may vacuum the table, once asked
	perUnit map[string]float64 // WAL a cost unit wrote in the table's last paced VACUUM (Pace.learn)
	noFlush atomic.Bool        // the server has no pg_stat_force_next_flush (before PostgreSQL 15)
	pooled  atomic.Int32       // 0: not known yet; 1: direct connections; 2: through a pooler

	retrying    func(Outcome) // tests: called before the wait to try a VACUUM again, with the outcome so far
	afterVacuum func()        // tests: called after a VACUUM statement succeeded, before its outcome is read
}

// New returns a Vacuumer on pool; nil when opts.DeadRatio is 0.
func New(pool *pgxpool.Pool, opts Options) *Vacuumer {
	if opts.DeadRatio <= 0 {
		return nil
	}
	opts.Base = opts.Base.WithDefaults(0)
	return &Vacuumer{pool: pool, opts: opts, since: map[string]int64{}, allowed: map[string]bool{}, perUnit: map[string]float64{}}
}

// Outcome is what AfterPass did.
type Outcome struct {
	Dead int64 // dead tuples, as counted
	// Ran: a VACUUM ran. Judged by the WARNING of one that passed over
	// the table, and without it by the table's count of manual VACUUMs
	// (vacuum).
	Ran bool
	// PassedOver: the VACUUMs another session's lock passed over before
	// the one that ran, or all of them when none did.
	PassedOver int
	// HeldBack: VACUUMs that ran and left the dead tuples they were run
	// for (heldBack), each tried again once after heldBackWait.
	HeldBack int
	// Stopped: paced VACUUMs stopped because the standby fell behind
	// anyway, a throttle signal went over its threshold or a session
	// queued behind one (each tried again at half the pace, up to
	// maxStops).
	Stopped int
	Pace    *Pace         // how the last VACUUM was paced for a standby; nil: unpaced (none streams)
	Took    time.Duration // its duration
	NotRun  string        // why none ran, when one was due
	Err     error
}

// AfterPass is told that a pass deleted deleted rows of t, which holds live
// and dead tuples by its statistics (read after the pass; they lag the
// deletes by up to a second, so the rows deleted since the last VACUUM
// count too). It vacuums t when they reach the ratio.
func (v *Vacuumer) AfterPass(ctx context.Context, t *catalog.Table, deleted, live, dead int64) Outcome {
	if v == nil || t.Partitioned() || t.ThroughCitus() {
		return Outcome{}
	}
	// The gauge is what status shows, whatever the decision counts: the
	// rows deleted since the daemon's last VACUUM are no dead tuples once
	// autovacuum has come by.
	defer v.export(ctx, t, dead)
	v.mu.Lock()
	v.since[t.Name] += deleted
	dead = max(dead, v.since[t.Name])
	v.mu.Unlock()
	out := Outcome{Dead: dead}
	if dead < minDead || float64(dead) < v.opts.DeadRatio*float64(live+dead) {
		return out
	}
	if ok, err := v.mayVacuum(ctx, t); err != nil || !ok {
		out.NotRun, out.Err = "this role may not vacuum the table", err
		if err == nil {
			// It never will: what it deleted stops counting toward a
			// VACUUM only autovacuum runs, rather than adding up for ever.
			v.mu.Lock()
			v.since[t.Name] = 0
			v.mu.Unlock()
		}
		return out
	}
	if why, ok := v.opts.CheckActive(); !ok {
		out.NotRun = why.String()
		return out
	}
	if th := v.opts.Throttle; th != nil {
		actx, cancel := context.WithTimeout(ctx, admitWait)
		_, err := th.Admit(actx, nil)
		cancel()
		if err != nil {
			reason, _ := service.Held(err)
			out.NotRun = "throttled (" + reason + ")"
			v.opts.Logger.Debug("vacuum: throttled; the next pass tries again", "table", t.Name, "reason", reason)
			return out
		}
	}
	v.flushStats(ctx)
	boost := float64(MaxBoost)
	for {
		pace, notRun := v.pace(ctx, t, boost)
		if notRun != "" {
			out.NotRun = notRun
			return out
		}
		out.Pace = pace
		ran, left, took, err := v.vacuum(ctx, t, pace)
		out.Took = took
		if stop, ok := errors.AsType[*stopError](err); ok {
			out.Stopped++
			if pace != nil {
				var perUnit float64
				perUnit, boost = pace.slower()
				v.mu.Lock()
				v.perUnit[t.Name] = perUnit
				v.mu.Unlock()
			}
			if more := v.stopped(t, pace, stop, out.Stopped); !more {
				out.NotRun = "stopped: " + stop.reason + "; the next pass tries again"
				return out
			}
			continue
		}
		if err != nil {
			out.Err = fmt.Errorf("vacuum %s: %w", t.Name, err)
			v.opts.Logger.Warn("vacuum: failed; autovacuum remains, and the next pass tries again", "table", t.Name, "error", err, "kind", retry.KindOf(err))
			return out
		}
		var wait time.Duration
		switch {
		case ran && heldBack(left, dead) && out.HeldBack == 0:
			// It ran, and left the rows the pass deleted dead: a snapshot
			// older than the pass's last commit (an insert that began just
			// before it) held them. Such a snapshot is gone in
			// milliseconds; one held longer is the xmin horizon's alert's,
			// and one more VACUUM would read the same pages for nothing.
			out.HeldBack++
			if m := v.opts.Metrics; m != nil {
				m.Vacuums.WithLabelValues(t.Name).Inc()
			}
			v.opts.Logger.Debug("vacuum: an older snapshot kept the deleted rows; trying again", "table", t.Name, "dead_tuples_left", left.Int64)
			wait = heldBackWait
		case ran:
			out.Ran = true
		case out.PassedOver == len(passedOverWaits):
			out.PassedOver++
			out.NotRun = "another session held a lock on the table (VACUUM SKIP_LOCKED passed it over)"
			v.opts.Logger.Debug("vacuum: the table was locked; the next pass tries again", "table", t.Name, "attempts", out.PassedOver)
			return out
		default:
			wait = passedOverWaits[out.PassedOver]
			out.PassedOver++
		}
		if out.Ran {
			break
		}
		if v.retrying != nil {
			v.retrying(out)
		}
		// Stopped while it waits: a VACUUM held back has run all the same.
		stop := func(why retry.Early) Outcome {
			if out.Ran = out.HeldBack > 0; !out.Ran {
				out.NotRun = why.String()
			}
			return out
		}
		select {
		case <-ctx.Done():
			return stop(retry.AtShutdown)
		case <-time.After(wait):
		}
		if why, ok := v.opts.CheckActive(); !ok {
			return stop(why)
		}
	}
	v.mu.Lock()
	v.since[t.Name] = 0
	v.mu.Unlock()
	if m := v.opts.Metrics; m != nil {
		m.Vacuums.WithLabelValues(t.Name).Inc()
		if out.Pace != nil {
			m.Pacing.WithLabelValues(t.Name, "paced").Inc()
		}
	}
	attrs := []any{"table", t.Name, "dead_tuples", dead, "live_tuples", live, "took", out.Took.Round(time.Millisecond)}
	if out.Pace != nil {
		// Said at info: a VACUUM paced for a standby can take minutes.
		v.opts.Logger.Info("vacuum: done, paced for the standby", append(attrs, "pace", out.Pace.String())...)
		return out
	}
	v.opts.Logger.Debug("vacuum: done", attrs...)
	return out
}

// export sets the table's inboxkeeper_dead_tuples to its dead tuples as
// status reads them (pg_stat_user_tables.n_dead_tup), once the counts of
// the pass's last batches have reached the statistics (flushStats): at
// the end of AfterPass, after its VACUUM when one ran. Where they cannot
// be read so (before PostgreSQL 15, track_counts off), the pass's own
// reading, passDead, stands.
func (v *Vacuumer) export(ctx context.Context, t *catalog.Table, passDead int64) {
	m := v.opts.Metrics
	if m == nil {
		return
	}
	v.flushStats(ctx)
	if _, dead := v.stats(ctx, v.pool, t); dead.Valid {
		passDead = dead.Int64
	}
	m.DeadTuples.Set(float64(passDead), t.Name)
}

// passedOverWaits are the waits before a VACUUM that another session's
// lock passed over is tried again, within the pass: autovacuum visits a
// busy inbox every autovacuum_naptime for its inserts alone, and holds a
// small table for some hundred milliseconds. Left to the next pass, the
// rows the pass deleted stayed dead for an INTERVAL more while the writer
// grew the heap: the soak's one rep of three at footprint 1.60 against 1.35
// (bench/README.md, "Soak"). 1.5 s in all, then the next pass tries again.
var passedOverWaits = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}

// heldBackWait is the wait before a VACUUM that an older snapshot held
// back (heldBack) is tried again. The soak (bench/README.md, "Soak") found
// one in about 36 passes leaving the 5,000 rows its pass had deleted, and
// the writer grew the heap by as many rows before the next pass's: a
// footprint of 1.58 in one rep of three against 1.35.
const heldBackWait = 200 * time.Millisecond

// heldBack says that a VACUUM left dead tuples it was run for: at least
// minDead, and half of the dead it was run for.
func heldBack(left pgtype.Int8, dead int64) bool {
	return left.Valid && left.Int64 >= minDead && 2*left.Int64 >= dead
}

// vacuum runs one VACUUM of t, at pace when that is set, and says whether
// it ran, and the dead tuples it left. One that another session's lock
// passed over succeeds all the same, with only a WARNING (passedOver),
// which says so on a connection built by dbconn (the daemon's are;
// dbconn.WatchNotices) where the role's client_min_messages lets it
// through, on any server. Without it, the table's count of manual VACUUMs
// says (stats, PostgreSQL 15 and later): unchanged, it was passed over; a
// VACUUM of another session's that ends between the two reads is taken for
// this one there. Where neither can be read, a VACUUM that succeeded counts
// as run, and left is not valid. While it runs, the throttle watches it:
// a session that queues behind its lock, a signal over its threshold or a
// standby that falls behind anyway (service.WriterGate's Overrun) cancels
// it, and the error is a *stopError.
func (v *Vacuumer) vacuum(ctx context.Context, t *catalog.Table, pace *Pace) (ran bool, left pgtype.Int8, took time.Duration, err error) {
	c, err := v.pool.Acquire(ctx)
	if err != nil {
		return false, left, 0, err
	}
	defer c.Release()
	before, _ := v.stats(ctx, c, t)
	// SKIP_LOCKED: never in a lock queue. TRUNCATE false: never ACCESS
	// EXCLUSIVE. Outside a transaction block, as VACUUM must be: pgx sends
	// a statement without arguments in the simple protocol.
	sql := "VACUUM (SKIP_LOCKED, TRUNCATE false) " + t.Ident
	var lsn string
	if pace != nil {
		if err := setPace(ctx, c, *pace); err != nil {
			return false, left, 0, err
		}
		defer resetPace(ctx, c)
		// Parallel workers share the cost balance only roughly: one
		// process keeps to the pace.
		sql = "VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) " + t.Ident
		if err := c.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
			return false, left, 0, err
		}
	}
	// Behind a pooler the connection's process id is the pooler's own, and
	// the server connection the VACUUM will run on is not known before it
	// runs: the statement carries a tag by which the watch finds it.
	tag := ""
	if pooled, err := v.throughPooler(ctx); err != nil {
		return false, left, 0, err
	} else if pooled {
		tag = fmt.Sprintf("inboxkeeper vacuum %d.%d", time.Now().UnixNano(), tagSeq.Add(1))
		sql += " /* " + tag + " */"
	}
	vctx, stop := v.watch(ctx, c, tag)
	began := time.Now()
	w := dbconn.WatchNotices(c.Conn().PgConn())
	_, err = c.Exec(vctx, sql)
	notices := w.Stop()
	took = time.Since(began)
	if why, lockWait := stop(); why != "" && err != nil && ctx.Err() == nil {
		return false, left, took, &stopError{reason: why, lockWait: lockWait, err: err}
	}
	if err != nil {
		return false, left, took, err
	}
	if v.afterVacuum != nil {
		v.afterVacuum()
	}
	after, left := v.stats(ctx, c, t)
	if n := passedOver(notices); n != nil {
		v.opts.Logger.Debug("vacuum: passed over", "table", t.Name, "warning", n.Message, "sqlstate", n.Code)
		return false, left, took, nil
	}
	if pace != nil {
		v.learn(ctx, c, t, *pace, lsn, took)
	}
	// A table another session holds a conflicting lock on (autovacuum, a
	// VACUUM or ANALYZE of someone else's, DDL) is passed over.
	return !(before.Valid && after.Valid && after.Int64 == before.Int64), left, took, nil
}

// stopError is a VACUUM the throttle stopped while it ran.
type stopError struct {
	reason   string
	lockWait bool  // a session queued behind its lock: not tried again in the pass
	err      error // the cancelled statement's
}

func (e *stopError) Error() string { return "stopped (" + e.reason + "): " + e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// watchEvery is how often a running VACUUM asks the throttle whether it
// must stop: the throttle's own cadence for the standbys.
const watchEvery = 50 * time.Millisecond

// watch has the throttle watch the VACUUM about to run on c: a session
// that queues behind its lock gets it cancelled (service.Gate's Watch), as
// does a reason to stop from Overrun (service.WriterGate), checked every
// watchEvery. It returns the VACUUM's context and a stop function, called
// when the VACUUM has returned, that says why it was cancelled (empty when
// it was not), and whether that was a session queued behind it.
func (v *Vacuumer) watch(ctx context.Context, c *pgxpool.Conn, tag string) (context.Context, func() (string, bool)) {
	th := v.opts.Throttle
	if th == nil {
		return ctx, func() (string, bool) { return "", false }
	}
	vctx, cancel := context.WithCancel(ctx)
	var done func()
	var blocked func() bool
	if tag == "" {
		done, blocked = th.Watch(c.Conn().PgConn().PID(), time.Time{})
	} else {
		done, blocked = v.watchTagged(vctx, th, tag)
	}
	wg, _ := th.(service.WriterGate)
	var why string
	finished := make(chan struct{})
	if wg != nil {
		go func() {
			defer close(finished)
			tick := time.NewTicker(watchEvery)
			defer tick.Stop()
			for {
				select {
				case <-vctx.Done():
					return
				case <-tick.C:
				}
				if r := wg.Overrun(); r != "" {
					why = r
					cancel()
					return
				}
			}
		}()
	} else {
		close(finished)
	}
	return vctx, func() (string, bool) {
		cancel()
		<-finished
		done()
		if why == "" && blocked() {
			return "a session queued behind its lock", true
		}
		return why, false
	}
}

// maxStops is how many times a pass starts a VACUUM again after the
// throttle stopped one: each start waits for the standby to catch up, and
// goes at half the pace of the one before.
const maxStops = 2

// stopped records that the throttle stopped a VACUUM of t (the stops-th
// of the pass), and says whether to start it again. The pages it cleaned
// stay clean: the next VACUUM reads them again but writes little for them.
func (v *Vacuumer) stopped(t *catalog.Table, pace *Pace, stop *stopError, stops int) (again bool) {
	if m := v.opts.Metrics; m != nil && pace != nil {
		m.Pacing.WithLabelValues(t.Name, "stopped").Inc()
	}
	again = stops <= maxStops && !stop.lockWait
	attrs := []any{"table", t.Name, "reason", stop.reason, "again", again}
	if pace != nil {
		attrs = append(attrs, "pace", pace.String())
	}
	v.opts.Logger.Info("vacuum: stopped by the throttle; what it cleaned stays clean", attrs...)
	return again
}

// windowWait bounds how long a VACUUM waits for a standby's queue to come
// down to half its window: after a pass it is at most a window (0.4 x
// MAX_REPLICA_LAG of apply), after a stop 0.8 x MAX_REPLICA_LAG.
const windowWait = 30 * time.Second

// pace asks the throttle how fast the VACUUM of t may write (waiting, at
// most windowWait, for the standbys' queues to come down to half their
// window), and returns its pace (at boost while the standby's rate is not
// measured: PaceFor): nil where no standby streams (it runs unpaced), and
// why it does not run when it cannot be paced.
func (v *Vacuumer) pace(ctx context.Context, t *catalog.Table, boost float64) (*Pace, string) {
	wg, ok := v.opts.Throttle.(service.WriterGate)
	if !ok {
		return nil, ""
	}
	wctx, cancel := context.WithTimeout(ctx, windowWait)
	wp, err := wg.PaceWriter(wctx)
	cancel()
	if err != nil {
		reason, _ := service.Held(err)
		v.opts.Logger.Debug("vacuum: held for the standby; the next pass tries again", "table", t.Name, "reason", reason)
		return nil, "throttled (" + reason + ")"
	}
	if !wp.Paced() {
		return nil, ""
	}
	pooled, err := v.throughPooler(ctx)
	if err != nil {
		return nil, "could not tell whether the connection goes through a pooler: " + err.Error()
	}
	v.mu.Lock()
	perUnit := v.perUnit[t.Name]
	v.mu.Unlock()
	p, passedOver := Plan(wp, pooled, perUnit, boost)
	if passedOver != "" {
		if m := v.opts.Metrics; m != nil {
			m.Pacing.WithLabelValues(t.Name, "passed_over").Inc()
		}
	}
	return p, passedOver
}

// tagSeq tells apart the tags of VACUUMs started in the same nanosecond.
var tagSeq atomic.Int64

// watchTagged is the throttle's lock watch for a VACUUM that runs behind
// a pooler: it finds the VACUUM's server process by the tag in its text
// (pg_stat_activity), every watchEvery until it runs, and watches that
// process. done stops the search and the watch.
func (v *Vacuumer) watchTagged(ctx context.Context, th service.Gate, tag string) (done func(), blocked func() bool) {
	var mu sync.Mutex
	var stopWatch func()
	var isBlocked func() bool
	sctx, stopSearch := context.WithCancel(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(watchEvery)
		defer tick.Stop()
		for {
			var pid int32
			err := v.pool.QueryRow(sctx, `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
AND position($1 in query) > 0 LIMIT 1`, tag).Scan(&pid)
			if err == nil {
				d, b := th.Watch(uint32(pid), time.Time{})
				mu.Lock()
				stopWatch, isBlocked = d, b
				mu.Unlock()
				return
			}
			if !errors.Is(err, pgx.ErrNoRows) && sctx.Err() == nil {
				v.opts.Logger.Debug("vacuum: could not find the VACUUM's server process to watch it", "error", err)
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
			stopSearch()
			<-finished
			mu.Lock()
			defer mu.Unlock()
			if stopWatch != nil {
				stopWatch()
			}
		}, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return isBlocked != nil && isBlocked()
		}
}

// throughPooler says, once, whether the pool's connections go through a
// connection pooler (dbconn.Pooled): a session setting there may not reach
// the server connection the VACUUM runs on, and would stay behind for
// another client.
func (v *Vacuumer) throughPooler(ctx context.Context) (bool, error) {
	if p := v.pooled.Load(); p != 0 {
		return p == 2, nil
	}
	c, err := v.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	pooled, err := dbconn.Pooled(ctx, c.Conn())
	if err != nil {
		return false, err
	}
	if pooled {
		v.pooled.Store(2)
		v.opts.Logger.Info("vacuum: the connection goes through a pooler, where a VACUUM cannot be paced: while a standby streams, the daemon leaves its tables to autovacuum")
	} else {
		v.pooled.Store(1)
	}
	return pooled, nil
}

// setPace sets the session's cost settings for a VACUUM at p.
func setPace(ctx context.Context, c *pgxpool.Conn, p Pace) error {
	var b strings.Builder
	var args []any
	for i, kv := range p.settings() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "set_config($%d, $%d, false)", 2*i+1, 2*i+2)
		args = append(args, kv[0], kv[1])
	}
	_, err := c.Exec(ctx, "SELECT "+b.String(), args...)
	return err
}

// resetPace puts the session's cost settings back; a connection whose
// settings could not be reset is closed, never handed back.
func resetPace(ctx context.Context, c *pgxpool.Conn) {
	ctx = context.WithoutCancel(ctx)
	if _, err := c.Exec(ctx, "RESET vacuum_cost_delay; RESET vacuum_cost_limit; RESET vacuum_cost_page_hit; RESET vacuum_cost_page_miss; RESET vacuum_cost_page_dirty"); err != nil {
		c.Conn().Close(ctx)
	}
}

// learnFrom is the least WAL a paced VACUUM writes for its figures to be
// learned: a small one's are mostly its fixed costs.
const learnFrom = 1 << 20

// learn keeps the WAL a cost unit wrote in a paced VACUUM of t that began
// at the insert position lsn and took took: the next one of the table is
// paced by it (in this process).
func (v *Vacuumer) learn(ctx context.Context, c *pgxpool.Conn, t *catalog.Table, p Pace, lsn string, took time.Duration) {
	var wal int64
	if err := c.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::int8", lsn).Scan(&wal); err != nil || wal < learnFrom {
		return
	}
	perUnit := p.learn(wal, took)
	v.mu.Lock()
	v.perUnit[t.Name] = perUnit
	v.mu.Unlock()
	v.opts.Logger.Debug("vacuum: measured its WAL", "table", t.Name, "wal_bytes", wal, "took", took.Round(time.Millisecond), "wal_per_cost_unit", int64(perUnit))
}

// passedOver is the WARNING among a VACUUM's notices that says it skipped
// the table: 55P03 (lock_not_available), another session holds a lock on
// it; 42P01 (undefined_table), it was dropped meanwhile. nil: none did.
// (A role that may not vacuum the table gets one too, with no code of its
// own; mayVacuum keeps the daemon from trying.)
func passedOver(notices []*pgconn.Notice) *pgconn.Notice {
	for _, n := range notices {
		if n.Severity == "WARNING" && (n.Code == "55P03" || n.Code == "42P01") {
			return n
		}
	}
	return nil
}

// stats are how many manual VACUUMs t has had and its dead tuples, by its
// statistics (a VACUUM sets the dead tuples to those it could not remove):
// not valid before PostgreSQL 15, whose statistics collector may not have
// been told of a VACUUM that just ended (15 writes it as the VACUUM ends),
// nor where track_counts is off (a VACUUM then counts nothing), nor when
// they could not be read.
func (v *Vacuumer) stats(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t *catalog.Table) (vacuums, dead pgtype.Int8) {
	if err := q.QueryRow(ctx, `SELECT CASE WHEN ok THEN pg_stat_get_vacuum_count($1::oid) END, CASE WHEN ok THEN pg_stat_get_dead_tuples($1::oid) END
FROM (SELECT current_setting('server_version_num')::int >= 150000 AND current_setting('track_counts')::bool AS ok) c`, t.OID).Scan(&vacuums, &dead); err != nil {
		return pgtype.Int8{}, pgtype.Int8{}
	}
	return vacuums, dead
}

// flushStats has every idle connection of the pool send the statistics
// its backend holds back: a backend sends its counts at most once a second,
// and those of its last transactions ten seconds after it went idle. The
// deletes of a pass's last batches would reach pg_stat_user_tables after
// the VACUUM that removed their rows, which sets the dead tuples to what it
// left: they would read as dead again, and the next pass would VACUUM
// again for nothing (a sweep of 1.09M rows: the next pass saw 1,088,287
// dead tuples). pg_stat_force_next_flush (PostgreSQL 15) makes the backend
// send them before it answers; older servers have none, and their
// statistics collector lags anyway. Best effort: the VACUUM runs whatever
// this does.
func (v *Vacuumer) flushStats(ctx context.Context) {
	if v.noFlush.Load() {
		return
	}
	for _, c := range v.pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		c.Release()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
			v.noFlush.Store(true)
		} else if err != nil {
			v.opts.Logger.Debug("vacuum: could not flush a connection's statistics", "error", err)
		}
	}
}

// mayVacuumSQL says whether the session's role may VACUUM table $1: its
// owner, the database's owner or a superuser may (PostgreSQL 14 to 16: a
// non-owner's VACUUM skips the table with a warning the client never
// sees), and from PostgreSQL 17 a role granted MAINTAIN on it. CASE keeps
// the MAINTAIN check, which older servers do not know, from running there.
const mayVacuumSQL = `
SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
    OR pg_has_role(c.relowner, 'USAGE')
    OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE')
    OR CASE WHEN current_setting('server_version_num')::int >= 170000 THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
FROM pg_class c WHERE c.oid = $1`

// mayVacuum asks once per table whether this role may vacuum it, and says
// so once when it may not: autovacuum keeps the table then.
func (v *Vacuumer) mayVacuum(ctx context.Context, t *catalog.Table) (bool, error) {
	v.mu.Lock()
	ok, known := v.allowed[t.Name]
	v.mu.Unlock()
	if known {
		return ok, nil
	}
	if err := v.pool.QueryRow(ctx, mayVacuumSQL, t.OID).Scan(&ok); err != nil {
		return false, fmt.Errorf("may this role vacuum %s: %w", t.Name, err)
	}
	v.mu.Lock()
	v.allowed[t.Name] = ok
	v.mu.Unlock()
	if !ok {
		v.opts.Logger.Info("vacuum: this role may not VACUUM the table (only its owner, the database's owner or, from PostgreSQL 17, a role granted MAINTAIN may): autovacuum keeps its space; docs/operations/steady-state.md has the settings for a high-churn inbox",
			"table", t.Name)
	}
	return ok, nil
}

// MayVacuum says whether the session's role may VACUUM t (mayVacuumSQL),
// asked afresh: for the compaction, whose VACUUM gives pages back.
func MayVacuum(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t *catalog.Table) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, mayVacuumSQL, t.OID).Scan(&ok)
	return ok, err
}
