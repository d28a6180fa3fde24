package compact

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// vacuumSQL: INDEX_CLEANUP ON, because a page is cut off only once its line
// pointers are free, which needs the index entries of the moved rows' old
// versions gone (VACUUM would skip the indexes when few pages have dead
// items, and the tail would stay); TRUNCATE true, whatever the table's
// vacuum_truncate (plan --apply sets it false for the steady state);
// SKIP_LOCKED, never in a lock queue. The truncation's ACCESS EXCLUSIVE is
// taken conditionally (tried for up to 5 s, never waited for) and given
// up within 20 ms of a session waiting for it, keeping what it cut so far.
const vacuumSQL = "VACUUM (INDEX_CLEANUP ON, TRUNCATE true, SKIP_LOCKED) "

// truncateWaits are the waits before a VACUUM that cut nothing off an
// empty tail is run again: another session held the table throughout the
// truncation's 5 s of tries, or a session waited for it at once. Then the
// next compaction tries again.
var truncateWaits = []time.Duration{250 * time.Millisecond, time.Second, 3 * time.Second}

// vacuumTail runs the compaction's VACUUM of t and, when it is the last
// of the compaction, runs it again (after truncateWaits) while it cuts
// nothing off a tail long enough to be cut that holds no row (tailEmpty).
// It counts what it did into res.
func (c *Compactor) vacuumTail(ctx context.Context, t *catalog.Table, deadline time.Time, last bool, res *Result, log *slog.Logger) error {
	for attempt := 0; ; attempt++ {
		before, after, ran, err := c.vacuumOnce(ctx, t, deadline, res)
		if err != nil {
			return err
		}
		if !ran {
			return nil // throttled until the deadline, or the table was locked: NotTruncated says
		}
		if c.TestSignals.OnVacuum != nil {
			c.TestSignals.OnVacuum(before, after)
		}
		if after < before {
			res.NotTruncated = ""
			return nil
		}
		empty, err := c.tailEmpty(ctx, t, after)
		if err != nil || !empty {
			return err
		}
		res.NotTruncated = "the heap ends in empty pages that the VACUUM did not cut off: another session held the table, " +
			"or an older snapshot still sees the moved rows' old versions (status names who holds the xmin horizon); the next compaction tries again"
		if !last {
			return nil // the next chunk's VACUUM cuts it
		}
		if attempt == len(truncateWaits) {
			log.Info("compact: the VACUUM could not cut the empty pages off; the next compaction tries again", "pages", after)
			return nil
		}
		if err := retry.Sleep(ctx, truncateWaits[attempt]); err != nil {
			return err
		}
		if why, ok := c.opts.CheckActive(); !ok {
			res.StoppedEarly = why
			return nil
		}
	}
}

// vacuumOnce runs one VACUUM of t, once the throttle admits it, and
// returns the heap's pages before and after it. ran is false when it did
// not run: held by the throttle until the deadline, or passed over (another
// session held a lock on the table).
func (c *Compactor) vacuumOnce(ctx context.Context, t *catalog.Table, deadline time.Time, res *Result) (before, after int64, ran bool, err error) {
	// The VACUUM as one batch of one "row" costing the WAL it is expected
	// to write: it starts once that fits the standbys' window, or once they
	// caught up when it does not.
	if held, err := c.admit(ctx, deadline, &vacuumCost{wal: c.expectedVacuumWAL(t, res)}); err != nil || held != "" {
		if held != "" {
			res.NotTruncated = "throttled (" + held + ") until the run time ran out"
		}
		return 0, 0, false, err
	}
	conn, err := c.sessions().Acquire(ctx)
	if err != nil {
		return 0, 0, false, err
	}
	defer conn.Release()
	var start string
	if err := conn.QueryRow(ctx, pagesSQL, t.OID).Scan(&before, &start); err != nil {
		return 0, 0, false, err
	}
	began := time.Now()
	w := dbconn.WatchNotices(conn.Conn().PgConn())
	verr := c.maintain(ctx, conn, vacuumSQL+t.Ident, c.vacuumRate())
	notices := w.Stop()
	took := time.Since(began)
	if verr != nil {
		return 0, 0, false, fmt.Errorf("vacuum %s: %w", t.Name, verr)
	}
	var wal float64
	if err := conn.QueryRow(ctx, pagesAfterSQL, t.OID, start).Scan(&after, &wal); err != nil {
		return 0, 0, false, err
	}
	if th := c.opts.Throttle; th != nil {
		th.Wrote(wal)
	}
	for _, n := range notices {
		if n.Severity == "WARNING" && n.Code == "55P03" { // lock_not_available: skipped
			res.NotTruncated = "another session held a lock on the table (VACUUM SKIP_LOCKED passed it over); the next compaction tries again"
			return before, after, false, nil
		}
	}
	res.Vacuums++
	c.learnVacuum(t, res, wal)
	if cut := (before - after) * res.Before.BlockSize; cut > 0 {
		res.Truncated += cut
		if m := c.opts.Metrics; m != nil {
			m.Truncated.WithLabelValues(t.Name).Add(float64(cut))
		}
	}
	c.log.Debug("compact: vacuum", "table", t.Name, "pages_before", before, "pages_after", after, "wal_bytes", wal, "took", took.Round(time.Millisecond))
	return before, after, true, nil
}

