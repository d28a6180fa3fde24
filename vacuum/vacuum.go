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
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
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
	DeadTuples *daemonmetrics.Fact
}

// NewMetrics registers them on reg; the dead tuples are a fact of facts.
func NewMetrics(reg prometheus.Registerer, facts *daemonmetrics.Facts) *Metrics {
	return &Metrics{
		Vacuums: daemonmetrics.CounterVec(reg, "inboxkeeper_vacuums_total",
			"VACUUMs of a table the daemon ran (VACUUM (SKIP_LOCKED, TRUNCATE false)) after a pass that left INBOXKEEPER_VACUUM_DEAD_RATIO of its tuples dead, each one (one an older snapshot held back and its second count two); one that found the table locked and passed it over does not count.", "table"),
		DeadTuples: facts.Gauge(reg, "inboxkeeper_dead_tuples",
			"Dead tuples of the table after the daemon's last pass that deleted rows: pg_stat_user_tables.n_dead_tup, or the rows the daemon deleted since its last VACUUM of it when more.", "table"),
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
	since   map[string]int64 // rows deleted since this process last vacuumed the table
	allowed map[string]bool  // whether this role may vacuum the table, once asked
	noFlush atomic.Bool      // the server has no pg_stat_force_next_flush (before PostgreSQL 15)

	retrying    func(Outcome) // tests: called before the wait to try a VACUUM again, with the outcome so far
	afterVacuum func()        // tests: called after a VACUUM statement succeeded, before its outcome is read
}

// New returns a Vacuumer on pool; nil when opts.DeadRatio is 0.
func New(pool *pgxpool.Pool, opts Options) *Vacuumer {
	if opts.DeadRatio <= 0 {
		return nil
	}
	opts.Base = opts.Base.WithDefaults(0)
	return &Vacuumer{pool: pool, opts: opts, since: map[string]int64{}, allowed: map[string]bool{}}
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
	Took     time.Duration // its duration
	NotRun   string        // why none ran, when one was due
	Err      error
}

// AfterPass is told that a pass deleted deleted rows of t, which holds live
// and dead tuples by its statistics (read after the pass; they lag the
// deletes by up to a second, so the rows deleted since the last VACUUM
// count too). It vacuums t when they reach the ratio.
func (v *Vacuumer) AfterPass(ctx context.Context, t *catalog.Table, deleted, live, dead int64) Outcome {
	if v == nil || t.Partitioned() || t.Distributed() {
		return Outcome{}
	}
	v.mu.Lock()
	v.since[t.Name] += deleted
	dead = max(dead, v.since[t.Name])
	v.mu.Unlock()
	out := Outcome{Dead: dead}
	if m := v.opts.Metrics; m != nil {
		m.DeadTuples.Set(float64(dead), t.Name)
	}
	if dead < minDead || float64(dead) < v.opts.DeadRatio*float64(live+dead) {
		return out
	}
	if ok, err := v.mayVacuum(ctx, t); err != nil || !ok {
		out.NotRun, out.Err = "this role may not vacuum the table", err
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
	for {
		ran, left, took, err := v.vacuum(ctx, t)
		out.Took = took
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
	}
	v.opts.Logger.Debug("vacuum: done", "table", t.Name, "dead_tuples", dead, "live_tuples", live, "took", out.Took.Round(time.Millisecond))
	return out
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

// vacuum runs one VACUUM of t and says whether it ran, and the dead tuples
// it left. One that another session's lock passed over succeeds all the
// same, with only a WARNING (passedOver), which says so on a connection
// built by dbconn (the daemon's are; dbconn.WatchNotices) where the role's
// client_min_messages lets it through, on any server. Without it, the
// table's count of manual VACUUMs says (stats, PostgreSQL 15 and later):
// unchanged, it was passed over; a VACUUM of another session's that ends
// between the two reads is taken for this one there. Where neither can be
// read, a VACUUM that succeeded counts as run, and left is not valid.
func (v *Vacuumer) vacuum(ctx context.Context, t *catalog.Table) (ran bool, left pgtype.Int8, took time.Duration, err error) {
	c, err := v.pool.Acquire(ctx)
	if err != nil {
		return false, left, 0, err
	}
	defer c.Release()
	before, _ := v.stats(ctx, c, t)
	began := time.Now()
	// SKIP_LOCKED: never in a lock queue. TRUNCATE false: never ACCESS
	// EXCLUSIVE. Outside a transaction block, as VACUUM must be: pgx sends
	// a statement without arguments in the simple protocol.
	w := dbconn.WatchNotices(c.Conn().PgConn())
	_, err = c.Exec(ctx, "VACUUM (SKIP_LOCKED, TRUNCATE false) "+t.Ident)
	notices := w.Stop()
	took = time.Since(began)
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
	// A table another session holds a conflicting lock on (autovacuum, a
	// VACUUM or ANALYZE of someone else's, DDL) is passed over.
	return !(before.Valid && after.Valid && after.Int64 == before.Int64), left, took, nil
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
