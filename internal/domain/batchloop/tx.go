package batchloop

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// TxOptions set up a batch transaction.
type TxOptions struct {
	LockTimeout, StatementTimeout time.Duration
	// IdleInTx is the transaction's idle_in_transaction_session_timeout
	// (0: config.DefaultIdleTimeout): a frozen daemon lets go of the fence.
	IdleInTx time.Duration
	// Throttle, when set, watches the transaction's backend for sessions
	// queueing behind its locks, and asks for the WAL the batch wrote.
	Throttle service.Gate
	// Clock pins now for tests; nil: the database's now().
	Clock service.Clock
	// Citus: the table is distributed; the timeouts reach the workers too
	// (dbconn.TxSettings.Citus).
	Citus bool
	// Settings, when set, is a statement without parameters the batch runs
	// after the fence and the holds, in the same round trip (its own
	// set_config(..., true) settings).
	Settings string
	// Watch, when set, is the runtime settings watch, read in the same
	// round trip: when the settings changed, Begin rolls back and returns
	// its error (retry.ErrSettingsChanged), before the batch's statement.
	Watch service.TxWatch
	// CachedPlans leaves plan_cache_mode alone, where batches otherwise
	// force custom plans (dbconn.TxSettings.CustomPlans): for a table other
	// tables reference, whose every deleted row runs each foreign key's
	// check, a cached plan that a forced custom plan re-plans each time.
	CachedPlans bool
}

// Tx is one batch transaction, ready for its statement: timeouts set, the
// hold fence taken in shared mode, now read, and the holds and replays
// active on the table read after the fence (in a statement of their own,
// so that their snapshot follows any hold writer the fence waited for).
type Tx struct {
	pgx.Tx
	Now      time.Time
	Coverage holds.Coverage

	pool      *pgxpool.Pool
	conn      *pgxpool.Conn // released by Commit or Close
	measure   bool
	walStart  string
	workerWAL map[string]float64 // each worker's WAL position at Begin, when measured (workerPacer)
	done      func()
	blocked   func() bool
	committed bool
}

// workerPacer is a throttle that paces against the standbys of Citus
// workers (throttle.Throttler.PacesWorkers): a batch on a distributed table
// writes its WAL there, and measures it there.
type workerPacer interface{ PacesWorkers() bool }

