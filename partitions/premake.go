package partitions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// horizon is the end of the months that must exist at now: the month of
// the furthest expiry a new row can carry, then Premake more.
func horizon(t *catalog.Table, now time.Time) time.Time {
	p := t.Policy.Partitions
	return monthStart(now.Add(p.MaxExpiry)).AddDate(0, p.Premake+1, 0)
}

// premake creates a partition for every month from now's month to the
// horizon that no partition covers yet. A month partly covered by a
// partition made by hand gets one for the rest only.
func (m *Manager) premake(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	parts, err := readPartitions(ctx, m.pool, t, m.txSettings())
	if err != nil {
		return err
	}
	end := horizon(t, now)
	for ms := monthStart(now); ms.Before(end); ms = nextMonth(ms) {
		for _, g := range gaps(parts, ms, nextMonth(ms)) {
			name, err := m.freeName(ctx, t, ms)
			if err != nil {
				return err
			}
			p := Partition{Schema: t.Policy.Name.Schema, Name: name, Lower: &g[0], Upper: &g[1]}
			if m.DryRun {
				res.Created = append(res.Created, p.String())
				parts = append(parts, p)
				continue
			}
			sql := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%s) TO (%s)",
				p.Ident(), t.Ident, literal(t.Expiry, g[0]), literal(t.Expiry, g[1]))
			err = m.ddlTx(ctx, t, "create "+p.String(), false, func(tx pgx.Tx) error {
				// The new partition belongs to the parent's owner, as
				// one made by hand would, when the daemon's role is a
				// member of it (which creating a partition requires).
				var owner string
				err := tx.QueryRow(ctx, `SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
WHERE c.oid = $1 AND r.rolname <> current_user AND pg_has_role(current_user, r.oid, 'MEMBER')`, t.OID).Scan(&owner)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) {
					return err
				}
				if owner == "" || !t.Distributed() {
					if owner != "" {
						if _, err := tx.Exec(ctx, `SELECT set_config('role', $1, true)`, owner); err != nil {
							return err
						}
					}
					_, err = tx.Exec(ctx, sql)
					return err
				}
				// On Citus the partition is created as the daemon's
				// role and then given away: under the owner's role
				// Citus would connect to the workers as the owner,
				// which need not be allowed to log in.
				if _, err := tx.Exec(ctx, sql); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s OWNER TO %s", p.Ident(), pgx.Identifier{owner}.Sanitize()))
				return err
			})
			if raced(err) {
				// Another instance (or a DBA) made it meanwhile: look again.
				m.Logger.Info("partitions: partition appeared meanwhile", "table", t.Name, "partition", p.String(), "error", err)
				if parts, err = readPartitions(ctx, m.pool, t, m.txSettings()); err != nil {
					return err
				}
				if len(gaps(parts, g[0], g[1])) > 0 {
					return fmt.Errorf("create %s for [%s, %s): another table is in the way", p, g[0].Format(time.RFC3339), g[1].Format(time.RFC3339))
				}
				continue
			}
			if err != nil {
				return err
			}
			m.Logger.Info("partitions: created", "table", t.Name, "partition", p.String(), "from", g[0], "to", g[1])
			res.Created = append(res.Created, p.String())
			parts = append(parts, p)
			if mm := m.metrics; mm != nil {
				mm.Created.WithLabelValues(t.Name).Inc()
			}
		}
	}
	return nil
}

// raced reports an error a concurrent creator causes: the name is taken, or
// the range now overlaps a partition.
func raced(err error) bool {
	code := retry.Code(err)
	return code == retry.SQLStateDuplicateTable || code == retry.SQLStateInvalidDefinition
}

// freeName is <table>_pYYYYMM, or with a _2, _3… suffix when a table of
// that name exists (a month partly covered by hand-made partitions).
func (m *Manager) freeName(ctx context.Context, t *catalog.Table, month time.Time) (string, error) {
	base := catalog.PartitionName(t.Policy.Name.Name, month.Format("200601"))
	for i := 1; i < 10; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s_%d", base, i)
		}
		if len(name) > catalog.MaxIdentifierBytes {
			break
		}
		var taken bool
		if err := m.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2)`, t.Policy.Name.Schema, name).Scan(&taken); err != nil {
			return "", err
		}
		if !taken {
			return name, nil
		}
	}
	return "", fmt.Errorf("no free name for the partition of %s in %s: %s and its numbered variants are taken", t.Name, month.Format("2006-01"), base)
}
