package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/throttle"
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

func (a *app) once(ctx context.Context, args []string) error {
	fs := newFlags("once", a.stderr)
	dryRun := fs.Bool("dry-run", false, "count what would be deleted; delete nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("once: unexpected argument %q", fs.Arg(0))
	}
	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return err
	}
	if standby, err := inRecovery(ctx, pool); err != nil {
		return err
	} else if standby {
		fmt.Fprintln(a.stdout, "the database is a standby (in recovery): nothing to do here; run inboxkeeper against the primary")
		return nil
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
		th = a.startThrottle(ctx, pool, nil)
		defer th.Stop()
	}
	d := a.deleter(pool, tables, *dryRun, th, nil, a.progressPrinter())
	d.SetActive(active)
	results, err := d.RunPass(ctx)
	failed := printResults(a.stdout, results, *dryRun)
	if err != nil {
		return fmt.Errorf("pass interrupted: %w", err)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tables failed (see the log)", failed, len(results))
	}
	return nil
}

// progressPrinter logs a progress line at most every few seconds, so a long
// first pass over a big backlog is visibly alive.
func (a *app) progressPrinter() func(expiry.Progress) {
	var last time.Time
	return func(p expiry.Progress) {
		if time.Since(last) < 3*time.Second {
			return
		}
		last = time.Now()
		rate := float64(p.Deleted) / max(p.Elapsed.Seconds(), 1e-9)
		a.log.Info("expiry: progress", "table", p.Table, "deleted", p.Deleted, "batches", p.Batches, "rows_per_second", int64(rate))
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
	if err := printStatus(ctx, a, a.deleter(pool, tables, false, nil, nil, nil), tables); err != nil {
		return err
	}
	th := throttle.New(pool, a.throttleConfig(), a.log, nil)
	th.MeasureOnce(ctx)
	writeThrottle(a.stdout, th)
	return nil
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
