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
	"github.com/inboxkeeper/inboxkeeper/internal/app/demo"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

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
	a.Cfg.PolicyFile = filepath.Join(policyDir, "inboxkeeper.yaml")
	if err := os.WriteFile(a.Cfg.PolicyFile, []byte(demo.Policy), 0o644); err != nil {
		return err
	}
	a.Cfg.DatabaseURL = c.URL("postgres")

	conn, err := pgx.Connect(ctx, a.Cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := migrations.Migrate(ctx, conn); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "demo: creating public.consumer_inbox with 200000 rows over 100 days, and public.big_inbox partitioned by month...")
	if err := demo.Create(ctx, conn); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "demo: policy file %s:\n%s", a.Cfg.PolicyFile, demo.Policy)
	a.MigrateKeyTables(ctx, conn, a.say)

	pool, tables, err := a.Prepare(ctx)
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
		a.Cfg.BatchSize, a.Cfg.BatchTarget)
	d := a.driver(pool, tables, false, nil)
	d.Progress = func(p expiry.Progress) {
		fmt.Fprintf(a.stdout, "  %s: %d rows deleted in %d batches (%.0f rows/s)\n", p.Table, p.Deleted, p.Batches,
			float64(p.Deleted)/max(p.Elapsed.Seconds(), 1e-9))
	}
	failed, _, err := d.Once(ctx)
	if failed > 0 || err != nil {
		return fmt.Errorf("demo: the pass failed: %v", err)
	}
	if err := demo.Analyze(ctx, pool); err != nil {
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
	st, err := pass.ReadTables(ctx, a.Wiring(pool, false, nil, nil), a.Cfg, tables)
	if err != nil {
		return err
	}
	render.StatusTables(a.stdout, st, tables, nil)
	return nil
}