// sessions is the pool the VACUUMs and ANALYZEs run on.
func (c *Compactor) sessions() *pgxpool.Pool {
	if c.opts.SessionPool != nil {
		return c.opts.SessionPool
	}
	return c.pool
}

// maintain runs sql, a VACUUM or an ANALYZE, on conn under the batches'
// lock_timeout (SKIP_LOCKED keeps it out of the lock queue for the table
// itself; this bounds any other wait), set for the session and back to
// its default before the connection goes back to the pool: neither may run
// in a transaction.
//
// With rate above 0, the VACUUM is paced to write at most about rate bytes
// of WAL a second (costSQL).
func (c *Compactor) maintain(ctx context.Context, conn *pgxpool.Conn, sql string, rate float64) error {
	if _, err := conn.Exec(ctx, costSQL, retry.Millis(c.opts.LockTimeout), rate); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, sql)
	if _, rerr := conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout; RESET vacuum_cost_delay; RESET vacuum_cost_limit"); rerr != nil {
		_ = conn.Conn().Close(context.WithoutCancel(ctx)) // the pool drops a closed connection
	}
	return err
}

// costSQL sets the session's lock_timeout ($1) and, for a WAL rate $2
// above 0, its cost-based vacuum delay: a VACUUM sleeps 2 ms each time its
// cost reaches the limit, and a page it dirties costs vacuum_cost_page_dirty
// (20) and writes at most a full page image of WAL; so a limit of
// page_dirty x $2 / block_size x 0.002 keeps it near $2 bytes a second.
// (Pages it only reads cost 1 or 2: its scan of every index slows too,
// some seconds for a few hundred megabytes of index.)
const costSQL = `SELECT set_config('lock_timeout', $1, false),
       CASE WHEN $2::float8 > 0 THEN set_config('vacuum_cost_delay', '2', false) END,
       CASE WHEN $2::float8 > 0 THEN set_config('vacuum_cost_limit',
         greatest(1, least(10000, round(current_setting('vacuum_cost_page_dirty')::float8 * $2::float8
           / current_setting('block_size')::float8 * 0.002)))::int::text, false) END`

// paces is the throttle as it knows the standbys (throttle.Throttler).
type paces interface{ Paces() []throttle.Pace }

// unmeasuredRate is the apply rate assumed of a standby whose rate the
// throttle has not measured yet.
const unmeasuredRate = 2 << 20

// vacuumRate is the WAL a second a VACUUM may write: half the apply rate
// of the slowest streaming standby (the other half for the application
// and the throttle's window to drain); 0 without standbys, not paced. A
// VACUUM writes WAL for every page it prunes or frees, a full page image
// of each one it first touches after a checkpoint: unpaced, the first one
// after a purge (bench/compact, 400,000 rows, a 47 MB heap) wrote 11.7 MB
// in 0.76 s, a second and a half of apply at 8 MB/s.
func (c *Compactor) vacuumRate() float64 {
	p, ok := c.opts.Throttle.(paces)
	if !ok {
		return 0
	}
	rate := 0.0
	for _, s := range p.Paces() {
		r := s.ApplyRate
		if r <= 0 {
			r = unmeasuredRate
		}
		if rate == 0 || r < rate {
			rate = r
		}
	}
	return rate / 2
}

