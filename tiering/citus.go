package tiering

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
)

// Demotion on a table Citus plans: distributed, reference or Citus local
// (see docs/guides/citus.md).
//
// A batch that meets a row another session holds locked waits for it at
// most batchloop.OptimisticLockWait (the timeouts reach the workers), rolls
// back, and is halved until it commits without the row; a batch of one row
// that still meets the lock steps over that row (batchloop.LockedRows), and
// the batch goes on from there, growing again. The deleter does the same
// with expiry windows (expiry/citus.go). A reference table Citus locks
// whole for the session that holds the row: there the batch ends with the
// lock timeout at once (batchloop.ReferenceLocked).

// distributedBatch demotes about size due rows from lower on, in one or
// more transactions, stepping over rows other sessions hold locked (see
// above). It returns the keyset after the rows it demoted and the rows it
// stepped over; on an error, what committed before it (batchloop.Batch).
func (d *Demoter) distributedBatch(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int) (n int64, newest time.Time, wal float64, err error) {
	wait := min(d.opts.LockTimeout, batchloop.OptimisticLockWait)
	limit := size
	var locked batchloop.LockedRows
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
		if t.CitusReference {
			return n, lower.Time, wal, batchloop.ReferenceLocked(t.Name, err)
		}
		if limit > 1 {
			limit /= 2
			continue
		}
		// One row, and it is held: the first due row from lower.
		a, next, ok, serr := locked.StepOver(err, func() (time.Time, bool, error) { return d.firstDue(ctx, t, lower) })
		if serr != nil {
			return n, lower.Time, wal, serr
		}
		if !ok {
			return n, lower.Time, wal, nil // it is no longer due: nothing is
		}
		d.log.Debug("tiering: stepping over a row another session holds locked", "table", t.Name, "anchor", a)
		if d.TestSignals.OnStep != nil {
			d.TestSignals.OnStep()
		}
		lower, limit = next, min(2, size)
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
		return tx.QueryRow(ctx, fmt.Sprintf("SELECT min(%s) FROM %s t WHERE %s AND NOT %s", Of(t).Anchor.AsTimestamptz("t"), walked(t), cond, blocked(t, cov, "t", &args)),
			args.Values...).Scan(&a)
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("find the locked row: %w", err)
	}
	return a.Time, a.Valid, nil
}
