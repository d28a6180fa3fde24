// Package demo is the sample database `inboxkeeper demo` works on: the
// recommended inbox table (inbox.PlainDDL) with a payload column, 200,000
// rows of which about half are due, and a table partitioned by month with an
// expired month; and the policy file for both. Daemon internals: the demo
// command uses it.
package demo

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/inbox"
)

//go:embed seed.sql
var seed string

// Policy is the demo's policy file: the recommended table's entry
// (inbox.PlainPolicy, as the README gives it) with tiers (payload kept 30
// days, then a permanent business key), and the partitioned table.
var Policy = inbox.PlainPolicy + `    tiers:
      hot_for: 30d
      anchor: first_seen_at
      payload_columns: [payload]
      permanent_key: {columns: [consumer, business_key], hash: payload_hash}
  - table: public.big_inbox
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
    partitions: {by: month, max_expiry: 60d, premake: 2, detached_retention: 0}
`

// Execer runs SQL: a connection or a pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Create creates and fills the sample tables, public.consumer_inbox and
// public.big_inbox.
func Create(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, inbox.PlainDDL+seed); err != nil {
		return fmt.Errorf("demo: sample inbox: %w", err)
	}
	return nil
}

// Analyze refreshes the planner's statistics of the sample inbox and its
// permanent key table, which the tier estimates come from: autovacuum would
// refresh them in a while, and the demo does not wait.
func Analyze(ctx context.Context, db Execer) error {
	_, err := db.Exec(ctx, "ANALYZE public.consumer_inbox, inboxkeeper.keys_public_consumer_inbox")
	return err
}
