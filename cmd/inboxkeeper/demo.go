package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

// demoSchema is the sample inbox: 200k rows first seen over the last 100
// days, each remembered for 50 days, so about half are due; payload kept 30
// days. And a partitioned inbox with a month that expired two months ago.
const demoSchema = `
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     uuid        NOT NULL,
    payload_hash   bytea       NOT NULL,
    outcome        text        NOT NULL,
    event_time     timestamptz NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL,
    business_key   text        NOT NULL,
    payload        jsonb,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX consumer_inbox_remember_until_idx ON public.consumer_inbox (remember_until);
CREATE INDEX consumer_inbox_hot_idx ON public.consumer_inbox (first_seen_at) WHERE payload IS NOT NULL;
INSERT INTO public.consumer_inbox
SELECT (ARRAY['billing','payments','shipping','email'])[1 + i % 4],
       md5(i::text)::uuid,
       decode(md5('payload' || i), 'hex'),
       'applied',
       now() - interval '100 days' + (i * interval '100 days' / 200000) - interval '5 minutes',
       now() - interval '100 days' + (i * interval '100 days' / 200000),
       now() - interval '50 days'  + (i * interval '100 days' / 200000),
       'order-' || i,
       jsonb_build_object('customer', 'c-' || (i % 977), 'amount', i % 1000)
FROM generate_series(1, 200000) AS i;
ANALYZE public.consumer_inbox;

CREATE TABLE public.big_inbox (
    consumer       text        NOT NULL,
    message_id     uuid        NOT NULL,
    remember_until timestamptz NOT NULL
) PARTITION BY RANGE (remember_until);
CREATE INDEX big_inbox_key_idx ON public.big_inbox (consumer, message_id);
DO $$
DECLARE m timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
BEGIN
  EXECUTE format('CREATE TABLE public.big_inbox_old PARTITION OF public.big_inbox FOR VALUES FROM (%L) TO (%L)', m - interval '2 months', m - interval '1 month');
  EXECUTE format('CREATE TABLE public.big_inbox_recent PARTITION OF public.big_inbox FOR VALUES FROM (%L) TO (%L)', m, m + interval '2 months');
END $$;
INSERT INTO public.big_inbox
SELECT 'billing', md5('old' || i)::uuid, date_trunc('month', now()) - interval '45 days' + i * interval '1 second' FROM generate_series(1, 30000) i;
INSERT INTO public.big_inbox
SELECT 'billing', md5('new' || i)::uuid, now() + interval '20 days' + i * interval '1 second' FROM generate_series(1, 10000) i;
`

// demoPolicy is the recommended inbox table's policy (inbox.PlainPolicy, as
// the README gives it), tiered, and a partitioned table.
var demoPolicy = inbox.PlainPolicy + `    tiers:
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

func (a *app) demo(ctx context.Context, args []string) error {
	if err := a.noArgs("demo", args); err != nil {
		return err
	}
	started := time.Now()
	fmt.Fprintln(a.stdout, "demo: starting a throwaway PostgreSQL from the local server binaries...")
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return err
	}
	defer func() {
		c.Destroy()
		fmt.Fprintln(a.stdout, "demo: cluster removed")
	}()
	fmt.Fprintf(a.stdout, "demo: PostgreSQL listening on 127.0.0.1:%d (data in %s)\n", c.Port, c.DataDir)

	policyDir, err := os.MkdirTemp("", "inboxkeeper-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(policyDir)
	a.cfg.PolicyFile = filepath.Join(policyDir, "inboxkeeper.yaml")
	if err := os.WriteFile(a.cfg.PolicyFile, []byte(demoPolicy), 0o644); err != nil {
		return err
	}
	a.cfg.DatabaseURL = c.URL("postgres")

	conn, err := pgx.Connect(ctx, a.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := migrations.Migrate(ctx, conn); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "demo: creating public.consumer_inbox with 200000 rows over 100 days, and public.big_inbox partitioned by month...")
	if _, err := conn.Exec(ctx, demoSchema); err != nil {
		return fmt.Errorf("demo: sample inbox: %w", err)
	}
	fmt.Fprintf(a.stdout, "demo: policy file %s:\n%s", a.cfg.PolicyFile, demoPolicy)
	a.migrateKeyTables(ctx, conn)

	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return err
	}
	t := tables[0]
	payments := "payments"
	holdID, err := holds.AddHold(ctx, pool, t, holds.HoldSpec{Scope: &payments, Reason: "legal hold: dispute 4711", Owner: "legal@example.com"})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "demo: hold %d keeps every row of consumer \"payments\"\n", holdID)
	now, err := dbconn.Now(ctx, pool)
	if err != nil {
		return err
	}
	from, to := now.Add(-90*24*time.Hour), now.Add(-80*24*time.Hour)
	replayID, err := holds.StartReplay(ctx, pool, t, holds.ReplaySpec{Scope: "shipping", From: from, To: to, Owner: "ops@example.com"})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "demo: replay %d keeps consumer \"shipping\" events from %s to %s\n", replayID, from.Format(time.DateOnly), to.Format(time.DateOnly))

	fmt.Fprintln(a.stdout, "\ndemo: status before the pass")
	if err := a.demoStatus(ctx, pool, tables); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\ndemo: one pass (partitions, then demotion, then deletion), batches starting at %d rows and adapting toward %s each\n",
		a.cfg.BatchSize, a.cfg.BatchTarget)
	failed, _, err := a.onePass(ctx, pool, tables, false, nil, nil, func(p expiry.Progress) {
		fmt.Fprintf(a.stdout, "  %s: %d rows deleted in %d batches (%.0f rows/s)\n", p.Table, p.Deleted, p.Batches,
			float64(p.Deleted)/max(p.Elapsed.Seconds(), 1e-9))
	}, nil)
	if failed > 0 || err != nil {
		return fmt.Errorf("demo: the pass failed: %v", err)
	}
	// The tier estimates come from the planner's statistics, which
	// autovacuum would refresh in a while; the demo does not wait.
	if _, err := pool.Exec(ctx, "ANALYZE public.consumer_inbox, inboxkeeper.keys_public_consumer_inbox"); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "\ndemo: status after the pass (after ANALYZE, for fresh tier estimates)")
	if err := a.demoStatus(ctx, pool, tables); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\ndemo: done in %s\n", time.Since(started).Round(100*time.Millisecond))
	return nil
}

func (a *app) demoStatus(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table) error {
	var rep statusReport
	if err := a.tableStatus(ctx, pool, tables, &rep); err != nil {
		return err
	}
	rep.writeTables(a.stdout, tables)
	return nil
}
