package partitions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
)

// dropDetached settles the control schema's records: a detach that a dead
// pass started is found, and every partition detached for longer than
// detached_retention is dropped, its permanent keys copied out first in the
// same transaction, unless a hold or replay covers a row of it.
func (m *Manager) dropDetached(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	type rec struct {
		schema, name  string
		lower, upper  time.Time
		started       time.Time
		detachedAt    *time.Time
		exists, child bool
	}
	rows, err := m.pool.Query(ctx, `
SELECT r.partition_schema, r.partition_name, r.lower_bound, r.upper_bound, r.detach_started, r.detached_at,
       c.oid IS NOT NULL, EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
FROM inboxkeeper.partitions r
LEFT JOIN pg_namespace n ON n.nspname = r.partition_schema
LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = r.partition_name
WHERE r.table_name = $1 AND r.dropped_at IS NULL
ORDER BY r.upper_bound`, t.Name)
	if err != nil {
		return fmt.Errorf("read detached partitions: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rec, error) {
		var x rec
		err := r.Scan(&x.schema, &x.name, &x.lower, &x.upper, &x.started, &x.detachedAt, &x.exists, &x.child)
		return x, err
	})
	if err != nil {
		return fmt.Errorf("read detached partitions: %w", err)
	}
	keep := t.Policy.Partitions.DetachedRetention
	for _, r := range recs {
		p := Partition{Schema: r.schema, Name: r.name}
		key := []any{r.schema, r.name, r.started}
		switch {
		case !r.exists:
			m.Logger.Warn("partitions: a detached partition is gone (dropped by hand?)", "table", t.Name, "partition", p.String())
			if !m.DryRun {
				if _, err := m.pool.Exec(ctx, `UPDATE inboxkeeper.partitions SET dropped_at = $4
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now)...); err != nil {
					return err
				}
			}
			continue
		case r.detachedAt == nil && r.child:
			// Still attached (the retire step finishes pending ones), or
			// its detach failed before phase one: nothing to drop.
			if !m.DryRun {
				if _, err := m.pool.Exec(ctx, `DELETE FROM inboxkeeper.partitions r WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3
AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = to_regclass(quote_ident($1) || '.' || quote_ident($2)) AND NOT i.inhdetachpending)`, key...); err != nil {
					return err
				}
			}
			continue
		case r.detachedAt == nil:
			// Detached by a pass that died before recording it.
			if !m.DryRun {
				if _, err := m.pool.Exec(ctx, `UPDATE inboxkeeper.partitions SET detached_at = $4
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now)...); err != nil {
					return err
				}
			}
			r.detachedAt = &now
		}
		dropAt := r.detachedAt.Add(keep)
		w := Detached{Schema: r.schema, Name: r.name, Lower: r.lower, Upper: r.upper, DetachedAt: r.detachedAt, DropAt: &dropAt}
		if dropAt.After(now) {
			res.Waiting = append(res.Waiting, w)
			continue
		}
		dropped, reason, detail, err := m.drop(ctx, t, p, key, now)
		if err != nil {
			var stop retry.StopError
			if errors.As(err, &stop) || ctx.Err() != nil {
				return err
			}
			reason, detail = blockedReason(err), err.Error()
		}
		if reason != "" {
			res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: reason, Detail: detail, Detached: true})
			res.Waiting = append(res.Waiting, w)
			continue
		}
		if dropped {
			res.Dropped = append(res.Dropped, p.String())
		}
	}
	return nil
}

// drop drops one detached partition in a transaction that first checks
// holds (under the fence) and copies the permanent keys out.
func (m *Manager) drop(ctx context.Context, t *catalog.Table, p Partition, key []any, now time.Time) (dropped bool, reason, detail string, err error) {
	if m.DryRun {
		reason, detail, err = m.covered(ctx, t, p.Ident(), now)
		return reason == "" && err == nil, reason, detail, err
	}
	var copied int64
	err = m.retrying(ctx, t, "drop "+p.String(), func() error {
		return m.ddl(ctx, t, "drop "+p.String(), func(c *pgxpool.Conn) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				// The DROP takes ACCESS EXCLUSIVE on the table's shards too.
				if err := m.toWorkers(ctx, tx, t); err != nil {
					return err
				}
				// Another instance may have dropped it meanwhile.
				var mine bool
				dropped, reason, detail = false, "", ""
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inboxkeeper.partitions
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3 AND dropped_at IS NULL FOR UPDATE)`, key...).Scan(&mine); err != nil || !mine {
					return err
				}
				if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", holds.FenceKey); err != nil {
					return err
				}
				var err error
				if reason, detail, err = coveredIn(ctx, tx, t, p.Ident(), now, m.txSettings()); err != nil || reason != "" {
					return err
				}
				// Copying keys reads the whole partition: no statement
				// timeout for it.
				if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', '0', true)"); err != nil {
					return err
				}
				if m.copyKeys != nil {
					if copied, err = m.copyKeys(ctx, tx, t, p.Ident()); err != nil {
						return fmt.Errorf("copy permanent keys out of %s: %w", p, err)
					}
				}
				if _, err := tx.Exec(ctx, "DROP TABLE "+p.Ident()); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE inboxkeeper.partitions SET dropped_at = $4, keys_copied = $5
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now, copied)...)
				dropped = err == nil
				return err
			})
		})
	})
	if err != nil || !dropped {
		return false, reason, detail, err
	}
	m.Logger.Info("partitions: dropped", "table", t.Name, "partition", p.String(), "permanent_keys_copied", copied)
	if mm := m.metrics; mm != nil {
		mm.Dropped.WithLabelValues(t.Name).Inc()
	}
	return true, "", "", nil
}
