package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/retention"
)

// Execer is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// InstallRule writes the rule the claim path uses for one table (schema and
// name as the catalog spells them) and consumer scope, replacing the one
// before. A duplicate's remember_until is only extended when the rule's
// extension allows it.
func InstallRule(ctx context.Context, db Execer, schema, table string, r retention.Rule) error {
	micros := func(d int64) *int64 {
		if d == 0 {
			return nil
		}
		return &d
	}
	var by, cap *int64
	if r.Extension.OnDuplicate {
		by, cap = micros(r.Extension.By.Microseconds()), micros(r.Extension.Cap.Microseconds())
	}
	_, err := db.Exec(ctx, `
INSERT INTO inboxkeeper.retention_rules AS r (schema_name, table_name, scope, post_receipt, replay, deadline, margin,
    extend_on_duplicate, extend_by, extension_cap, applied_at)
VALUES ($1, $2, $3, $4 * interval '1 microsecond', $5 * interval '1 microsecond', $6, $7 * interval '1 microsecond',
    $8, $9 * interval '1 microsecond', $10 * interval '1 microsecond', now())
ON CONFLICT (schema_name, table_name, scope) DO UPDATE SET
    post_receipt = excluded.post_receipt, replay = excluded.replay, deadline = excluded.deadline,
    margin = excluded.margin, extend_on_duplicate = excluded.extend_on_duplicate,
    extend_by = excluded.extend_by, extension_cap = excluded.extension_cap, applied_at = now()`,
		schema, table, r.Scope, micros(r.PostReceipt.Microseconds()), micros(r.Replay.Microseconds()), r.Deadline,
		r.Margin.Microseconds(), r.Extension.OnDuplicate, by, cap)
	if err != nil {
		return fmt.Errorf("install the retention rule of %s.%s scope %q: %w", schema, table, r.Scope, err)
	}
	return nil
}
