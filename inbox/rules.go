package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Rule is the retention rule of one table and consumer scope as the claim
// path applies it: a fresh claim's remember_until is
//
//	max(first_seen_at + PostReceipt, event_time + Replay, Deadline) + Margin
//
// where a zero horizon (or a nil Deadline) takes no part, and first_seen_at
// + Margin when none does. `inboxkeeper plan --apply` installs the rules of
// a policy's retention section; an application may install its own.
type Rule struct {
	Scope       string        // the consumer scope: a claim's Consumer
	PostReceipt time.Duration // 0: no horizon from the first receipt
	Replay      time.Duration // 0: no horizon from the event time
	Deadline    *time.Time    // nil: no fixed deadline
	Margin      time.Duration
	Extension   Extension
}

// Extension says whether a duplicate moves remember_until.
type Extension struct {
	// OnDuplicate: a duplicate moves remember_until to at least now + By,
	// never past first_seen_at + Cap. Both must then be set.
	OnDuplicate bool
	By, Cap     time.Duration
}

// Execer is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// InstallRule writes the rule the claim path uses for one table (schema and
// name as the catalog spells them) and consumer scope, replacing the one
// before. A duplicate's remember_until is only extended when the rule's
// extension allows it. The claim function is compiled again from the rules
// in the same transaction, which must be READ COMMITTED (or none: db a
// pool or a connection): claims in other sessions use the new rule from
// its commit on.
func InstallRule(ctx context.Context, db Execer, schema, table string, r Rule) error {
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

// InstalledRule is a retention rule as installed for the claim path, with
// its horizons (zero when a scenario is absent).
type InstalledRule struct {
	Schema, Table, Scope string
	PostReceipt, Replay  time.Duration
	HasPostReceipt       bool
	HasReplay            bool
	Margin               time.Duration
}

// Querier runs a query: *pgx.Conn, *pgxpool.Pool, pgx.Tx.
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// InstalledRules reads every installed rule (the daemon exports their
// horizons as metrics).
func InstalledRules(ctx context.Context, db Querier) ([]InstalledRule, error) {
	rows, err := db.Query(ctx, `SELECT schema_name, table_name, scope,
       extract(epoch FROM post_receipt)::float8, extract(epoch FROM replay)::float8, extract(epoch FROM margin)::float8
FROM inboxkeeper.retention_rules ORDER BY schema_name, table_name, scope`)
	if err != nil {
		return nil, fmt.Errorf("read the installed retention rules: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstalledRule, error) {
		var ir InstalledRule
		var post, replay *float64
		var margin float64
		err := r.Scan(&ir.Schema, &ir.Table, &ir.Scope, &post, &replay, &margin)
		secs := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		if post != nil {
			ir.PostReceipt, ir.HasPostReceipt = secs(*post), true
		}
		if replay != nil {
			ir.Replay, ir.HasReplay = secs(*replay), true
		}
		ir.Margin = secs(margin)
		return ir, err
	})
}

// LoadRule reads the rule installed for one table (schema and name as
// InstallRule was given them) and consumer scope; nil when none is
// installed.
func LoadRule(ctx context.Context, db Querier, schema, table, scope string) (*Rule, error) {
	rows, err := db.Query(ctx, `SELECT (extract(epoch FROM post_receipt) * 1e6)::int8, (extract(epoch FROM replay) * 1e6)::int8, deadline,
       (extract(epoch FROM margin) * 1e6)::int8, extend_on_duplicate,
       (extract(epoch FROM extend_by) * 1e6)::int8, (extract(epoch FROM extension_cap) * 1e6)::int8
FROM inboxkeeper.retention_rules WHERE schema_name = $1 AND table_name = $2 AND scope = $3`, schema, table, scope)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return nil, nil // no control schema yet (inboxkeeper migrate): nothing is installed
	}
	if err != nil {
		return nil, fmt.Errorf("read the installed retention rule of %s.%s scope %q: %w", schema, table, scope, err)
	}
	rules, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Rule, error) {
		r := Rule{Scope: scope}
		var post, replay, by, cap *int64
		var margin int64
		if err := row.Scan(&post, &replay, &r.Deadline, &margin, &r.Extension.OnDuplicate, &by, &cap); err != nil {
			return r, err
		}
		micros := func(p *int64) time.Duration {
			if p == nil {
				return 0
			}
			return time.Duration(*p) * time.Microsecond
		}
		if r.Deadline != nil {
			d := r.Deadline.UTC() // pgx reads timestamptz in the local zone; the policy's is UTC
			r.Deadline = &d
		}
		r.PostReceipt, r.Replay, r.Margin = micros(post), micros(replay), micros(&margin)
		r.Extension.By, r.Extension.Cap = micros(by), micros(cap)
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the installed retention rule of %s.%s scope %q: %w", schema, table, scope, err)
	}
	if len(rules) == 0 {
		return nil, nil
	}
	return &rules[0], nil
}
