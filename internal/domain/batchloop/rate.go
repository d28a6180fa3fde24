package batchloop

import "time"

// RateWindow is the span a Rate measures over.
const RateWindow = time.Minute

// Rate is how fast a count changes over the last RateWindow, from samples
// of it: a running total of rows deleted across passes (a daemon keeping up
// with 1,000 rows/s says about 1,000, not a pass's burst), or the fall of a
// due count between rounds of status --watch. The zero value is ready.
type Rate struct {
	samples []rateSample
}

type rateSample struct {
	at time.Time
	n  int64
}

// Add records the count n at at and returns the rate of change, in units
// per second, over the last RateWindow (0 until there are two samples). It
// keeps the last sample from before the window too, so that a rate spans
// the whole window however far apart the samples are: a pass of 70 s,
// sampled at its start and its end, is its rows over its 70 s (with only
// the samples inside the window, it had none to compare, or one taken a
// moment before by a pass that had just stopped, and said 14,526 rows/s).
func (r *Rate) Add(at time.Time, n int64) float64 {
	s := append(r.samples, rateSample{at, n})
	for len(s) > 2 && at.Sub(s[1].at) >= RateWindow {
		s = s[1:]
	}
	r.samples = s
	v, _ := r.PerSecond()
	return v
}

// Span is the time the samples kept cover: less than RateWindow while the
// count is younger than that.
func (r *Rate) Span() time.Duration {
	if len(r.samples) < 2 {
		return 0
	}
	return r.samples[len(r.samples)-1].at.Sub(r.samples[0].at)
}

// PerSecond is the rate of change over the samples kept, falling or
// rising alike, and whether there are two to compare.
func (r *Rate) PerSecond() (float64, bool) {
	v, ok := r.Slope()
	if v < 0 {
		v = -v
	}
	return v, ok
}

// Slope is the change per second over the samples kept, negative where the
// count fell, and whether there are two to compare.
func (r *Rate) Slope() (float64, bool) {
	s := r.samples
	if len(s) < 2 {
		return 0, false
	}
	first, last := s[0], s[len(s)-1]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 {
		return 0, false
	}
	return float64(last.n-first.n) / dt, true
}
