package tiering

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/sqlargs"
)

// Demotion on a Citus distributed table (see docs/guides/citus.md).
//
// Citus refuses FOR UPDATE SKIP LOCKED across shards, so a batch that meets
// a row another session holds locked cannot skip it. It waits for it at
// most lockedRowWait (the timeouts reach the workers), rolls back, and is
// halved until it commits without the row; a batch of one row that still
// meets the lock steps over that row, to just after its anchor, and the
// batch goes on from there, growing again. The held row is left for a later
// pass, as SKIP LOCKED would leave it, and every transaction stays short.
// The deleter does the same with expiry windows (expiry/citus.go).

// lockedRowWait is how long a distributed demotion batch waits for a row
// lock before it narrows: the deleter's optimistic wait, short enough that
// an application that wants a row the batch holds waits about as little.
const lockedRowWait = 50 * time.Millisecond

// maxLockedSteps is how many locked rows one batch steps over before it
// gives up with the lock timeout (the loop retries it smaller, and the
// table's pass fails after MaxRetries): past that many, more likely a table
// lock is in the way than a few rows in use.
const maxLockedSteps = 16

// distributedBatch demotes about size due rows from lower on, in one or
// more transactions, stepping over rows other sessions hold locked (see
// above). It returns the keyset after the rows it demoted and the rows it
// stepped over; on an error, what committed before it (batchloop.Batch).
func (d *Demoter) distributedBatch(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int) (n int64, newest time.Time, wal float64, err error) {
	wait := min(d.opts.LockTimeout, lockedRowWait)
	limit, steps := size, 0
	for {
		m, top, w, err := d.batchTx(ctx, t, lower, limit, wait)
		if err == nil {
			n, wal = n+m, wal+w
			if m > 0 {
				lower = pgtype.Timestamptz{Time: top, Valid: true}
			}
			if m < int64(limit) || n >= int64(size) {
				// Short: nothing more is due from lower on. Or full.
				return n, lower.Time, wal, nil
			}
			limit = min(limit*2, size-int(n))
			continue
		}
		if retry.KindOf(err) != retry.KindLockTimeout {
			return n, lower.Time, wal, err
		}
		if limit > 1 {
			limit /= 2
			continue
		}
		// One row, and it is held: the first due row from lower.
		if steps++; steps > maxLockedSteps {
			return n, lower.Time, wal, fmt.Errorf("%d rows held locked by other sessions in one batch: %w", steps-1, err)
		}
		a, ok, ferr := d.firstDue(ctx, t, lower)
		if ferr != nil {
			return n, lower.Time, wal, ferr
		}
		if !ok {
			return n, lower.Time, wal, nil // it is no longer due: nothing is
		}
		d.log.Debug("tiering: stepping over a row another session holds locked", "table", t.Name, "anchor", a)
		if d.TestSignals.OnStep != nil {
			d.TestSignals.OnStep()
		}
		// timestamptz has microseconds: nothing lies strictly between.
		lower = pgtype.Timestamptz{Time: a.Add(time.Microsecond), Valid: true}
		limit = min(2, size)
	}
}

// firstDue is the anchor of the first row due for demotion from lower on
// that no blocking hold covers.
func (d *Demoter) firstDue(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz) (time.Time, bool, error) {
	var a pgtype.Timestamptz
	err := d.readTx(ctx, t, func(tx pgx.Tx) error {
		now, cov, err := d.coverage(ctx, tx, t)
		if err != nil {
			return err
		}
		var args sqlargs.List
		cond, _ := due(t, "t", &args, cov, now, lower)
		return tx.QueryRow(ctx, fmt.Sprintf("SELECT min(%s) FROM %s t WHERE %s AND NOT %s", t.Tiers.Anchor.AsTimestamptz("t"), walked(t), cond, blocked(t, cov, "t", &args)),
			args.Values...).Scan(&a)
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("find the locked row: %w", err)
	}
	return a.Time, a.Valid, nil
}
