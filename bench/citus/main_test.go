package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still builds the daemon, starts Citus, fills and distributes the tables,
// measures and reports. Two reps cover both orders. Citus or PostgreSQL
// missing fails the test (pgcluster says how to fix it); it never skips.
func TestTinyRun(t *testing.T) {
	benchtest.TinyRun(t, run, []string{"-rows", "20000", "-batch", "1000", "-reps", "2", "-shards", "4", "-explain"},
		"bench/citus on ", " CPUs; flags: -batch 1000 -explain true -keep false -reps 2 -rows 20000 -shards 4 -workers 2",
		"rows: 20000 total, 10000 expired, over 1000 consumers, in each copy; 4 shards on 2 workers; daemon batch size 1000; 2 reps",
		"rep 1 of 2 (inboxkeeper once first):", "rep 2 of 2 (unbounded DELETE first):",
		"  fill for inboxkeeper once: ", "  fill for unbounded DELETE: ",
		"WAL w1", "WAL w2", "WAL workers", "WAL coord",
		"  inboxkeeper once ", " batches, avg ", "  unbounded DELETE ",
		"  throughput ratio inboxkeeper/unbounded ",
		"  WAL ratio inboxkeeper/unbounded, workers: ",
		"over 2 reps: throughput ratio inboxkeeper/unbounded min ",
		"one daemon batch through the coordinator: a window of 4000 rows (1000 a shard; 10000 expired rows take about 3 such batches)",
		"  the one-node form's bound query for 1000 rows (not used on Citus): ",
		"EXPLAIN ANALYZE, window count (", "EXPLAIN ANALYZE, window DELETE (", "Task Count: 4", "  committed windows, in turn", "    2. ",
	)
}
