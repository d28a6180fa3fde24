package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/render"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/internal/sighup"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// daemon is `inboxkeeper run`: passes on a schedule that never overlap, one
// active instance per database, metrics on a listener, nothing done against
// a standby, and a clean stop on SIGTERM. The passes are pass.Daemon's;
// this schedules them and reloads the policy.
func (a *app) daemon(ctx context.Context, args []string) error {
	fs := a.newFlags("run")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	var sched cron.Schedule
	if a.cfg.Schedule != "" {
		s, err := config.ParseSchedule(a.cfg.Schedule)
		if err != nil {
			return configError{fmt.Errorf("INBOXKEEPER_SCHEDULE: %v", err)}
		}
		sched = s
	}
	ms := pass.NewMetrics(true, thisBuild().Short())
	if a.cfg.MetricsAddr != "" {
		ms.Live = true
		stopServer, err := ms.Serve(a.cfg.MetricsAddr, a.log)
		if err != nil {
			return err
		}
		defer stopServer()
	}

	pool, tables, err := a.prepareWithRetry(ctx, ms)
	if err != nil || ctx.Err() != nil {
		return err
	}
	if err := a.sessionForPartitions(ctx, tables); err != nil {
		return err
	}
	// One log of the database's outages for the passes, the lease and the
	// throttle: while the database does not answer, that is said once, not
	// by each of them at every attempt.
	outages := outage.New(nil)
	th, err := a.startThrottle(ctx, pool, ms.ThrottleMetrics(), outages)
	if err != nil {
		return err
	}
	defer th.Stop()
	// A standby's password can change while the daemon runs: say it once
	// here, plainly; the throttle holds for that standby until it connects.
	errs, _ := a.checkReplicas(ctx) // one that does not answer is said by the throttle
	for _, err := range errs {
		a.log.Error("inboxkeeper: " + err.Error() + "; batches wait until it connects (fail closed)")
	}
	ls := lease.New(pool, a.cfg.LeaseTTL, a.log)
	ls.Outages = outages
	ls.Publish(settings.Publish(a.cfg)) // status and settings read the daemon's environment there
	defer ls.Start(ctx)()

	a.log.Info("inboxkeeper: running", "tables", len(tables), "interval", a.cfg.Interval, "schedule", a.cfg.Schedule,
		"database", config.RedactURL(a.cfg.DatabaseURL), "instance", ls.Name())
	w := a.wiring(pool, false, ms, render.Progress(a.stderr, a.log))
	w.Throttle = th
	d := pass.NewDaemon(&pass.Driver{Env: a.cfg, Wiring: w}, ls, outages)
	d.Use(tables)
	loaded := policyDigest(a.cfg.PolicyFile)
	// reload re-reads the policy file: on SIGHUP, and before a pass when its
	// content changed (a ConfigMap volume updates in place). A policy that
	// fails its checks is not applied; the one in force stays.
	reload := func(why string) {
		loaded = policyDigest(a.cfg.PolicyFile)
		tables, err := a.reloadPolicy(ctx, pool)
		if err != nil {
			if ctx.Err() == nil {
				d.ReloadFailed()
				a.log.Error("inboxkeeper: the policy file cannot be applied; the policy in force stays", "trigger", why, "file", a.cfg.PolicyFile, "error", err)
			}
			return
		}
		d.Use(tables)
		a.log.Info("inboxkeeper: policy reloaded", "trigger", why, "file", a.cfg.PolicyFile, "tables", len(tables))
	}
	// A burst of SIGHUP (a reload sent by two tools, a loop) reloads once
	// and says so once.
	hups := sighup.Bursts(ctx, hupQuiet, hupMost)
	for {
		if policyDigest(a.cfg.PolicyFile) != loaded {
			reload("file changed")
		}
		start := time.Now()
		if err := d.Pass(ctx); err != nil {
			a.log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", true)
			return nil
		}
		if d.Changed() {
			continue // a runtime setting changed mid-pass: a new pass applies it now
		}
		next := start.Add(a.cfg.Interval)
		if sched != nil {
			next = sched.Next(time.Now())
		}
		timer := time.NewTimer(time.Until(next))
		// While it waits, the cleanup lag and rows_due keep up: rows fall due
		// between passes too.
		refresh := time.NewTicker(dueRefreshBetweenPasses)
	wait:
		select {
		case <-ctx.Done():
			timer.Stop()
			refresh.Stop()
			a.log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", false)
			return nil
		case <-hups:
			reload("SIGHUP")
			goto wait
		case <-refresh.C:
			d.Refresh(ctx)
			goto wait
		case <-timer.C:
		}
		refresh.Stop()
	}
}

// dueRefreshBetweenPasses is how often the daemon counts what is due while
// it waits for its next pass.
const dueRefreshBetweenPasses = 15 * time.Second

// A burst of SIGHUP is one reload: hupQuiet after the last of them, or
// hupMost after the first of a burst that goes on.
const (
	hupQuiet = 250 * time.Millisecond
	hupMost  = 2 * time.Second
)

// policyDigest fingerprints the policy file's content; "" when unreadable
// (a reload then says why).
func policyDigest(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// reloadPolicy loads and checks the policy file against the database, as
// at startup, without touching anything.
func (a *app) reloadPolicy(ctx context.Context, pool *pgxpool.Pool) ([]*catalog.Table, error) {
	p, err := a.loadPolicy()
	if err != nil {
		return nil, err
	}
	tables, err := catalog.ResolveAll(ctx, pool, p)
	if err != nil {
		return nil, err
	}
	if err := tiering.EnsureKeyTables(ctx, pool, tables, a.log); err != nil {
		return nil, err
	}
	if err := a.sessionForPartitions(ctx, tables); err != nil {
		return nil, err
	}
	catalog.WarnLocalTime(ctx, pool, tables, a.log)
	return tables, nil
}

// prepareWithRetry is prepare for a daemon: what is not there yet is
// waited for (pass.WaitForSetup), and the policy file is read again on
// every try, so a corrected ConfigMap is picked up. A bad environment or a
// policy file that does not parse still ends it (exit 2).
func (a *app) prepareWithRetry(ctx context.Context, ms *pass.Metrics) (pool *pgxpool.Pool, tables []*catalog.Table, err error) {
	err = pass.WaitForSetup(ctx, a.log, ms.Daemon.PolicyMismatch, func(err error) bool {
		// A connection refused for a reason of the configuration's is waited
		// for: a password, a grant or a database can change while it runs.
		var ce configError
		var ue usageError
		var conn *dbconn.ConnectError
		return (errors.As(err, &ce) || errors.As(err, &ue)) && !errors.As(err, &conn)
	}, func() error {
		if pool, tables, err = a.prepare(ctx); err != nil {
			return err
		}
		// A deletion writes its permanent keys in the same statement: the
		// key tables must exist before anything runs.
		return tiering.EnsureKeyTables(ctx, pool, tables, a.log)
	})
	if ctx.Err() != nil {
		return nil, nil, nil
	}
	return pool, tables, err
}
