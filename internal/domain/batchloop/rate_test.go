package batchloop

import (
	"math"
	"testing"
	"time"
)

// A daemon keeping up with 1,000 rows/s in passes every 5 s deletes about
// 5,000 rows a pass, in a burst of a fraction of a second: its rate over
// the last minute, across passes, is about 1,000 rows/s, not the burst's
// rate nor a pass's count over its own duration.
func TestRateAcrossPasses(t *testing.T) {
	var r Rate
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var total int64
	var rate float64
	for pass := range 30 {
		start := t0.Add(time.Duration(pass) * 5 * time.Second)
		// Five batches of 1,000 rows 20 ms apart: the burst runs at 50,000 rows/s.
		for b := range 5 {
			total += 1000
			rate = r.Add(start.Add(time.Duration(b)*20*time.Millisecond), total)
		}
	}
	if math.Abs(rate-1000) > 50 {
		t.Errorf("rate across passes = %.0f rows/s, want about 1000", rate)
	}
	// The window is the last minute: an idle minute brings it to nothing.
	if got := r.Add(t0.Add(30*5*time.Second+2*RateWindow), total); got != 0 {
		t.Errorf("after two idle minutes the rate is %.0f, want 0", got)
	}
}

func TestRateNeedsTwoSamples(t *testing.T) {
	var r Rate
	if _, ok := r.PerSecond(); ok {
		t.Error("a rate without samples")
	}
	r.Add(time.Now(), 10)
	if _, ok := r.PerSecond(); ok {
		t.Error("a rate from one sample")
	}
}

// Slope keeps the sign that PerSecond drops: a count that rose by 10 a
// second is +10, one that fell by as much -10, and PerSecond says 10 for
// both.
func TestRateSlope(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, step := range []int64{10, -10} {
		var r Rate
		r.Add(t0, 1000)
		r.Add(t0.Add(10*time.Second), 1000+10*step)
		if s, ok := r.Slope(); !ok || s != float64(step) {
			t.Errorf("slope %v (%v), want %d", s, ok, step)
		}
		if v, _ := r.PerSecond(); v != 10 {
			t.Errorf("per second %v, want 10", v)
		}
	}
}

// A pass longer than the window, sampled at its start and its end, is its
// rows over its own duration: the sample before the window is kept.
func TestRateOverALongPass(t *testing.T) {
	var r Rate
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r.Add(t0, 1000)                                         // the pass before ends
	r.Add(t0.Add(500*time.Millisecond), 1000)               // this pass starts
	got := r.Add(t0.Add(70500*time.Millisecond), 1000+8757) // and ends 70 s later
	if math.Abs(got-8757.0/70) > 1 {
		t.Errorf("rate %.0f rows/s, want %.0f (8,757 rows over 70 s)", got, 8757.0/70)
	}
}

// Span says how much of the window the samples cover: a count younger
// than a minute covers less.
func TestRateSpan(t *testing.T) {
	var r Rate
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r.Add(t0, 0)
	if r.Span() != 0 {
		t.Errorf("one sample spans %s", r.Span())
	}
	r.Add(t0.Add(100*time.Millisecond), 5000)
	if r.Span() != 100*time.Millisecond {
		t.Errorf("a first pass of 100 ms spans %s", r.Span())
	}
	for i := 1; i <= 3; i++ {
		r.Add(t0.Add(time.Duration(i)*time.Minute), int64(5000*(i+1)))
	}
	if r.Span() < RateWindow {
		t.Errorf("three minutes of passes span %s, want the window at least", r.Span())
	}
}
