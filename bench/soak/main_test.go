package main

import (
	"context"
	"io"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still starts its cleaners and writers, holds the horizon, samples, counts
// transactions and reports. The goals mean nothing at this scale; what must
// hold at any scale: every cleaner's writer inserted, the daemon's table
// was cleaned (its footprint stays below the table nobody cleans), status
// named the holder, and the daemon's metric saw it during the hold. With
// -baseline (this build, built once more) the other build runs as one
// more cleaner and its figures stand beside this build's in the goals; a
// baseline that is not an executable is refused.
func TestTinyRun(t *testing.T) {
	bin := benchtest.Baseline(t, run)
	o, ok := parseArgs([]string{"-rate", "100", "-expiry", "2s", "-duration", "16s", "-interval", "1s", "-proc-every", "4s",
		"-proc-batch", "100", "-idle", "4s", "-hold", "4s", "-hold-at", "8s", "-baseline", bin})
	if !ok {
		t.Fatal("flags refused")
	}
	var r *report
	report := benchtest.TinyRun(t, func(args []string, w io.Writer) int {
		var err error
		if r, err = benchmark(context.Background(), o, w); err != nil {
			t.Errorf("benchmark: %v", err)
			return 1
		}
		return 0
	}, nil,
		"bench/soak on ", "flags: -baseline "+bin+" -duration 16s -expiry 2s -hold 4s -hold-at 8s -idle 4s -interval 1s",
		"shared memory: ", " kB pages (vm.nr_hugepages ",
		"rows: ", "| peak footprint ÷ live rows packed (before the hold) |", "| peak footprint from the hold (4s) on |",
		"| peak dead tuples |", "| cleanup lag p99 / max |", "| insert p50 / p99 / p999, ms |", "| insert p99 ÷ no cleanup |",
		"| the cleaner's transactions a second |", "daemon: CPU ", "daemon's VACUUMs (INBOXKEEPER_VACUUM_DEAD_RATIO): ", "daemon with nothing due, over 4s: ", "CPU steal: ",
		"goal: footprint at most 1.5 x the live rows packed: ", "goal: insert p99 at most 1.10 x no cleanup's: ",
		"goal: at most 1 transaction a second from the daemon when nothing is due: ",
		"(no cleaner can go below 3.00 there: ",
		"baseline: "+bin, "| baseline's run |", "baseline daemon: CPU ", "baseline daemon with nothing due, over 4s: ", "; baseline ")
	_ = report
	rp := r.reps[0]
	for _, cl := range o.cleaners() {
		if x := rp.results[cl]; x.lat.inserts < 1000 {
			t.Errorf("%s: %d inserts, want at least 1,000 of the 1,600 scheduled", cl, x.lat.inserts)
		}
	}
	none := rp.results[cleanNone]
	for _, cl := range o.daemons() {
		if x := rp.results[cl]; x.footprint <= 0 || x.footprint >= none.footprintHeld {
			t.Errorf("footprint: %s's %.2f, no cleanup's %.2f at the end: the daemon did not clean", cl, x.footprint, none.footprintHeld)
		}
	}
	if f := rp.daemon.rss.first; f.anon <= 0 || f.anon > f.rss {
		t.Errorf("the daemon's RSS in its first minute: %d bytes, of which %d anonymous", f.rss, f.anon)
	}
	if rp.daemon.namedInStatus == "" {
		t.Errorf("status did not name the session holding the horizon (pid %d)", rp.daemon.holdPID)
	}
	if rp.daemon.metricInHold < 1 {
		t.Errorf("the metric read %.1f s at %s into the hold, never 1 s or more", rp.daemon.metricInHold, rp.daemon.metricInHoldAt)
	}
}
