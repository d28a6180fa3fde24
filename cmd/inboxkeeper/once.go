package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/app/setup"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
)

func (a *app) once(ctx context.Context, args []string) error {
	fs := a.newFlags("once")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted; delete nothing")
	metricsFile := fs.String("metrics-file", "", "write the pass's metrics to this file, in the node_exporter textfile format (written whole, by rename)")
	gateway := fs.String("pushgateway", "", "push the pass's metrics to this Prometheus Pushgateway (http://host:9091), job inboxkeeper")
	pushInstance := fs.String("push-instance", "", "the instance label of the pushed metrics (default: the database, host:port/name, the same from run to run); a name of your own, such as the CronJob's, must stay the same too")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	if *pushInstance != "" && *gateway == "" {
		return pass.Usagef("once: --push-instance names the instance at a Pushgateway; give --pushgateway too")
	}
	// Checked before the pass: found only when exporting, a bad value
	// failed a pass that had already deleted rows.
	if *dryRun && (*metricsFile != "" || *gateway != "") {
		return pass.Usagef("once: --dry-run writes nothing, and exports no metrics: they would replace the real pass's (its last success, its passes) where they are read; leave out --metrics-file and --pushgateway")
	}
	if err := pass.CheckExport(*metricsFile, *gateway); err != nil {
		return err
	}
	var ms *pass.Metrics
	if *metricsFile != "" || *gateway != "" {
		ms = pass.NewMetrics(false, thisBuild().Short())
	}
	pool, tables, err := a.preparePrimary(ctx)
	if err != nil || pool == nil {
		return err
	}
	// A dry run checks everything the real run checks before it starts (it
	// is how a change is tried): the partition DDL's session, the throttle's
	// query, the standbys; the pass checks the permanent key tables.
	if err := a.SessionForPartitions(ctx, tables); err != nil {
		return err
	}
	if err := a.Preflight(ctx, pool, *dryRun); err != nil {
		return err
	}
	failed, total, err := a.Once(ctx, pool, a.driver(pool, tables, *dryRun, ms), *dryRun, render.Waiting(a.Log, a.Cfg.RunTime))
	if ms != nil && ctx.Err() == nil {
		// Also after a failed pass: the metrics say it failed.
		instance := *pushInstance
		if instance == "" {
			instance = pass.PushInstance(a.Cfg.DatabaseURL)
		}
		if xerr := ms.Export(ctx, *metricsFile, *gateway, instance); xerr != nil {
			return errors.Join(err, xerr)
		}
	}
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tables failed (see the log)", failed, total)
	}
	return nil
}

// preparePrimary is setup.PreparePrimary, saying so against a standby.
func (a *app) preparePrimary(ctx context.Context) (*pgxpool.Pool, []*catalog.Table, error) {
	pool, tables, err := a.PreparePrimary(ctx)
	if err == nil && pool == nil {
		a.say(setup.OnStandby)
	}
	return pool, tables, err
}

// driver is the pass driver of once and the demo: a line per table and
// step on stdout as each step ends, and the progress of long ones.
func (a *app) driver(pool *pgxpool.Pool, tables []*catalog.Table, dryRun bool, ms *pass.Metrics) *pass.Driver {
	d := &pass.Driver{Env: a.Cfg, Wiring: a.Wiring(pool, dryRun, ms, render.Progress(a.stderr, a.Log)),
		AfterStage: func(stage string, rs []pass.TableResult) { render.Stage(a.stdout, a.stderr, stage, rs, dryRun) }}
	d.Use(tables)
	return d
}
