package main

import (
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still fills the tables, demotes, deletes, measures and reports. PostgreSQL
// missing fails the test (pgcluster says how to fix it); it never skips.
func TestTinyRun(t *testing.T) {
	benchtest.TinyRun(t, run, []string{"-rows", "20000", "-batch", "1000"},
		"bench/tiering on ", " CPUs; flags: -batch 1000 -keep false -rows 20000",
		"shared memory: ", " kB pages (vm.nr_hugepages ",
		"rows: 20000 per table, all due for demotion and deletion; batch size 1000",
		"delete, wide rows (expiry deleter):", "demote, side table (recommended):", "demote, in place (UPDATE ... NULL):",
		"side-table demotion / delete: time ", "in-place demotion / delete: time ",
		"side-table demotion costs at most 1.5x a delete",
	)
}
