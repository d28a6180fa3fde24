package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, starts the standby, slows and samples it, and
// reports. The goals mean nothing at this scale and are not checked.
// PostgreSQL missing fails the test (pgcluster says how to fix it); it never
// skips.
func TestTinyRun(t *testing.T) {
	benchtest.TinyRun(t, run, []string{"-rows", "20000", "-apply-rate", "4"},
		"bench/throttle on ", " CPUs; flags: -apply-rate 4 -keep false -logs  -max-lag 1s -rows 20000",
		"standby apply slowed by: apply capped at 4 MB/s of WAL (replay paused whenever it gets ahead) (baseline lag ",
		"rows: 20000 total, 10000 expired;",
		"daemon, throttled at 1s:",
		"unbounded DELETE:",
		"daemon, unthrottled:",
		"goal 1: throttled peak lag <= 1.5 x 1s = 1.50 s: peak ",
		"goal 2: throttled time <= 1.3 x its WAL / apply cap (",
		"throughput throttled/unthrottled: ",
		"throttled:", "unthrottled:", ", CPU steal ",
	)
}
