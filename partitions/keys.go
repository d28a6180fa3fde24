package partitions

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// The permanent keys of a detached partition are copied out in the
// transaction that drops it, in one INSERT ... SELECT of the whole
// partition: a month's keys, tens or hundreds of MB of WAL in one
// statement, which no WAL window can admit. While a standby streams they
// are first copied in slices of the partition's heap (a TID range scan,
// PostgreSQL 14 and later), each a transaction of its own sized to half
// the tightest standby's WAL window and admitted by the throttle as a
// writer that cannot be split. The keys are idempotent (ON CONFLICT DO
// NOTHING), so the drop's own copy then finds them there and writes
// nothing; a row a hold covers keeps the partition, and copying its key
// early changes nothing the hold protects.
const (
	// firstSlicePages is the first slice, before any was measured: a
	// page of narrow rows gives some kB of keys.
	firstSlicePages = 64
	maxSlicePages   = 1 << 16
)

// copyKeysAhead copies the permanent keys of the detached partition p out
// in paced slices before its drop (see above), and returns how many it
// wrote. It does nothing without permanent keys, without a standby
// streaming, on Citus (a TID range does not reach the shards), or where a
// hold or replay keeps the partition at now (the drop will not happen).
func (m *Manager) copyKeysAhead(ctx context.Context, t *catalog.Table, p Partition, now time.Time) (int64, error) {
	wg, ok := m.Throttle.(service.WriterGate)
	if tiering.KeyOf(t) == nil || t.InCitusMetadata || !ok {
		return 0, nil
	}
	if reason, _, err := m.covered(ctx, t, p.Ident(), now); err != nil || reason != "" {
		return 0, err
	}
	var pages int64
	if err := m.pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int8", p.Ident()).Scan(&pages); err != nil {
		return 0, fmt.Errorf("the size of %s: %w", p, err)
	}
	var copied int64
	perPage := 0.0 // WAL a page's keys wrote, measured on the slice before
	for from := int64(0); from < pages; {
		if why, ok := m.CheckActive(); !ok {
			return copied, retry.StopError{Early: why}
		}
		wp, err := wg.PaceWriter(ctx)
		if err != nil {
			reason, _ := service.Held(err)
			return copied, retry.StopError{Early: retry.Throttled("throttled (" + reason + ")")}
		}
		if !wp.Paced() {
			return copied, nil // no standby: the drop's own copy
		}
		n := int64(firstSlicePages)
		if perPage > 0 {
			n = min(max(int64(wp.Window/2/perPage), 1), maxSlicePages)
		}
		source := fmt.Sprintf("(SELECT * FROM %s WHERE ctid >= '(%d,0)'::tid AND ctid < '(%d,0)'::tid)", p.Ident(), from, from+n)
		var wal int64
		began := time.Now()
		err = pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
			if _, err := m.txSettings().Apply(ctx, tx); err != nil {
				return err
			}
			var lsn string
			if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
				return err
			}
			k, err := tiering.CopyPermanentKeys(ctx, tx, t, source)
			if err != nil {
				return err
			}
			copied += k
			return tx.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::int8", lsn).Scan(&wal)
		})
		if err != nil {
			return copied, fmt.Errorf("copy permanent keys out of %s, pages %d to %d: %w", p, from, from+n, err)
		}
		m.Throttle.Wrote(float64(wal))
		perPage = max(float64(wal)/float64(n), 1)
		m.Logger.Debug("partitions: permanent keys copied ahead of the drop", "table", t.Name, "partition", p.String(),
			"pages", fmt.Sprintf("%d-%d of %d", from, from+n, pages), "wal_bytes", wal, "took", time.Since(began).Round(time.Millisecond))
		from += n
	}
	return copied, nil
}
