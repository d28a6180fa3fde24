package benchdata

import (
	"flag"
	"io"
	"math"
	"os"
	"testing"
)

// The share of steal is read from the aggregate line's eighth figure, of
// the first eight (guest time is in user time already).
func TestMachineCPU(t *testing.T) {
	before, ok := parseMachineCPU("cpu  100 0 50 800 10 0 5 35 7 0")
	if !ok {
		t.Fatal("a /proc/stat line was not read")
	}
	after, ok := parseMachineCPU("cpu  200 0 100 1500 10 0 5 185 9 0")
	if !ok {
		t.Fatal("a /proc/stat line was not read")
	}
	// 1,000 ticks more, 150 of them stolen.
	if got := after.stealSince(before); math.Abs(got-0.15) > 1e-9 {
		t.Errorf("steal %.4f, want 0.15", got)
	}
	if got := before.stealSince(before); got != 0 {
		t.Errorf("steal over no time %.4f, want 0", got)
	}
	for _, line := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 2 3 4 5 6 7 x"} {
		if _, ok := parseMachineCPU(line); ok {
			t.Errorf("%q read as a /proc/stat line", line)
		}
	}
	if _, ok := Steal()(); !ok {
		t.Error("this machine's /proc/stat was not read (the benchmarks run on Linux)")
	}
}

// The shared flags are checked with the benchmark's own: -reps below 1 and
// a -baseline that is not an executable are refused before anything runs,
// and Flags is the header's copy of the command line.
func TestCommonFlags(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) (Common, bool) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c Common
		rows := fs.Int("rows", 1, "rows")
		c.Define(fs, 2, RepsUsage, KeepUsage, "another build")
		ok := ParseFlags(fs, args, &c, func() error { return WantFlags(fs, *rows < 1, "-rows >= 1") })
		return c, ok
	}
	if c, ok := parse("-rows", "3"); !ok || c.Reps != 2 || c.Keep || c.Baseline != "" || c.Flags != "-baseline  -keep false -reps 2 -rows 3" {
		t.Errorf("defaults: %+v, %v", c, ok)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := parse("-reps", "1", "-keep", "-baseline", bin); !ok || c.Reps != 1 || !c.Keep || c.Baseline != bin {
		t.Errorf("set: %+v, %v", c, ok)
	}
	for _, args := range [][]string{{"-reps", "0"}, {"-baseline", t.TempDir()}, {"-rows", "0"}, {"extra"}} {
		if _, ok := parse(args...); ok {
			t.Errorf("%q taken", args)
		}
	}
}
