package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, starts the standby and caps it, runs the writer
// beside each method (pg_repack among them: .ci/run installs it), audits
// and reports. The goals mean nothing at this scale and are not checked.
// PostgreSQL or pg_repack missing fails the test; it never skips.
func TestTinyRun(t *testing.T) {
	benchtest.TinyRun(t, run, []string{"-rows", "20000", "-apply-rate", "4", "-writer-rate", "50"},
		"bench/compact on ", " CPUs; flags: -apply-rate 4 -baseline  -batch-pause 0s -batch-size 0 -keep false -lock-timeout 500ms -max-lag 1s -methods inboxkeeper,pg_repack,vacuum full,none -payload false -purge oldest -purged 0.8 -reps 1 -rows 20000 -wal-rate  -writer-rate 50",
		"standby: apply capped at 4 MB/s of WAL (baseline lag ",
		"rep 1: 20000 rows, 80% purged (oldest); heap after the purge ",
		"  inboxkeeper  ", "  pg_repack    ", "  vacuum full  ", "  none         ",
		"inboxkeeper's estimate of the live size: ",
		"goal size: heap <= 1.3 x live: ", "goal writer: longest ", "goal standby: peak lag ",
		"audit: exact",
	)
}
