package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// newFlags makes the flag set of command name ("once", "hold add").
func (a *app) newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {} // parseFlags prints help, to stdout, and errors
	return fs
}

// parseFlags parses a command's flags. -h or --help prints the command's
// usage with every flag on stdout and ends the command (exit 0); a bad flag
// is a usage error (exit 2).
func (a *app) parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(a.stdout, fs)
			return errHelpShown
		}
		return usagef("%s: %v (see inboxkeeper %s --help)", fs.Name(), err, fs.Name())
	}
	return nil
}

// parseInterleaved parses flags that may come before, between or after the
// command's arguments, and returns the arguments.
func (a *app) parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := a.parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// noArgs parses the flags of a command that takes none but --help.
func (a *app) noArgs(name string, args []string) error {
	fs := a.newFlags(name)
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("%s takes no arguments (got %q)", name, fs.Arg(0))
	}
	return nil
}

// wiring is what the services of one pass share: the pool, whether the
// pass is a dry run, the throttle, and the check that this instance still
// holds the lease (nil: always active).
type wiring struct {
	pool   *pgxpool.Pool
	dryRun bool
	th     *throttle.Throttler
	active func() error
}

// readOnly is the wiring of status and dry runs: no throttle, no lease.
func readOnly(pool *pgxpool.Pool) wiring { return wiring{pool: pool, dryRun: true} }

// batchSettings are the settings the deleter and the demoter share, from
// the configuration c (a.cfg, or a table's with its runtime settings).
func (a *app) batchSettings(c config.Config, w wiring) batchloop.Settings {
	b := service.Base{
		Active:           w.active,
		LockTimeout:      c.LockTimeout,
		StatementTimeout: c.StatementTimeout,
		IdleTimeout:      c.IdleTimeout,
		DryRun:           w.dryRun,
		Logger:           a.log,
	}
	if w.th != nil {
		b.Throttle = w.th
	}
	return batchloop.Settings{Base: b, Sizing: sizing(c), BatchSize: c.BatchSize, BatchPause: c.BatchPause, RunTime: c.RunTime}
}

