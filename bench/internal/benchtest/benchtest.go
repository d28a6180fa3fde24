// Package benchtest is what the benchmarks' tiny-run tests share: run a
// whole benchmark at a tiny scale and check its report.
package benchtest

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
)

// TinyRun runs a benchmark's run function with args and fails t unless it
// exits 0 and its report holds every want. It returns the report. The
// goals mean nothing at a tiny scale; what is proved is that the benchmark
// still builds, fills, measures and reports.
func TinyRun(t *testing.T, run func([]string, io.Writer) int, args []string, want ...string) string {
	t.Helper()
	start := time.Now()
	var out strings.Builder
	if code := run(args, &out); code != 0 {
		t.Fatalf("run exited %d (the error is in the test's stderr); report so far:\n%s", code, out.String())
	}
	report := out.String()
	t.Logf("report (%s):\n%s", time.Since(start).Round(time.Millisecond), report)
	Contains(t, report, want...)
	return report
}

// Contains fails t for each want the report lacks.
func Contains(t *testing.T, report string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(report, w) {
			t.Errorf("report lacks %q", w)
		}
	}
}

// Baseline checks that run refuses a -baseline naming a directory (exit 2,
// before anything starts) and returns this tree's build of the daemon, to
// stand in for another build's as -baseline.
func Baseline(t *testing.T, run func([]string, io.Writer) int) string {
	t.Helper()
	dir := t.TempDir()
	if code := run([]string{"-baseline", dir}, io.Discard); code != 2 {
		t.Errorf("-baseline naming a directory: exit %d, want 2", code)
	}
	bin, err := benchdata.BuildBinary(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
