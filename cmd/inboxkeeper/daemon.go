package main

import (
	"context"
	"fmt"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
)

// daemon is `inboxkeeper run`: passes on a schedule that never overlap, one
// active instance per database, metrics on a listener, nothing done against
// a standby, and a clean stop on SIGTERM. The passes are pass.Daemon's,
// scheduled by pass.Schedule.
func (a *app) daemon(ctx context.Context, args []string) error {
	fs := a.newFlags("run")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	sched := pass.Schedule{Interval: a.Cfg.Interval, PolicyFile: a.Cfg.PolicyFile, Reload: a.ReloadPolicy, Log: a.Log}
	if a.Cfg.Schedule != "" {
		s, err := config.ParseSchedule(a.Cfg.Schedule)
		if err != nil {
			return pass.ConfigError{Err: fmt.Errorf("INBOXKEEPER_SCHEDULE: %v", err)}
		}
		sched.Cron = s
	}
	ms := pass.NewMetrics(true, thisBuild().Short())
	if a.Cfg.MetricsAddr != "" {
		ms.Live = true
		stopServer, err := ms.Serve(a.Cfg.MetricsAddr, a.Log)
		if err != nil {
			return err
		}
		defer stopServer()
	}

	pool, tables, err := a.PrepareWithRetry(ctx, ms)
	if err != nil || ctx.Err() != nil {
		return err
	}
	// One log of the database's outages for the passes, the lease and the
	// throttle: while the database does not answer, that is said once, not
	// by each of them at every attempt.
	outages := outage.New(nil)
	th, err := a.StartThrottle(ctx, pool, ms.ThrottleMetrics(), outages)
	if err != nil {
		return err
	}
	defer th.Stop()
	// A standby's password can change while the daemon runs: say it once
	// here, plainly; the throttle holds for that standby until it connects.
	errs, _ := a.CheckReplicas(ctx) // one that does not answer is said by the throttle
	for _, err := range errs {
		a.Log.Error("inboxkeeper: " + err.Error() + "; batches wait until it connects (fail closed)")
	}
	ls := lease.New(pool, a.Cfg.LeaseTTL, a.Log)
	ls.Outages = outages
	ls.Publish(settings.Publish(a.Cfg)) // status and settings read the daemon's environment there
	defer ls.Start(ctx)()

	a.Log.Info("inboxkeeper: running", "tables", len(tables), "interval", a.Cfg.Interval, "schedule", a.Cfg.Schedule,
		"database", config.RedactURL(a.Cfg.DatabaseURL), "instance", ls.Name())
	w := a.Wiring(pool, false, ms, render.Progress(a.stderr, a.Log))
	w.Throttle = th
	d := pass.NewDaemon(&pass.Driver{Env: a.Cfg, Wiring: w}, ls, outages)
	d.Use(tables)
	sched.Run(ctx, d)
	return nil
}
