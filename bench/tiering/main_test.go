package main

import (
	"strings"
	"testing"
	"time"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that it
// still fills the tables, demotes, deletes, measures and reports. PostgreSQL
// missing fails the test (pgcluster says how to fix it); it never skips.
func TestTinyRun(t *testing.T) {
	start := time.Now()
	var out strings.Builder
	if code := run([]string{"-rows", "20000", "-batch", "1000"}, &out); code != 0 {
		t.Fatalf("run exited %d (the error is in the test's stderr); report so far:\n%s", code, out.String())
	}
	report := out.String()
	t.Logf("report (%s):\n%s", time.Since(start).Round(time.Millisecond), report)
	for _, want := range []string{
		"rows: 20000 per table, all due for demotion and deletion; batch size 1000",
		"delete, wide rows (expiry deleter):", "demote, side table (recommended):", "demote, in place (UPDATE ... NULL):",
		"side-table demotion / delete: time ", "in-place demotion / delete: time ",
		"side-table demotion costs at most 1.5x a delete",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
