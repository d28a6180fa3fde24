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
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("inboxkeeper "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags turns flag errors into usage errors (exit 2).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return usagef("%s: see the usage above", fs.Name())
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	return nil
}

func (a *app) deleter(pool *pgxpool.Pool, tables []*catalog.Table, dryRun bool, th *throttle.Throttler, m *expiry.Metrics, progress func(expiry.Progress)) *expiry.Deleter {
	return expiry.New(pool, tables, expiry.Options{
		Throttle:         th,
		Sizing:           a.sizing(),
		BatchSize:        a.cfg.BatchSize,
		BatchPause:       a.cfg.BatchPause,
		LockTimeout:      a.cfg.LockTimeout,
		StatementTimeout: a.cfg.StatementTimeout,
		RunTime:          a.cfg.RunTime,
		DryRun:           dryRun,
		Logger:           a.log,
		Metrics:          m,
		Progress:         progress,
	})
}

// preparePrimary is prepare for commands that change the database: against
// a standby it says so and returns a nil pool, and the command does nothing.
func (a *app) preparePrimary(ctx context.Context) (*pgxpool.Pool, []*catalog.Table, error) {
	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return nil, nil, err
	}
	if standby, err := inRecovery(ctx, pool); err != nil {
		return nil, nil, err
	} else if standby {
		fmt.Fprintln(a.stdout, "the database is a standby (in recovery): nothing to do here; run inboxkeeper against the primary")
		return nil, nil, nil
	}
	return pool, tables, nil
}

func (a *app) once(ctx context.Context, args []string) error {
	fs := newFlags("once", a.stderr)
	dryRun := fs.Bool("dry-run", false, "count what would be deleted; delete nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("once: unexpected argument %q", fs.Arg(0))
	}
	pool, tables, err := a.preparePrimary(ctx)
	if err != nil || pool == nil {
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
		if th, err = a.startThrottle(ctx, pool, nil); err != nil {
			return err
		}
		defer th.Stop()
	}
	failed, total, err := a.onePass(ctx, pool, tables, *dryRun, th, active, a.progressPrinter())
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tables failed (see the log)", failed, total)
	}
	return nil
}

// onePass is what once does, and the demo: partitions (premake, then
// retirement), demotion, then row deletion, with a line per table and step
// on stdout. It returns how many table steps failed, out of how many.
func (a *app) onePass(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, dryRun bool, th *throttle.Throttler,
	active func() error, progress func(expiry.Progress)) (failed, total int, err error) {
	deadline := batchloop.Deadline(a.cfg.RunTime) // one RUN_TIME for the whole pass
	pm := a.partitionManager(pool, tables, dryRun, th, nil)
	pm.SetActive(active)
	presults, err := pm.RunPass(ctx)
	failed = printPartitionResults(a.stdout, presults, dryRun)
	if err != nil {
		return failed, 0, fmt.Errorf("pass interrupted: %w", err)
	}
	tfailed, tn, err := a.onceDemote(ctx, pool, tables, dryRun, th, active, deadline)
	failed += tfailed
	if err != nil {
		return failed, 0, err
	}
	d := a.deleter(pool, tables, dryRun, th, nil, progress)
	d.SetActive(active)
	results, err := d.RunPassUntil(ctx, deadline)
	if isTerminal(a.stderr) {
		fmt.Fprint(a.stderr, "\r\033[K") // clear the progress bar
	}
	failed += printResults(a.stdout, results, dryRun)
	if err != nil {
		return failed, 0, fmt.Errorf("pass interrupted: %w", err)
	}
	return failed, len(results) + len(presults) + tn, nil
}

