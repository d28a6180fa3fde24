package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, fills the tables, measures and reports: two reps
// on the layouts with the expired rows in the first half of the heap (both
// orders), one on the scattered ones with the statements timed through
// psql (-from-exec), every connection through the relay (-relay) and a
// pass of the daemon (-run-pass) side by side. PostgreSQL missing fails
// the test (pgcluster says how to fix it); it never skips.
func TestTinyRun(t *testing.T) {
	t.Parallel()
	t.Run("clustered", func(t *testing.T) {
		t.Parallel()
		benchtest.TinyRun(t, run, []string{"-rows", "20000", "-flat-rows", "20000", "-batch", "1000", "-reps", "2",
			"-layouts", "append-ordered,interleaved"},
			"bench/expiry on ", " CPUs; flags: -baseline  -batch 1000 -flat-rows 20000 -from-exec false -gap 168h0m0s -horizons 100 -keep false -layouts append-ordered,interleaved -payload true -relay -1ns -reps 2 -rows 20000 -run-pass false",
			"timing: inboxkeeper once from exec to exit; the unbounded DELETE and the loops as statements alone",
			"shared memory: ", " kB pages (vm.nr_hugepages ", // the postmaster's, read from its smaps
			"rows: 20000 generated in each copy; daemon batch size 1000; 2 reps",
			"layout append-ordered: 20000 rows, 10000 expired; ", "layout interleaved: 20000 rows, 10000 expired; ",
			"(inboxkeeper once first)", "(loop 50000 SKIP LOCKED first)",
			"  unbounded DELETE ", "  loop 5000 ", "  loop 50000 ", "  loop 5000 SKIP LOCKED ", "  loop 50000 SKIP LOCKED ",
			"throughput ratio inboxkeeper/unbounded ",
			"ahead of the best loop (",
			"WAL ratio ",
			"longest batch ",
			" batches, avg ", " rows, swept", // every row of a due page is due: a sweep costs less
			"  CPU seconds: inboxkeeper ",
			"  CPU steal: ", "% of the machine's CPU time during the rep",
			"append-ordered over 2 reps: ", "interleaved over 2 reps: ",
			"peak RSS: ", " at 20000;",
			"daemon peak RSS: ",
		)
	})
	// -baseline runs another build as one more method on the same copies;
	// here this tree's own build stands in for main's, on narrow rows. A path that is not
	// an executable is refused before anything is filled.
	t.Run("baseline", func(t *testing.T) {
		t.Parallel()
		bin := benchtest.Baseline(t, run)
		benchtest.TinyRun(t, run, []string{"-rows", "20000", "-flat-rows", "0", "-batch", "1000", "-reps", "1",
			"-layouts", "append-ordered", "-baseline", bin, "-payload=false"},
			" CPUs; flags: -baseline "+bin+" -batch 1000 ", " -payload false ",
			"  baseline once ", "  baseline ("+bin+"): throughput ratio ", "; this build ÷ baseline ",
			"append-ordered over 1 reps: ",
		)
	})
	t.Run("scattered", func(t *testing.T) {
		t.Parallel()
		benchtest.TinyRun(t, run, []string{"-rows", "20000", "-flat-rows", "0", "-batch", "1000", "-reps", "1",
			"-layouts", "uniform,steady-state", "-horizons", "10", "-gap", "240h", "-from-exec", "-relay", "0s", "-run-pass"},
			" CPUs; flags: -baseline  -batch 1000 -flat-rows 0 -from-exec true -gap 240h0m0s -horizons 10 -keep false -layouts uniform,steady-state -payload true -relay 0s -reps 1 -rows 20000 -run-pass true",
			"relay: every method connects through a TCP relay holding what it forwards 0s each way: a SELECT 1 round trip ", " direct (medians of 200)",
			"timing: every method from exec to exit; the unbounded DELETE and the loops through ", "/psql, each on a connection of its own (-from-exec)",
			"layout uniform: 20000 rows, 10000 expired; ", "layout steady-state: ",
			"  method                        time     rows/s      WAL     CPU throughput    WAL  pages dirtied",
			" rows, swept",
			"timing: inboxkeeper run, a pass from the pass's start to its end, by the daemon's log (INTERVAL 1s, a pass over an empty table before it)",
			"  inboxkeeper run, a pass ", "  inboxkeeper run, a pass: throughput ratio ", "; once ÷ run pass ",
			"uniform over 1 reps: ", "steady-state over 1 reps: ",
			"uniform over 1 reps, inboxkeeper run, a pass: throughput goal met ",
			"peak RSS flatness: skipped (-flat-rows 0)",
		)
	})
}