// Begin opens a batch transaction on table in one round trip: BEGIN, its
// settings, the fence, its now, the holds and replays, the settings watch
// (o.Watch) and o.Settings as a pipeline, which the server runs one
// statement after the other, the holds and replays read in statements of
// their own after the fence. A sweep's slice took nine round trips with
// its statement and COMMIT (and the watch's read before it), then four,
// now three (docs/design/expiry.md, "Round trips of a batch, and the
// connections a process opens"). Citus sends BEGIN and its settings apart
// (dbconn.TxSettings.Citus).
func Begin(ctx context.Context, pool *pgxpool.Pool, table string, o TxOptions) (_ *Tx, err error) {
	var workers map[string]float64
	if wp, ok := o.Throttle.(workerPacer); ok && o.Citus && wp.PacesWorkers() {
		// Read before the transaction: it holds no lock meanwhile.
		if workers, err = WorkerWAL(ctx, pool); err != nil {
			return nil, fmt.Errorf("read the workers' WAL positions: %w", err)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	ptx := &pipeTx{c: conn.Conn()}
	t := &Tx{Tx: ptx, pool: pool, conn: conn, measure: o.Throttle != nil, workerWAL: workers}
	defer func() {
		if err != nil {
			t.Close(ctx, &err)
		}
	}()
	settings := dbconn.TxSettings{LockTimeout: o.LockTimeout, StatementTimeout: o.StatementTimeout, IdleInTx: o.IdleInTx, CustomPlans: !o.CachedPlans, Citus: o.Citus}
	pinned := o.Clock.Pinned()
	var b dbconn.Backend
	batch := &pgx.Batch{}
	if o.Citus {
		if _, err = ptx.c.Exec(ctx, "begin"); err != nil {
			return nil, err
		}
		if b, err = settings.Apply(ctx, ptx); err != nil {
			return nil, err
		}
	} else {
		// BEGIN first in the pipeline: the statements after it run in its
		// transaction (a pipeline is one implicit transaction only until an
		// explicit BEGIN).
		batch.Queue("begin")
		if err := settings.Queue(batch, &b); err != nil {
			return nil, err
		}
	}
	fenced := false
	batch.Queue(holds.BatchFenceSQL).Exec(func(pgconn.CommandTag) error {
		fenced = true
		return nil
	})
	batch.Queue(fenceSQL, pinned).QueryRow(func(row pgx.Row) error {
		return row.Scan(&t.Now, &t.walStart)
	})
	holds.QueueActive(batch, table, o.Citus, pinned, &t.Coverage)
	var stop error
	if o.Watch != nil {
		o.Watch.QueueCheck(batch, &stop)
	}
	if o.Settings != "" {
		// Last: the caller's settings are for its statement alone (a
		// sweep's take every scan but the TID range scan from the planner,
		// and the watch's max(id) read after them cost 1e10, past
		// jit_above_cost: 25 to 300 ms of JIT compilation each batch).
		batch.Queue(o.Settings)
	}
	if err := ptx.c.SendBatch(ctx, batch).Close(); err != nil {
		if !fenced && retry.Code(err) == retry.SQLStateLockTimeout {
			// Named as the fence, with whoever holds it, not as a bare
			// lock timeout.
			return nil, holds.FenceBlocked(ctx, pool, err)
		}
		return nil, err
	}
	if stop != nil {
		// The runtime settings changed: the pass stops before this
		// batch's statement, as it did when the watch was read before it.
		return nil, stop
	}
	if o.Throttle != nil {
		// The backend's locks are watched from here on: the fence is a
		// shared lock that nothing the watch looks for queues behind, and
		// the batch's row locks come with its statement.
		t.done, t.blocked = o.Throttle.Watch(b.PID, b.XactStart)
	}
	return t, nil
}

// fenceSQL reads the batch's now (coalesce($1, now()): a pinned clock or
// the database's) and the WAL position, after the hold fence
// (holds.BatchFenceSQL) is taken.
const fenceSQL = "SELECT coalesce($1::timestamptz, now()), pg_current_wal_insert_lsn()::text"

// Commit commits the batch and, with a throttle, returns the WAL written
// since Begin (other sessions' writes meanwhile included), read in the same
// round trip as the COMMIT: the throttle caps batches in bytes for a slow
// standby.
func (t *Tx) Commit(ctx context.Context) (wal float64, err error) {
	batch := &pgx.Batch{}
	batch.Queue("commit")
	if t.measure {
		batch.Queue("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8", t.walStart)
	}
	br := t.Tx.SendBatch(ctx, batch)
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback // the transaction had failed
	}
	if err == nil && t.measure {
		if br.QueryRow().Scan(&wal) != nil {
			wal = 0 // committed all the same
		}
	}
	_ = br.Close() // after a COMMIT, what failed was the WAL reading
	if err != nil {
		return 0, err
	}
	t.committed = true
	t.release()
	if t.workerWAL != nil {
		// And what the workers wrote: the bulk of a distributed batch's.
		if end, err := WorkerWAL(ctx, t.pool); err == nil {
			for node, at := range end {
				if start, ok := t.workerWAL[node]; ok && at > start {
					wal += at - start
				}
			}
		}
	}
	return wal, nil
}

// pipeTx is a transaction whose BEGIN went out in the pipeline that set
// it up (pgx's own Tx sends its BEGIN in a round trip of its own). Nested
// transactions and large objects are not used by batches.
type pipeTx struct{ c *pgx.Conn }

var errNested = errors.New("batchloop: a batch transaction does not nest")

func (p *pipeTx) Begin(context.Context) (pgx.Tx, error) { return nil, errNested }
func (p *pipeTx) Commit(ctx context.Context) error {
	tag, err := p.c.Exec(ctx, "commit")
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// Rollback ends the transaction; outside one (its BEGIN never ran) the
// server only warns. A connection left in a transaction is not reused:
// the pool closes it when it is released.
func (p *pipeTx) Rollback(ctx context.Context) error {
	_, err := p.c.Exec(ctx, "rollback")
	return err
}
func (p *pipeTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return p.c.CopyFrom(ctx, table, cols, src)
}
func (p *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return p.c.SendBatch(ctx, b)
}
func (p *pipeTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (p *pipeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return p.c.Prepare(ctx, name, sql)
}
func (p *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return p.c.Exec(ctx, sql, args...)
}
func (p *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return p.c.Query(ctx, sql, args...)
}
func (p *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return p.c.QueryRow(ctx, sql, args...)
}
func (p *pipeTx) Conn() *pgx.Conn { return p.c }

// release hands the connection back to the pool, once.
func (t *Tx) release() {
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}

// WorkerWAL is every Citus worker's WAL insert position, in bytes, by
// node, read from the coordinator (run_command_on_workers). A worker that
// does not answer is left out.
func WorkerWAL(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (map[string]float64, error) {
	rows, err := q.Query(ctx, `SELECT nodename || ':' || nodeport, result::float8 FROM run_command_on_workers(
$$SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')$$) WHERE success`)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	var node string
	var at float64
	_, err = pgx.ForEachRow(rows, []any{&node, &at}, func() error {
		out[node] = at
		return nil
	})
	return out, err
}

// Close ends the transaction: a rollback unless it committed. When *errp is
// set and a session queued behind the batch's locks meanwhile (the watch
// cancelled it), the error is marked retry.ErrLockWait. Defer it.
func (t *Tx) Close(ctx context.Context, errp *error) {
	if t.done != nil {
		t.done()
		if *errp != nil && t.blocked() && !errors.Is(*errp, retry.ErrLockWait) {
			*errp = fmt.Errorf("%w (%v)", retry.ErrLockWait, *errp)
		}
		t.done = nil
	}
	if !t.committed {
		_ = t.Tx.Rollback(context.WithoutCancel(ctx))
	}
	t.release()
}