// admit waits, until deadline at most (zero: ctx's end), for the throttle
// to let a write the size of sizer start. held is why it did not by then
// ("": it did); err is ctx's.
func (c *Compactor) admit(ctx context.Context, deadline time.Time, sizer service.Sizer) (held string, err error) {
	th := c.opts.Throttle
	if th == nil {
		return "", nil
	}
	actx := ctx
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if _, err := th.Admit(actx, sizer); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if reason, ok := service.Held(err); ok && reason != "" {
			return reason, nil
		}
		return err.Error(), nil
	}
	return "", nil
}

// analyze runs ANALYZE (SKIP_LOCKED) on t, once the throttle lets it: it
// writes the statistics, a few pages of WAL. Held by the throttle until
// the deadline, it runs none and res says why the compaction stopped.
func (c *Compactor) analyze(ctx context.Context, t *catalog.Table, deadline time.Time, res *Result) error {
	if held, err := c.admit(ctx, deadline, nil); err != nil || held != "" {
		if held != "" {
			res.StoppedEarly = retry.Throttled("run time reached while throttled (" + held + ")")
		}
		return err
	}
	conn, err := c.sessions().Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := c.maintain(ctx, conn, "ANALYZE (SKIP_LOCKED) "+t.Ident, 0); err != nil {
		return fmt.Errorf("analyze %s: %w", t.Name, err)
	}
	return nil
}

const (
	pagesSQL      = "SELECT pg_relation_size($1::oid) / current_setting('block_size')::int8, pg_current_wal_insert_lsn()::text"
	pagesAfterSQL = "SELECT pg_relation_size($1::oid) / current_setting('block_size')::int8, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $2::pg_lsn)::float8"
)

// tailEmpty says whether the last pages of t's heap (of pages) that a
// VACUUM cuts off at the least hold no row this snapshot sees. VACUUM
// tries to truncate only a tail of at least 1,000 pages or a sixteenth of
// the heap (REL_TRUNCATE_MINIMUM, REL_TRUNCATE_FRACTION in vacuumlazy.c):
// a shorter one is no reason to try again.
func (c *Compactor) tailEmpty(ctx context.Context, t *catalog.Table, pages int64) (bool, error) {
	tail := min(1000, pages/16)
	if tail == 0 {
		return false, nil
	}
	var n int64
	err := c.readTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s u WHERE u.ctid >= %s", t.Ident, tidAt(pages-tail))).Scan(&n)
	})
	return n == 0, err
}

// expectedVacuumWAL is the WAL t's next VACUUM is expected to write: the
// row versions written since the last one, at what a version cost the last
// VACUUM after moves (0 before any: the throttle's first guess).
func (c *Compactor) expectedVacuumWAL(t *catalog.Table, res *Result) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.vacuumPerUpdate[t.Name] * float64(res.Updates-res.vacuumedAt)
}

// learnVacuum records the WAL a VACUUM wrote after the row versions
// written since the last one.
func (c *Compactor) learnVacuum(t *catalog.Table, res *Result, wal float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := res.Updates - res.vacuumedAt; n > 0 && wal > 0 {
		c.vacuumPerUpdate[t.Name] = wal / float64(n)
	}
	res.vacuumedAt = res.Updates
}

// vacuumCost is a VACUUM as the throttle's pacing sees a batch: one row
// that writes wal bytes (0: not known yet).
type vacuumCost struct{ wal float64 }

func (v *vacuumCost) Size() int       { return 1 }
func (v *vacuumCost) Min() int        { return 1 }
func (v *vacuumCost) PerRow() float64 { return v.wal }
func (v *vacuumCost) Pressure()       {}
