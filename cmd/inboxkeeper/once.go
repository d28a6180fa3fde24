package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/render"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// preparePrimary is prepare for commands that change the database: against
// a standby it says so and returns a nil pool, and the command does nothing.
func (a *app) preparePrimary(ctx context.Context) (*pgxpool.Pool, []*catalog.Table, error) {
	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return nil, nil, err
	}
	if standby, err := dbconn.InRecovery(ctx, pool); err != nil {
		return nil, nil, err
	} else if standby {
		fmt.Fprintln(a.stdout, "the database is a standby (in recovery): nothing to do here; run inboxkeeper against the primary")
		return nil, nil, nil
	}
	return pool, tables, nil
}

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
		return usagef("once: --push-instance names the instance at a Pushgateway; give --pushgateway too")
	}
	// Checked before the pass: found only when exporting, a bad value
	// failed a pass that had already deleted rows.
	if *dryRun && (*metricsFile != "" || *gateway != "") {
		return usagef("once: --dry-run writes nothing, and exports no metrics: they would replace the real pass's (its last success, its passes) where they are read; leave out --metrics-file and --pushgateway")
	}
	if err := checkGateway(*gateway); err != nil {
		return err
	}
	if err := checkMetricsFile(*metricsFile); err != nil {
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
	// query; the pass checks the permanent key tables.
	if err := a.sessionForPartitions(ctx, tables); err != nil {
		return err
	}
	if err := a.checkThrottleQuery(ctx, pool); err != nil {
		return err
	}
	errs, unread := a.checkReplicas(ctx)
	if len(errs) > 0 {
		return configError{errors.Join(errs...)}
	}
	a.warnUnread(unread, *dryRun)
	d := a.driver(pool, tables, *dryRun, ms)
	if !*dryRun {
		ls, keep, err := a.takeLease(ctx, pool, "nothing deleted")
		if err != nil {
			return err
		}
		defer keep()
		d.Lease = ls.Check
		if d.Throttle, err = a.startThrottle(ctx, pool, ms.ThrottleMetrics(), nil); err != nil {
			return err
		}
		defer d.Throttle.Stop()
		// A pass held back (pause --for 1h) says so, and for how long, now
		// and every minute, rather than going quiet.
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			pass.WatchWaits(wctx, d.Throttle, pool, time.Minute, render.Waiting(a.log, a.cfg.RunTime))
		}()
		// The throttle stops first: the watch waits for its first reading,
		// and what the throttle would start after it must not start only
		// to be cancelled mid-statement (pgx waits 100 ms after that).
		defer func() { stopWatch(); d.Throttle.Stop(); <-watched }()
	}
	pctx, stopPass := context.WithCancelCause(ctx)
	defer stopPass(nil)
	if d.Throttle != nil {
		// A standby the throttle cannot read holds every batch (fail
		// closed): at most REPLICA_WAIT, then the pass stops and once
		// fails, rather than wait for ever or end as a success.
		go pass.GiveUpOnStandbys(pctx, d.Throttle, a.cfg.ReplicaWait, func(r throttle.Reading) {
			stopPass(standbyUnread{r, a.cfg.ReplicaWait})
		})
	}
	failed, total, err := d.Once(pctx)
	var unreadErr standbyUnread
	if errors.As(context.Cause(pctx), &unreadErr) {
		err = unreadErr
	} else if r, ok := unreadStandby(d); ok && err == nil {
		// The pass ended (RUN_TIME) while the standby held it back.
		err = standbyUnread{reading: r}
	}
	if ms != nil && ctx.Err() == nil {
		// Also after a failed pass: the metrics say it failed.
		instance := *pushInstance
		if instance == "" {
			instance = pushInstanceOf(a.cfg.DatabaseURL)
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

// takeLease waits for the lease, RUN_TIME at most (a cron job must end
// within its slot), and keeps it until keep's returned function is called;
// nothing says what was not done when another instance held it throughout.
func (a *app) takeLease(ctx context.Context, pool *pgxpool.Pool, nothing string) (ls *lease.Lease, keep func(), err error) {
	ls = lease.New(pool, a.cfg.LeaseTTL, a.log)
	ls.Publish(settings.Publish(a.cfg)) // status and settings read this environment there
	// RUN_TIME bounds the wait too: a cron job must end within its slot.
	var held lease.ErrHeld
	if err := ls.Wait(ctx, a.cfg.RunTime); errors.As(err, &held) {
		return nil, nil, fmt.Errorf("another instance (%s) held the lease for the whole INBOXKEEPER_RUN_TIME (%s); %s", held.Holder.Name, humantime.Format(held.For), nothing)
	} else if err != nil {
		return nil, nil, err
	}
	return ls, ls.Start(ctx), nil
}

// driver is the pass driver of once and the demo: a line per table and
// step on stdout as each step ends, and the progress of long ones.
func (a *app) driver(pool *pgxpool.Pool, tables []*catalog.Table, dryRun bool, ms *pass.Metrics) *pass.Driver {
	d := &pass.Driver{Env: a.cfg, Wiring: a.wiring(pool, dryRun, ms, render.Progress(a.stderr, a.log)),
		AfterStage: func(stage string, rs []pass.TableResult) { render.Stage(a.stdout, a.stderr, stage, rs, dryRun) }}
	d.Use(tables)
	return d
}

// wiring is what the services of a pass share.
func (a *app) wiring(pool *pgxpool.Pool, dryRun bool, ms *pass.Metrics, progress func(expiry.Progress)) pass.Wiring {
	return pass.Wiring{Pool: pool, DDLPool: a.ddl, Log: a.log, DryRun: dryRun, Metrics: ms, Progress: progress}
}

// checkGateway refuses a --pushgateway that is not an http(s) URL with a
// host ("host:9091" is http://host:9091, as the push client reads it).
func checkGateway(gateway string) error {
	if gateway == "" {
		return nil
	}
	raw := gateway
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Hostname() == "") {
		err = errors.New("want http://host:port")
	}
	if err != nil {
		return usagef("once: --pushgateway %q: %v", gateway, err)
	}
	return nil
}

// checkMetricsFile refuses a --metrics-file whose directory does not exist
// or cannot take the temporary file it is written through.
func checkMetricsFile(path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return usagef("once: --metrics-file %s is a directory; name a file in it", path)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".inboxkeeper-check-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return usagef("once: --metrics-file %s: cannot write in %s: %v", path, dir, err)
	}
	_ = f.Close()
	_ = os.Remove(f.Name())
	return nil
}

