package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, fills both layouts, runs every method with the
// daemon beside, checks every claim's answer and reports; then again with
// -baseline, this tree's own build standing in for main's. PostgreSQL
// missing fails the test (pgcluster says how to fix it); it never skips.
func TestTinyRun(t *testing.T) {
	t.Parallel()
	t.Run("this build", func(t *testing.T) {
		t.Parallel()
		benchtest.TinyRun(t, run, []string{"-rows", "2000", "-duration", "200ms", "-slice", "100ms", "-reps", "2", "-clients", "2"},
			"bench/claim on ", " CPUs; flags: -baseline  -clients 2 -duration 200ms -horizon 10s -keep false -reps 2 -rows 2000 -slice 100ms -synchronous-commit false",
			"shared memory: ", " kB pages (vm.nr_hugepages ",
			"rows: 2000 in each layout's table before the run; 2 clients a method; 200ms a method in turns of 100ms",
			"synchronous_commit off in the clients' sessions",
			"beside: inboxkeeper run (INTERVAL 1s) on each database; claims and inserts are remembered 10s",
			"rep 1:", "rep 2:", "  plain, fresh:", "  plain, 50% duplicates:", "  partitioned, fresh:", "  partitioned, 50% duplicates:",
			"    INSERT ... ON CONFLICT DO NOTHING ", "    inboxkeeper.claim ", "    the INSERT in a transaction ", "    inbox.Claim (in a transaction) ",
			"  CPU steal: ",
			"over 2 reps, the worst rep (goals: rate at least 0.7 x the insert's on the plain layout, 0.5 x on the partitioned one; p99 at most 1.5 x):",
			"  plain, fresh, inboxkeeper.claim: rate ", "  partitioned, 50% duplicates, inbox.Claim (in a transaction): rate ",
			"daemon beside (claims): ",
		)
	})
	t.Run("baseline", func(t *testing.T) {
		t.Parallel()
		bin := benchtest.Baseline(t, run)
		benchtest.TinyRun(t, run, []string{"-rows", "0", "-duration", "100ms", "-slice", "100ms", "-reps", "1", "-clients", "1", "-baseline", bin},
			" CPUs; flags: -baseline "+bin+" -clients 1 ",
			"baseline: "+bin+", its claim function on a database of its own (migrated by it, its daemon beside)",
			"    baseline inboxkeeper.claim ", "  plain, fresh, baseline inboxkeeper.claim: rate ", ": (not judged)",
			"daemon beside (baseline): ",
		)
	})
}
