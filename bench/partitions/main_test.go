package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still fills the tables, drives both inboxkeeper and pg_partman, measures
// and reports; and it checks the one claim that holds at any scale: with
// inboxkeeper an insert never waits much longer than the lock timeout, while
// with pg_partman's run_maintenance the writer waits for the reader. The WAL
// goal means nothing at this scale and is not checked. PostgreSQL or
// pg_partman missing fails the test (the error says how to fix it); it never
// skips.
func TestTinyRun(t *testing.T) {
	start := time.Now()
	const (
		rows        = 20000
		reader      = 2 * time.Second
		lockTimeout = 100 * time.Millisecond
		// The insert itself and a shared, noisy machine (go test runs
		// packages in parallel); still far below the reader's hold, which
		// is what an insert queued behind DDL waits.
		margin = 500 * time.Millisecond
	)
	var out strings.Builder
	o, ok := parseArgs([]string{"-rows", "20000", "-reader", reader.String(), "-lock-timeout", lockTimeout.String()})
	if !ok {
		t.Fatal("flags refused")
	}
	r, err := benchmark(context.Background(), o, &out)
	report := out.String()
	if err != nil {
		t.Fatalf("benchmark failed: %v\nreport so far:\n%s", err, report)
	}
	t.Logf("report (%s):\n%s", time.Since(start).Round(time.Millisecond), report)

	for _, u := range []underReader{r.ik, r.pm} {
		if !u.retired {
			t.Errorf("%s did not retire the expired months", u.tool)
		}
		// Both must wait for the reader: the detach of a partition the
		// reader has read cannot finish before it ends. Retired earlier
		// means the reader held nothing, and the run proves nothing.
		if u.after < 0 {
			t.Errorf("%s retired the months %s before the reader ended: the reader did not hold its locks", u.tool, -u.after)
		}
		if u.held < reader {
			t.Errorf("%s: the reader held its transaction %s, want %s", u.tool, u.held, reader)
		}
		if u.during.inserts == 0 || u.during.p50 > u.during.p99 || u.during.p99 > u.during.max {
			t.Errorf("%s: insignificant insert figures %+v", u.tool, u.during)
		}
	}
	if r.ik.during.max > lockTimeout+margin {
		t.Errorf("with inboxkeeper an insert waited %s, more than the lock timeout %s + %s", r.ik.during.max, lockTimeout, margin)
	}
	// The writer queues behind pg_partman's DROP from its next insert on,
	// so for about as long as the DROP waited for the reader (at least
	// half of -reader: the reader holds on until then), however late on a
	// loaded machine run_maintenance reached its DROP.
	if r.pm.queued < reader/2 {
		t.Errorf("the reader ended %s after pg_partman's DROP was seen waiting for it, want at least %s", r.pm.queued, reader/2)
	}
	if r.pm.during.max < r.pm.queued/2 {
		t.Errorf("with pg_partman the longest insert took %s, less than half the time its DROP waited for the reader (%s, hold %s): run_maintenance should have queued the writer behind the reader", r.pm.during.max, r.pm.queued, r.pm.held)
	}
	f := r.forget
	if f.deleted != rows || f.partWAL <= 0 || f.rowsWAL <= f.partWAL || f.partTime <= 0 || f.rowsTime <= 0 {
		t.Errorf("forgetting figures are not sane: %+v", f)
	}

	benchtest.Contains(t, report,
		"bench/partitions on ", " CPUs; flags: -keep false -lock-timeout 100ms -reader 2s -rows 20000",
		"shared memory: ", " kB pages (vm.nr_hugepages ",
		"rows: 20000 in the expired month ",
		"pg_partman 4.",
		"  inboxkeeper ", "  pg_partman ",
		"goal: inboxkeeper's inserts never wait longer than the lock timeout: longest ",
		"longest insert wait, pg_partman / inboxkeeper: ",
		"by partition: inboxkeeper pass (DETACH CONCURRENTLY, DROP)",
		"by rows: inboxkeeper expiry deleter",
		"by rows / by partition: time ",
		"goal: forgetting by partition at least 100x cheaper in WAL: ",
	)
}