// pushInstanceOf names the series of the database at url at a
// Pushgateway, where each push replaces the last of the same name: the
// database (host:port/name, never a user or password) is the same from
// run to run, where a host name is not (a Job's pod has a new one every
// run, and each would leave a group behind whose last success goes stale).
func pushInstanceOf(url string) string {
	c, err := pgconn.ParseConfig(url)
	if err != nil || c.Host == "" {
		return "inboxkeeper"
	}
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}

// checkReplicas connects once to each INBOXKEEPER_REPLICA_URLS entry. A
// connection refused for a reason of the configuration's (a password, a
// grant, a database's name, a certificate not trusted, a CA file that
// cannot be read) is a configuration error, naming the entry: a one-shot
// pass would otherwise wait on that standby. A standby that does not
// answer is unread: the throttle holds for it (fail closed), in once for
// at most REPLICA_WAIT.
func (a *app) checkReplicas(ctx context.Context) (errs, unread []error) {
	for i, u := range a.cfg.ReplicaURLs {
		cctx, cancel := context.WithTimeout(ctx, a.cfg.HeartbeatInterval*4+time.Second)
		conn, err := dbconn.Dial(cctx, u, dbconn.AppName(a.command))
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			continue
		}
		if ctx.Err() != nil {
			return errs, unread
		}
		err = fmt.Errorf("INBOXKEEPER_REPLICA_URLS entry %d: %w", i+1, err)
		if dbconn.IsConfigError(err) {
			errs = append(errs, err)
		} else {
			unread = append(unread, err)
		}
	}
	return errs, unread
}

// warnUnread says which listed standbys do not answer as once starts, and
// what the pass does about it: a dry run warns of what the real run would
// do, rather than end as if nothing were in the way.
func (a *app) warnUnread(unread []error, dryRun bool) {
	for _, err := range unread {
		switch {
		case a.cfg.ReplicaFailOpen:
			a.log.Warn("inboxkeeper: a listed standby does not answer; batches go on without it (INBOXKEEPER_REPLICA_FAIL_OPEN)", "error", err)
		case dryRun:
			a.log.Warn("inboxkeeper: a listed standby does not answer; the real run holds every batch for it (fail closed) and fails (exit 1) if it still does not after INBOXKEEPER_REPLICA_WAIT",
				"replica_wait", a.cfg.ReplicaWait, "error", err)
		default:
			a.log.Warn("inboxkeeper: a listed standby does not answer; every batch waits for it (fail closed), at most INBOXKEEPER_REPLICA_WAIT, then once fails (exit 1)",
				"replica_wait", a.cfg.ReplicaWait, "error", err)
		}
	}
}

// standbyUnread is a pass of once that a standby it could not read held
// back: for REPLICA_WAIT (wait set), or until the pass ended. Exit 1.
type standbyUnread struct {
	reading throttle.Reading
	wait    time.Duration
}

func (e standbyUnread) Error() string {
	what := "the pass ended while a standby could not be read"
	if e.wait > 0 {
		what = "a standby could not be read for " + humantime.Format(e.wait) + " (INBOXKEEPER_REPLICA_WAIT); the pass stopped"
	}
	return what + ": " + e.reading.String() + "; every batch waits for it (fail closed): make it readable, take it out of INBOXKEEPER_REPLICA_URLS, or set INBOXKEEPER_REPLICA_FAIL_OPEN=true"
}

// unreadStandby is the standby that holds d's pass back, if any.
func unreadStandby(d *pass.Driver) (throttle.Reading, bool) {
	if d.Throttle == nil {
		return throttle.Reading{}, false
	}
	return pass.UnreadStandby(d.Throttle)
}

// checkThrottleQuery runs INBOXKEEPER_THROTTLE_QUERY once: one that fails
// is a configuration error.
func (a *app) checkThrottleQuery(ctx context.Context, pool *pgxpool.Pool) error {
	if a.cfg.ThrottleQuery != "" {
		if err := throttle.CheckQuery(ctx, pool, a.cfg.ThrottleQuery); err != nil && ctx.Err() == nil {
			return configError{err}
		}
	}
	return nil
}

// startThrottle starts the throttle's collectors, after checking its query;
// the caller stops them. Its failures that are only the database not
// answering are part of outages' outage of it, when set (run).
func (a *app) startThrottle(ctx context.Context, pool *pgxpool.Pool, m *throttle.Metrics, outages *outage.Log) (*throttle.Throttler, error) {
	if err := a.checkThrottleQuery(ctx, pool); err != nil {
		return nil, err
	}
	t := pass.NewThrottle(ctx, pool, a.cfg, a.log, m)
	t.ShareOutages(outages)
	t.Start(ctx)
	return t, nil
}
