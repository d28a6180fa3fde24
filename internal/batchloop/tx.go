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
	// Settings, when set, is a statement without parameters the batch runs
	// after the fence and the holds, in the same round trip (its own
	// set_config(..., true) settings).
	Settings string
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

// Begin opens a batch transaction on table: BEGIN, then its settings, the
// fence, its now, the holds and replays and o.Settings in one more round
// trip (a pipeline: the server runs them one after the other, each holds
// and replays read in a statement of its own after the fence, as before).
// A sweep's slice took nine round trips with its statement and COMMIT, four
// now (docs/design/expiry.md, "Round trips of a batch, and the connections
// a process opens"). Citus sends its settings apart
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
	ptx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, err
	}
	t := &Tx{Tx: ptx, pool: pool, conn: conn, measure: o.Throttle != nil, workerWAL: workers}
	defer func() {
		if err != nil {
			t.Close(ctx, &err)
		}
	}()
	settings := dbconn.TxSettings{LockTimeout: o.LockTimeout, StatementTimeout: o.StatementTimeout, IdleInTx: o.IdleInTx, CustomPlans: true, Citus: o.Citus}
	pinned := o.Clock.Pinned()
	var b dbconn.Backend
	batch := &pgx.Batch{}
	if o.Citus {
		if b, err = settings.Apply(ctx, ptx); err != nil {
			return nil, err
		}
	} else if err := settings.Queue(batch, &b); err != nil {
		return nil, err
	}
	batch.Queue(fenceSQL, pinned, holds.FenceKey).QueryRow(func(row pgx.Row) error {
		return row.Scan(&t.Now, new(string), &t.walStart)
	})
	holds.QueueActive(batch, table, pinned, &t.Coverage)
	if o.Settings != "" {
		batch.Queue(o.Settings)
	}
	if err := ptx.SendBatch(ctx, batch).Close(); err != nil {
		return nil, err
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
// the database's), takes the hold fence in shared mode and reads the WAL
// position.
const fenceSQL = "SELECT coalesce($1::timestamptz, now()), pg_advisory_xact_lock_shared($2)::text, pg_current_wal_insert_lsn()::text"

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
