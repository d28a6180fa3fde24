package batchloop

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
)

// TxOptions set up a batch transaction.
type TxOptions struct {
	LockTimeout, StatementTimeout time.Duration
	// IdleInTx is the transaction's idle_in_transaction_session_timeout
	// (0: dbconn.DefaultIdleTimeout): a frozen daemon lets go of the fence.
	IdleInTx time.Duration
	// Throttle, when set, watches the transaction's backend for sessions
	// queueing behind its locks, and asks for the WAL the batch wrote.
	Throttle service.Gate
	// Clock pins now for tests; nil: the database's now().
	Clock service.Clock
	// Citus: the table is distributed; the timeouts reach the workers too
	// (dbconn.TxSettings.Citus).
	Citus bool
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

// Begin opens a batch transaction on table.
func Begin(ctx context.Context, pool *pgxpool.Pool, table string, o TxOptions) (_ *Tx, err error) {
	var workers map[string]float64
	if wp, ok := o.Throttle.(workerPacer); ok && o.Citus && wp.PacesWorkers() {
		// Read before the transaction: it holds no lock meanwhile.
		if workers, err = WorkerWAL(ctx, pool); err != nil {
			return nil, fmt.Errorf("read the workers' WAL positions: %w", err)
		}
	}
	ptx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	t := &Tx{Tx: ptx, pool: pool, measure: o.Throttle != nil, workerWAL: workers}
	defer func() {
		if err != nil {
			t.Close(ctx, &err)
		}
	}()
	b, err := dbconn.TxSettings{LockTimeout: o.LockTimeout, StatementTimeout: o.StatementTimeout, IdleInTx: o.IdleInTx, CustomPlans: true, Citus: o.Citus}.Apply(ctx, ptx)
	if err != nil {
		return nil, err
	}
	if o.Throttle != nil {
		t.done, t.blocked = o.Throttle.Watch(b.PID, b.XactStart)
	}
	if err := ptx.QueryRow(ctx, "SELECT coalesce($1::timestamptz, now()), pg_advisory_xact_lock_shared($2)::text, pg_current_wal_insert_lsn()::text",
		o.Clock.Pinned(), holds.FenceKey).Scan(&t.Now, new(string), &t.walStart); err != nil {
		return nil, err
	}
	if t.Coverage, err = holds.Active(ctx, ptx, table, t.Now); err != nil {
		return nil, err
	}
	return t, nil
}

// Commit commits the batch and, with a throttle, returns the WAL written
// since Begin (other sessions' writes meanwhile included): the throttle caps
// batches in bytes for a slow standby. Without one the round trip is saved.
func (t *Tx) Commit(ctx context.Context) (wal float64, err error) {
	if err := t.Tx.Commit(ctx); err != nil {
		return 0, err
	}
	t.committed = true
	if t.measure {
		if err := t.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8", t.walStart).Scan(&wal); err != nil {
			wal = 0
		}
	}
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
}
