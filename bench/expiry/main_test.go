package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, fills the tables, measures and reports. Two reps
// cover both orders, on both layouts. PostgreSQL missing fails the test (pgcluster says how to
// fix it); it never skips.
func TestTinyRun(t *testing.T) {
	benchtest.TinyRun(t, run, []string{"-rows", "20000", "-flat-rows", "20000", "-batch", "1000", "-reps", "2"},
		"bench/expiry on ", " CPUs; flags: -batch 1000 -flat-rows 20000 -keep false -layouts append-ordered,interleaved -reps 2 -rows 20000",
		"rows: 20000 total, 10000 expired, in each copy; daemon batch size 1000; 2 reps",
		"layout append-ordered: ", "layout interleaved: ",
		"(inboxkeeper once first)", "(loop 50000 SKIP LOCKED first)",
		"  unbounded DELETE ", "  loop 5000 ", "  loop 50000 ", "  loop 5000 SKIP LOCKED ", "  loop 50000 SKIP LOCKED ",
		"throughput ratio inboxkeeper/unbounded ",
		"ahead of the best loop (",
		"WAL ratio ",
		"  CPU seconds: inboxkeeper ",
		"append-ordered over 2 reps: ", "interleaved over 2 reps: ",
		"peak RSS: ", " at 20000;",
		"daemon peak RSS: ",
	)
}