// deleter builds the deleter of tables with the configuration c.
func (a *app) deleter(c config.Config, w wiring, tables []*catalog.Table, m *expiry.Metrics, progress func(expiry.Progress)) *expiry.Deleter {
	return expiry.New(w.pool, tables, expiry.Options{Settings: a.batchSettings(c, w), Metrics: m, Progress: progress})
}

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
	pushInstance := fs.String("push-instance", "", "the instance label of the pushed metrics (default: the host name); give a name that stays the same from run to run, such as the CronJob's")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("once: unexpected argument %q", fs.Arg(0))
	}
	if *pushInstance != "" && *gateway == "" {
		return usagef("once: --push-instance names the instance at a Pushgateway; give --pushgateway too")
	}
	var ms *metricSet
	if *metricsFile != "" || *gateway != "" {
		ms = newMetricSet(false)
	}
	pool, tables, err := a.preparePrimary(ctx)
	if err != nil || pool == nil {
		return err
	}
	if err := a.sessionForPartitions(ctx, tables, *dryRun); err != nil {
		return err
	}
	var th *throttle.Throttler
	var active func() error
	if !*dryRun {
		ls, release, err := a.waitForLease(ctx, pool)
		if err != nil {
			return err
		}
		defer release()
		active = ls.Check
		var reg prometheus.Registerer
		if ms != nil {
			reg = ms.reg
			ms.daemon.Active.Set(1)
		}
		if th, err = a.startThrottle(ctx, pool, reg); err != nil {
			return err
		}
		defer th.Stop()
	}
	failed, total, err := a.onePass(ctx, pool, tables, *dryRun, th, active, a.progressPrinter(), ms)
	if ms != nil && ctx.Err() == nil {
		// Also after a failed pass: the metrics say it failed.
		instance := *pushInstance
		if instance == "" {
			instance = instanceName()
		}
		if xerr := ms.export(ctx, *metricsFile, *gateway, instance); xerr != nil {
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

// onePass is what once does, and the demo: a pass (internal/pass) with a
// line per table and step on stdout as each step ends, with each table's
// configuration in force (runtime settings). A setting changed during the
// pass stops it before its next batch, and the pass starts again with it.
// It returns how many table steps failed, out of how many.
func (a *app) onePass(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, dryRun bool, th *throttle.Throttler,
	active func() error, progress func(expiry.Progress), ms *metricSet) (failed, total int, err error) {
	if !dryRun {
		// A deletion writes its permanent keys in the same statement: the
		// key tables must exist before anything runs.
		if err := a.ensureKeyTables(ctx, pool, tables); err != nil {
			return 0, 0, err
		}
	}
	for {
		tn, err := a.loadTuning(ctx, pool, tables)
		if err != nil {
			return 0, 0, configError{err}
		}
		watch := &settingsWatch{pool: pool, version: tn.version}
		applyLimits(th, tn.global)
		stages, _ := a.stages(pool, tables, tn, dryRun, ms, th, both(active, watch.check), progress)
		runner := pass.Runner{
			Stages:     stages,
			RunTime:    tn.global.RunTime,
			AfterStage: func(stage string, rs []pass.TableResult) { a.printStage(stage, rs, dryRun) },
		}
		res, err := runner.Run(ctx)
		if ms != nil {
			ms.passEnded(res)
		}
		f, _, n := res.Counts()
		failed, total = failed+f, total+n
		if err != nil || !watch.changed {
			return failed, total, err
		}
		a.log.Info("inboxkeeper: the runtime settings changed; the pass starts again with them")
	}
}

// printStage prints a line per table for one step of a pass.
func (a *app) printStage(stage string, rs []pass.TableResult, dryRun bool) {
	switch stage {
	case pass.StagePartitions:
		printPartitionResults(a.stdout, pass.Of[partitions.TableResult](rs), dryRun)
	case pass.StageTiering:
		printTierResults(a.stdout, pass.Of[tiering.Result](rs), dryRun)
	case pass.StageExpiry:
		if t, ok := a.stderr.(*terminal); ok {
			t.ClearBar()
		}
		printResults(a.stdout, pass.Of[expiry.TableResult](rs), dryRun)
	}
}

// progressPrinter shows a long pass is alive: on a terminal, a progress bar
// redrawn in place; otherwise a log line every few seconds.
func (a *app) progressPrinter() func(expiry.Progress) {
	if t, ok := a.stderr.(*terminal); ok {
		return progressBar(t)
	}
	return everyAtMost(3*time.Second, func(p expiry.Progress, rate float64) {
		args := []any{"table", p.Table, "deleted", p.Deleted, "batches", p.Batches, "rows_per_second", int64(rate)}
		if left := p.Estimate - p.Deleted; p.Estimate > 0 && left > 0 && rate > 0 {
			args = append(args, "rows_left", left, "time_left", time.Duration(float64(left)/rate*float64(time.Second)))
		}
		a.log.Info("expiry: progress", args...)
	})
}

// progressBar draws "table [#####.....] 50% 5000/10000 rows 2500 rows/s ~2s left".
func progressBar(t *terminal) func(expiry.Progress) {
	return everyAtMost(200*time.Millisecond, func(p expiry.Progress, rate float64) {
		const width = 30
		line := fmt.Sprintf("%s %d rows, %.0f rows/s", p.Table, p.Deleted, rate)
		if p.Estimate > 0 {
			frac := min(float64(p.Deleted)/float64(p.Estimate), 1)
			done := int(frac * width)
			left := max(p.Estimate-p.Deleted, 0)
			line = fmt.Sprintf("%s [%s%s] %3.0f%% %d/%d rows, %.0f rows/s, ~%s left", p.Table,
				strings.Repeat("#", done), strings.Repeat(".", width-done), frac*100, p.Deleted, p.Estimate, rate,
				humantime.Duration(time.Duration(float64(left)/max(rate, 1e-9))*time.Second))
		}
		t.Bar(line)
	})
}

// everyAtMost is a progress callback that keeps the rate of every report
// (rows per second, per table) and shows one by show at most every period.
func everyAtMost(period time.Duration, show func(p expiry.Progress, rate float64)) func(expiry.Progress) {
	var last time.Time
	rates := rateWindows{}
	return func(p expiry.Progress) {
		rate := rates.progress(p)
		if time.Since(last) < period {
			return
		}
		last = time.Now()
		show(p, rate)
	}
}

// printResults writes one line per table and returns how many failed.
func printResults(w io.Writer, results []expiry.TableResult, dryRun bool) int {
	verb := pick(dryRun, "would delete", "deleted")
	return writeResults(w, results, func(r expiry.TableResult) (string, retry.Early, error) {
		return fmt.Sprintf("%s: %s %d, protected by holds %d, protected by replays %d, %s",
			r.Table, verb, r.Deleted, r.ProtectedByHolds, r.ProtectedByReplays, humantime.Duration(r.Duration)), r.StoppedEarly, r.Err
	})
}

// writeResults writes one line per result, with how it stopped early or
// failed, and returns how many failed.
func writeResults[R any](w io.Writer, results []R, line func(R) (string, retry.Early, error)) (failed int) {
	for _, r := range results {
		text, stopped, err := line(r)
		if stopped.Stopped() {
			text += " (stopped early: " + stopped.String() + ")"
		}
		if err != nil {
			failed++
			text += " FAILED: " + err.Error()
		}
		fmt.Fprintln(w, text)
	}
	return failed
}

// pick is the first when cond holds, else the second.
func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

func serveMetrics(a *app, reg *prometheus.Registry) (func(), error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }
	mux.HandleFunc("/livez", ok)
	mux.HandleFunc("/readyz", ok)
	l, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("INBOXKEEPER_METRICS_ADDR: listen on %s: %w", a.cfg.MetricsAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	a.log.Info("inboxkeeper: metrics listening", "addr", l.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

func (a *app) status(ctx context.Context, args []string) error {
	fs := a.newFlags("status")
	asJSON := fs.Bool("json", false, "print the status as one JSON object, for scripts")
	watch := fs.Bool("watch", false, "redraw the status every INTERVAL (default 2s) until interrupted, with the rate and an ETA per table: "+
		"status --watch [INTERVAL]; on a terminal in place like top, otherwise as plain lines")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	every := 2 * time.Second
	switch {
	case *watch && fs.NArg() == 1:
		d, err := time.ParseDuration(fs.Arg(0))
		if err != nil || d < 100*time.Millisecond {
			return usagef("status --watch %q: want an interval such as 2s or 1m (at least 100ms)", fs.Arg(0))
		}
		every = d
	case fs.NArg() > 0:
		return usagef("status: unexpected argument %q", fs.Arg(0))
	case *watch && *asJSON:
		return usagef("status: --watch and --json do not go together")
	}
	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return err
	}
	if !*watch {
		return a.statusOnce(ctx, pool, tables, *asJSON, a.stdout, nil)
	}
	rates := rateWindows{}
	term := isTerminal(a.stdout)
	for {
		var b strings.Builder
		if err := a.statusOnce(ctx, pool, tables, false, &b, rates); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if term {
			fmt.Fprint(a.stdout, "\033[H\033[2J") // home, clear: redraw in place
		} else {
			fmt.Fprintf(a.stdout, "--- %s\n", time.Now().UTC().Format(time.RFC3339))
		}
		fmt.Fprint(a.stdout, b.String())
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// statusOnce measures and writes the status once; with rates (--watch) it
// adds each table's rate over the last minute and an ETA.
func (a *app) statusOnce(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, asJSON bool, w io.Writer, rates rateWindows) error {
	rep := statusReport{rates: rates, citus: map[string]*catalog.Distribution{}}
	for _, t := range tables {
		if t.Citus != nil {
			rep.citus[t.Name] = t.Citus
		}
	}
	var err error
	if rep.InRecovery, err = dbconn.InRecovery(ctx, pool); err != nil {
		return err
	}
	if rep.Lease, err = lease.Current(ctx, pool); err != nil {
		return err
	}
	if err := a.tableStatus(ctx, pool, tables, &rep); err != nil {
		return err
	}
	if rep.tuning, err = a.tuningValues(ctx, pool, tables); err != nil {
		return err
	}
	if rates != nil {
		now := time.Now()
		for _, st := range rep.Tables {
			rates.add(st.Table, now, st.Due)
		}
	}
	th := throttle.New(pool, a.throttleConfig(ctx, pool), service.Base{Logger: a.log}, nil)
	th.MeasureOnce(ctx)
	if asJSON {
		return json.NewEncoder(w).Encode(rep.JSON(th))
	}
	rep.writeTables(w, tables)
	switch {
	case rep.InRecovery:
		fmt.Fprintln(w, "database: a standby (in recovery): the daemon does nothing here")
	case rep.Lease != nil:
		fmt.Fprintf(w, "active instance: %s (lease until %s)\n", rep.Lease.Name, rep.Lease.ExpiresAt.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintln(w, "active instance: none holds the lease")
	}
	writeThrottle(w, th)
	return nil
}

// rateWindows keeps, per table, the counts seen over the last minute: the
// rate at which they change is the rate over the last minute (rows deleted
// for the progress line, the fall of the due count for status --watch).
type rateWindows map[string][]rateSample

type rateSample struct {
	at time.Time
	n  int64
}

// add records n for table at at and returns the rate of change, in rows/s,
// over the samples of the last minute (0 until there are two).
func (r rateWindows) add(table string, at time.Time, n int64) float64 {
	s := append(r[table], rateSample{at, n})
	for len(s) > 1 && at.Sub(s[0].at) > time.Minute {
		s = s[1:]
	}
	r[table] = s
	rate, _ := r.rate(table)
	return rate
}

// progress is the progress line's rate: rows deleted per second over the
// last minute, or since the table's pass began until there is a minute's
// second sample.
func (r rateWindows) progress(p expiry.Progress) float64 {
	r.add(p.Table, time.Now(), p.Deleted)
	if rate, ok := r.rate(p.Table); ok {
		return rate
	}
	return float64(p.Deleted) / max(p.Elapsed.Seconds(), 1e-9)
}

// rate is the rate of change over the samples kept (falling or rising),
// and whether there are two to compare.
func (r rateWindows) rate(table string) (float64, bool) {
	s := r[table]
	if len(s) < 2 {
		return 0, false
	}
	first, last := s[0], s[len(s)-1]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 {
		return 0, false
	}
	d := float64(last.n - first.n)
	if d < 0 {
		d = -d
	}
	return d / dt, true
}

// tableStatus reads what status shows per table: rows due for ordinary
// tables, a dry-run partition pass for partitioned ones, and the tiers.
func (a *app) tableStatus(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, rep *statusReport) error {
	// Status reads; it never deletes (not a dry run: that would count
	// differently).
	d := a.deleter(a.cfg, wiring{pool: pool}, tables, nil, nil)
	for _, t := range tables {
		if t.Partitioned() {
			continue
		}
		st, err := d.Status(ctx, t)
		if err != nil {
			return err
		}
		rep.Tables = append(rep.Tables, st)
	}
	// A dry-run pass shows what the next one would make, detach and drop.
	var err error
	if rep.Partitions, err = a.partitionManager(readOnly(pool), tables, nil).RunPass(ctx); err != nil {
		return err
	}
	rep.Tiers, err = a.tierStatus(ctx, pool, tables)
	return err
}

// writeTables prints the per-table part of status.
// Each table is named once, in policy order, with every part that applies.
func (r statusReport) writeTables(w io.Writer, tables []*catalog.Table) {
	if s := describeTuning(r.tuning[settings.Global]); s != "" {
		fmt.Fprintf(w, "settings (all tables):      %s\n", s)
	}
	for _, t := range tables {
		if t.Partitioned() {
			fmt.Fprintf(w, "%s (managed by partition)\n", t.Name)
		} else {
			fmt.Fprintf(w, "%s\n", t.Name)
		}
		if s := describeTuning(r.tuning[t.Name]); s != "" && s != describeTuning(r.tuning[settings.Global]) {
			fmt.Fprintf(w, "  settings:                 %s\n", s)
		}
		if d := t.Citus; d != nil {
			fmt.Fprintf(w, "  distributed (Citus):      %s: %s\n", d, strings.Join(d.Workers, ", "))
		}
		for _, st := range r.Tables {
			if st.Table == t.Name {
				writeStatus(w, st)
				if rate, ok := r.rates.rate(st.Table); ok {
					eta := "none: nothing goes"
					if rate > 0 {
						eta = humantime.Duration(time.Duration(float64(st.Due) / rate * float64(time.Second)))
					}
					fmt.Fprintf(w, "  rate (last minute):       %.0f rows/s, ETA %s\n", rate, eta)
				}
			}
		}
		for _, p := range r.Partitions {
			if p.Table == t.Name {
				writePartitionStatus(w, p)
			}
		}
		writeTierStatus(w, r.Tiers[t.Name])
	}
}

type statusReport struct {
	rates rateWindows // status --watch
	// citus is the distribution of each table Citus hash-distributes.
	citus map[string]*catalog.Distribution
	// tuning is every tunable in force and its source, by table ("" for
	// the global view).
	tuning     map[string][]settings.Value
	InRecovery bool
	Lease      *lease.Holder
	Tables     []expiry.TableStatus
	Partitions []partitions.TableResult
	Tiers      map[string]*tiering.Status // tables with tiers, by name
}

// JSON is the shape of `status --json`: snake_case, durations in seconds,
// instants in RFC 3339.
func (r statusReport) JSON(th *throttle.Throttler) map[string]any {
	tables := []map[string]any{}
	for _, st := range r.Tables {
		holds, replays := []map[string]any{}, []map[string]any{}
		for _, h := range st.Holds {
			holds = append(holds, map[string]any{"id": h.ID, "scope": h.Scope, "from": h.From, "to": h.To,
				"reason": h.Reason, "owner": h.Owner, "created_at": h.CreatedAt, "expires_at": h.ExpiresAt, "blocks": h.Blocks})
		}
		for _, p := range st.Replays {
			replays = append(replays, map[string]any{"id": p.ID, "scope": p.Scope, "from": p.From, "to": p.To,
				"owner": p.Owner, "started_at": p.StartedAt, "beyond_window": p.BeyondWindow})
		}
		tables = append(tables, map[string]any{
			"table": st.Table, "now": st.Now, "due": st.Due, "due_capped": st.DueCapped,
			"cleanup_lag_seconds": st.CleanupLag.Seconds(), "oldest_expiry": st.Oldest, "newest_expiry": st.Newest,
			"holds": holds, "replays": replays, "citus": citusJSON(r.citus[st.Table]),
		})
	}
	for _, p := range r.Partitions {
		pj := partitionJSON(p)
		pj["citus"] = citusJSON(r.citus[p.Table])
		tables = append(tables, pj)
	}
	state := th.Check()
	signals := []map[string]any{}
	for _, s := range th.Readings() {
		v := any(s.Value)
		if math.IsInf(s.Value, 0) {
			v = nil // unknown: JSON has no infinity
		}
		signals = append(signals, map[string]any{"kind": s.Kind, "subject": s.Subject, "value": v, "threshold": s.Threshold,
			"unit": s.Unit, "over": s.Over, "detail": s.Detail})
	}
	standbys := []map[string]any{}
	for _, p := range th.Paces() {
		standbys = append(standbys, map[string]any{"standby": p.Standby, "bytes_behind": p.Behind,
			"apply_rate_bytes_per_second": p.ApplyRate, "apply_rate_measured": p.Measured, "window_bytes": p.Window})
	}
	out := map[string]any{
		"in_recovery": r.InRecovery,
		"tables":      tables,
		"throttle": map[string]any{"throttled": state.Throttled, "kind": state.Kind, "reason": state.Reason, "signals": signals,
			"standbys": standbys},
		"active_instance": nil,
	}
	if len(r.Tiers) > 0 {
		tiers := map[string]any{}
		for name, st := range r.Tiers {
			tiers[name] = tierJSON(st)
		}
		out["tiers"] = tiers
	}
	if r.Lease != nil {
		out["active_instance"] = map[string]any{"holder": r.Lease.Name, "lease_expires_at": r.Lease.ExpiresAt}
	}
	return out
}

// citusJSON is a distributed table's distribution in status --json; null
// for an ordinary table.
func citusJSON(d *catalog.Distribution) any {
	if d == nil {
		return nil
	}
	return map[string]any{"distribution_column": d.Column.Name, "shards": d.Shards, "workers": d.Workers}
}

func writeStatus(w io.Writer, st expiry.TableStatus) {
	due := fmt.Sprintf("%d", st.Due)
	if st.DueCapped {
		due = fmt.Sprintf("more than %d (count capped)", st.Due)
	}
	fmt.Fprintf(w, "  expired, not yet deleted: %s (protected rows included)\n", due)
	fmt.Fprintf(w, "  cleanup lag:              %s\n", humantime.Duration(st.CleanupLag))
	if st.Oldest != nil {
		fmt.Fprintf(w, "  oldest retained expiry:   %s\n", st.Oldest.UTC().Format(time.RFC3339))
		fmt.Fprintf(w, "  newest retained expiry:   %s\n", st.Newest.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "  oldest retained expiry:   (no rows with an expiry)\n")
	}
	fmt.Fprintf(w, "  active holds:             %d\n", len(st.Holds))
	for _, h := range st.Holds {
		fmt.Fprintf(w, "    %s\n", describeHold(h))
	}
	fmt.Fprintf(w, "  active replays:           %d\n", len(st.Replays))
	for _, r := range st.Replays {
		fmt.Fprintf(w, "    %s\n", describeReplay(r))
	}
}
