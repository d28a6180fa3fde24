package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

// demoSchema is the sample inbox: 200k rows first seen over the last 100
// days, each remembered for 50 days, so about half are due.
const demoSchema = `
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     uuid        NOT NULL,
    payload_hash   bytea       NOT NULL,
    outcome        text        NOT NULL,
    event_time     timestamptz NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX consumer_inbox_remember_until_idx ON public.consumer_inbox (remember_until);
INSERT INTO public.consumer_inbox
SELECT (ARRAY['billing','payments','shipping','email'])[1 + i % 4],
       md5(i::text)::uuid,
       decode(md5('payload' || i), 'hex'),
       'applied',
       now() - interval '100 days' + (i * interval '100 days' / 200000) - interval '5 minutes',
       now() - interval '100 days' + (i * interval '100 days' / 200000),
       now() - interval '50 days'  + (i * interval '100 days' / 200000)
FROM generate_series(1, 200000) AS i;
ANALYZE public.consumer_inbox;
`

const demoPolicy = `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    expires_at: remember_until
`

func (a *app) demo(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return usagef("demo takes no arguments")
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
	fmt.Fprintln(a.stdout, "demo: creating public.consumer_inbox with 200000 rows over 100 days...")
	if _, err := conn.Exec(ctx, demoSchema); err != nil {
		return fmt.Errorf("demo: sample inbox: %w", err)
	}
	fmt.Fprintf(a.stdout, "demo: policy file %s:\n%s", a.cfg.PolicyFile, demoPolicy)

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
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return err
	}
	from, to := now.Add(-90*24*time.Hour), now.Add(-80*24*time.Hour)
	replayID, err := holds.StartReplay(ctx, pool, t, holds.ReplaySpec{Scope: "shipping", From: from, To: to, Owner: "ops@example.com"})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "demo: replay %d keeps consumer \"shipping\" events from %s to %s\n", replayID, from.Format(time.DateOnly), to.Format(time.DateOnly))

	fmt.Fprintln(a.stdout, "\ndemo: status before the pass")
	d := a.deleter(pool, tables, false, nil, nil, func(p expiry.Progress) {
		fmt.Fprintf(a.stdout, "  %s: %d rows deleted in %d batches (%.0f rows/s)\n", p.Table, p.Deleted, p.Batches,
			float64(p.Deleted)/max(p.Elapsed.Seconds(), 1e-9))
	})
	if err := printStatus(ctx, a, d, tables); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\ndemo: one pass, batches starting at %d rows and adapting toward %s each\n", a.cfg.BatchSize, a.cfg.BatchTarget)
	results, err := d.RunPass(ctx)
	if printResults(a.stdout, results, false) > 0 || err != nil {
		return fmt.Errorf("demo: the pass failed: %v", err)
	}
	fmt.Fprintln(a.stdout, "\ndemo: status after the pass")
	if err := printStatus(ctx, a, d, tables); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\ndemo: done in %s\n", time.Since(started).Round(100*time.Millisecond))
	return nil
}

func printStatus(ctx context.Context, a *app, d *expiry.Deleter, tables []*catalog.Table) error {
	for _, t := range tables {
		st, err := d.Status(ctx, t)
		if err != nil {
			return err
		}
		writeStatus(a.stdout, st)
	}
	return nil
}
