package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, starts the standby, slows and samples it, and
// reports; with -baseline (this build, built once more), the two builds
// take turns to go first and the report judges both over the reps. The
// goals mean nothing at this scale and are not checked. PostgreSQL missing
// fails the test (pgcluster says how to fix it); it never skips.
func TestTinyRun(t *testing.T) {
	bin := benchtest.Baseline(t, run)
	benchtest.TinyRun(t, run, []string{"-rows", "20000", "-apply-rate", "4", "-reps", "2", "-baseline", bin},
		"bench/throttle on ", " CPUs; flags: -apply-rate 4 -baseline "+bin+" -keep false -logs  -max-lag 1s -references true -reps 2 -rows 20000",
		"standby apply slowed by: apply capped at 4 MB/s of WAL (replay paused whenever it gets ahead) (baseline lag ",
		"rows: 20000 total, 10000 expired;",
		"baseline: "+bin+", throttled as this build, in a database of its own",
		"rep 1 of 2 (this build first):", "rep 2 of 2 (baseline first):",
		"daemon, throttled at 1s:", "baseline, throttled at 1s:",
		"unbounded DELETE:",
		"daemon, unthrottled:",
		"this build: goal 1: throttled peak lag <= 1.5 x 1s = 1.50 s: peak ",
		"this build: goal 2: throttled time <= 1.3 x its WAL / apply cap (",
		"baseline: goal 1: ", "baseline: goal 2: ",
		"throughput throttled/unthrottled: ",
		"this build:", "unthrottled:", ", CPU steal ", "VACUUM ",
		"this build over 2 reps: peak lag ", "baseline over 2 reps: peak lag ",
	)
}