// progressPrinter shows a long pass is alive: on a terminal, a progress bar
// redrawn in place; otherwise a log line every few seconds.
func (a *app) progressPrinter() func(expiry.Progress) {
	if isTerminal(a.stderr) {
		return progressBar(a.stderr)
	}
	var last time.Time
	return func(p expiry.Progress) {
		if time.Since(last) < 3*time.Second {
			return
		}
		last = time.Now()
		rate := float64(p.Deleted) / max(p.Elapsed.Seconds(), 1e-9)
		args := []any{"table", p.Table, "deleted", p.Deleted, "batches", p.Batches, "rows_per_second", int64(rate)}
		if left := p.Estimate - p.Deleted; p.Estimate > 0 && left > 0 && rate > 0 {
			args = append(args, "estimated_rows_left", left, "estimated_time_left", (time.Duration(float64(left)/rate) * time.Second).Round(time.Second))
		}
		a.log.Info("expiry: progress", args...)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressBar draws "table [#####.....] 50% 5000/10000 rows 2500 rows/s ~2s left".
func progressBar(w io.Writer) func(expiry.Progress) {
	var last time.Time
	return func(p expiry.Progress) {
		if time.Since(last) < 200*time.Millisecond {
			return
		}
		last = time.Now()
		rate := float64(p.Deleted) / max(p.Elapsed.Seconds(), 1e-9)
		const width = 30
		line := fmt.Sprintf("%s %d rows, %.0f rows/s", p.Table, p.Deleted, rate)
		if p.Estimate > 0 {
			frac := min(float64(p.Deleted)/float64(p.Estimate), 1)
			done := int(frac * width)
			left := max(p.Estimate-p.Deleted, 0)
			line = fmt.Sprintf("%s [%s%s] %3.0f%% %d/~%d rows, %.0f rows/s, ~%s left", p.Table,
				strings.Repeat("#", done), strings.Repeat(".", width-done), frac*100, p.Deleted, p.Estimate, rate,
				(time.Duration(float64(left)/max(rate, 1e-9)) * time.Second).Round(time.Second))
		}
		fmt.Fprintf(w, "\r\033[K%s", line)
	}
}

// printResults writes one line per table and returns how many failed.
func printResults(w io.Writer, results []expiry.TableResult, dryRun bool) int {
	verb := "deleted"
	if dryRun {
		verb = "would delete"
	}
	failed := 0
	for _, r := range results {
		line := fmt.Sprintf("%s: %s %d, protected by holds %d, protected by replays %d, %s",
			r.Table, verb, r.Deleted, r.ProtectedByHolds, r.ProtectedByReplays, r.Duration.Round(time.Millisecond))
		if r.StoppedEarly != "" {
			line += " (stopped early: " + r.StoppedEarly + ")"
		}
		if r.Err != nil {
			failed++
			line += " FAILED: " + r.Err.Error()
		}
		fmt.Fprintln(w, line)
	}
	return failed
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
	fs := newFlags("status", a.stderr)
	asJSON := fs.Bool("json", false, "print the status as one JSON object, for scripts")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("status: unexpected argument %q", fs.Arg(0))
	}
	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return err
	}
	rep := statusReport{}
	if rep.InRecovery, err = inRecovery(ctx, pool); err != nil {
		return err
	}
	if rep.Lease, err = lease.Current(ctx, pool); err != nil {
		return err
	}
	if err := a.tableStatus(ctx, pool, tables, &rep); err != nil {
		return err
	}
	th := throttle.New(pool, a.throttleConfig(), a.log, nil)
	th.MeasureOnce(ctx)
	if *asJSON {
		return json.NewEncoder(a.stdout).Encode(rep.JSON(th))
	}
	rep.writeTables(a.stdout, tables)
	switch {
	case rep.InRecovery:
		fmt.Fprintln(a.stdout, "database: a standby (in recovery): the daemon does nothing here")
	case rep.Lease != nil:
		fmt.Fprintf(a.stdout, "active instance: %s (lease until %s)\n", rep.Lease.Name, rep.Lease.ExpiresAt.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintln(a.stdout, "active instance: none holds the lease")
	}
	writeThrottle(a.stdout, th)
	return nil
}

// tableStatus reads what status shows per table: rows due for ordinary
// tables, a dry-run partition pass for partitioned ones, and the tiers.
func (a *app) tableStatus(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, rep *statusReport) error {
	d := a.deleter(pool, tables, false, nil, nil, nil)
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
	if rep.Partitions, err = a.partitionManager(pool, tables, true, nil, nil).RunPass(ctx); err != nil {
		return err
	}
	rep.Tiers, err = a.tierStatus(ctx, pool, tables)
	return err
}

// writeTables prints the per-table part of status.
func (r statusReport) writeTables(w io.Writer, tables []*catalog.Table) {
	for _, st := range r.Tables {
		writeStatus(w, st)
	}
	for _, p := range r.Partitions {
		writePartitionStatus(w, p)
	}
	for _, t := range tables {
		writeTierStatus(w, t.Name, r.Tiers[t.Name])
	}
}

type statusReport struct {
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
		var holds, replays []map[string]any
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
			"holds": holds, "replays": replays,
		})
	}
	for _, r := range r.Partitions {
		tables = append(tables, partitionJSON(r))
	}
	state := th.Check()
	var signals []map[string]any
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

func writeStatus(w io.Writer, st expiry.TableStatus) {
	fmt.Fprintf(w, "%s\n", st.Table)
	due := fmt.Sprintf("%d", st.Due)
	if st.DueCapped {
		due = fmt.Sprintf("more than %d (count capped)", st.Due)
	}
	fmt.Fprintf(w, "  expired, not yet deleted: %s (protected rows included)\n", due)
	fmt.Fprintf(w, "  cleanup lag:              %s\n", st.CleanupLag.Round(time.Second))
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
