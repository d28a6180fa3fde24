package expiry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
)

// Batches on a Citus distributed table (see docs/guides/citus.md).
//
// The coordinator refuses the two tools the batch uses on one node: a
// DELETE by ctid, and FOR UPDATE SKIP LOCKED across shards. The range form
// works unchanged (Citus pushes it to every shard at once); where it cannot
// be used, the key form (keySQL) picks the rows by expiry and deletes them
// by key. Without SKIP LOCKED, a batch that meets a row another session
// holds locked waits for it at most optimisticLockTimeout (the timeouts
// reach the workers: dbconn.TxSettings.Citus), rolls back, and is narrowed
// (distributedBatch) until it commits without the row; the row itself is
// stepped over and left for a later pass, as SKIP LOCKED would leave it.

// maxLockedSteps is how many locked rows one batch steps over before it
// gives up with the lock timeout (the loop then retries with a smaller
// batch, and the table's pass fails after MaxRetries): past that many,
// more likely a table lock is in the way than a few rows in use.
const maxLockedSteps = 16

// distributedBatch deletes up to size rows from lower on, as batch does on
// one node. Its first transaction is the whole batch; when that meets a
// locked row it halves the next one, down to one row, and then steps over
// the first due row (the locked one) to just after its expiry. Every
// transaction is as short as on one node and takes the fence; only the
// rows a session holds locked (and rows that share their expiry) are left.
func (d *Deleter) distributedBatch(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int, res *TableResult) (n int64, newest time.Time, wal float64, err error) {
	pos, step, steps, narrowed := lower, size, 0, false
	for n < int64(size) {
		m, nw, w, err := d.batchTx(ctx, t, pos, step, res, false)
		switch {
		case err == nil:
			n, wal = n+m, wal+w
			if m > 0 {
				pos = pgtype.Timestamptz{Time: nw, Valid: true}
			}
			if m < int64(step) {
				// The table has no more due rows from pos on.
				return n, pos.Time, wal, nil
			}
			step = min(step*2, size-int(n))
		case retry.Kind(err) != retry.KindLockTimeout:
			if n > 0 {
				// What committed stays committed: report it, and let the
				// loop retry from there.
				d.log.Debug("expiry: narrowed batch failed after deleting rows", "table", t.Name, "deleted", n, "error", err)
			}
			return n, pos.Time, wal, err
		case step > 1:
			if !narrowed {
				narrowed = true
				res.SkipLockedBatches++
			}
			step = max(1, step/2)
		default:
			// The first due row from pos is the one held: step over it.
			if steps++; steps > maxLockedSteps {
				return n, pos.Time, wal, fmt.Errorf("%d rows held locked by other sessions in one batch: %w", steps-1, err)
			}
			e, ok, ferr := d.firstDue(ctx, t, pos)
			if ferr != nil {
				return n, pos.Time, wal, ferr
			}
			if !ok {
				return n, pos.Time, wal, nil
			}
			d.log.Debug("expiry: stepping over a row another session holds locked", "table", t.Name, "expiry", e)
			if d.test.onFallback != nil {
				d.test.onFallback()
			}
			// timestamptz has microseconds: nothing lies strictly between.
			pos = pgtype.Timestamptz{Time: e.Add(time.Microsecond), Valid: true}
			step = max(1, min(size-int(n), 2))
		}
	}
	return n, pos.Time, wal, nil
}

// firstDue is the expiry of the oldest due, uncovered row from lower on.
func (d *Deleter) firstDue(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz) (time.Time, bool, error) {
	var e time.Time
	found := false
	err := d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
		var args holds.Args
		hp, rp := cov.Predicates(t, "t", &args)
		sql := fmt.Sprintf(`SELECT %[1]s FROM %[2]s t WHERE t.%[3]s <= %[4]s AND t.%[3]s >= %[5]s AND NOT %[6]s AND NOT %[7]s ORDER BY t.%[3]s LIMIT 1`,
			t.Expiry.AsTimestamptz("t"), t.Ident, t.Expiry.Quoted, t.Expiry.Instant(args.Add(cutoff(t, now))+"::timestamptz"),
			t.Expiry.Instant(args.Add(lower)+"::timestamptz"), hp, rp)
		err := tx.QueryRow(ctx, sql, args.Values...).Scan(&e)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("find the locked row: %w", err)
	}
	return e, found, nil
}

// keyColumns lists the table's key columns over alias, for a row
// comparison.
func keyColumns(t *catalog.Table, alias string) string {
	cs := make([]string, len(t.Key))
	for i, c := range t.Key {
		cs[i] = alias + "." + c.Quoted
	}
	return strings.Join(cs, ", ")
}
