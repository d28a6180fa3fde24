package benchdata

import (
	"math"
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
