package batchloop

import (
	"sync"
	"time"
)

// Sizer adapts a batch size toward a target batch duration: it doubles
// after a batch that took at most a quarter of the target, grows by at most
// 1.2x after one that took more, shrinks in proportion to how far a batch
// overran (at most halving), halves on pressure, and stays within [Min,
// Max].
type Sizer struct {
	mu       sync.Mutex
	size     int
	min, max int
	target   time.Duration
	perRow   float64 // WAL bytes a deleted row costs, averaged; 0 until measured
	fast     bool    // the last step doubled the size
}

// NewSizer starts at start (clamped into [min, max]).
func NewSizer(start, min, max int, target time.Duration) *Sizer {
	s := &Sizer{min: min, max: max, target: target}
	s.size = s.clamp(start)
	return s
}

// How a batch size grows. After a batch that took at most 1/fastShare of
// the target it doubles: the next batch, if time grows with rows, takes at
// most half the target. A pass of short batches (a scattered sweep's first
// slices took 5 to 9 ms of a 200 ms target) otherwise paid a transaction's
// round trips for each of the dozen steps from 5,000 to 50,000 rows
// (docs/design/expiry.md, "Fewer, larger slices at the start"). Nearer the
// target it grows by at most maxGrowth, so that it settles there.
const (
	maxGrowth  = 1.2
	fastGrowth = 2.0
	fastShare  = 4
)

func (s *Sizer) clamp(n int) int { return max(s.min, min(s.max, n)) }

// Size is the size of the next batch.
func (s *Sizer) Size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Observe records a batch of n rows that took d. Any batch that overran
// says to shrink. Only a batch of at least half the size says anything
// about growing (the last one of a pass may hold a few rows), judged by the
// time it would have taken at the full size: a sweep's slice holds about as
// many rows as its pages were predicted to hold, fewer about half the time,
// and the throttle may admit fewer rows than the size.
func (s *Sizer) Observe(n int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d <= 0 || s.target <= 0 {
		return
	}
	ratio := float64(s.target) / float64(d)
	if ratio <= 1 {
		s.fast = false
		s.size = s.clamp(int(float64(s.size) * max(0.5, ratio)))
		return
	}
	if n <= 0 || 2*n < s.size {
		return
	}
	if n < s.size {
		ratio *= float64(n) / float64(s.size)
	}
	s.fast = ratio >= fastShare
	growth := min(maxGrowth, max(1, ratio))
	if s.fast {
		growth = fastGrowth
	}
	s.size = s.clamp(int(float64(s.size) * growth))
}

// Grown is the size the next batch has if the batch in flight grows it as
// the last one did: doubled after a step that doubled, else 1.2x. (The
// bound read ahead is read for this size, and used only when the next
// batch has exactly it.)
func (s *Sizer) Grown() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fast {
		return s.clamp(int(float64(s.size) * fastGrowth))
	}
	return s.clamp(int(float64(s.size) * maxGrowth))
}

// Pressure halves the size: a lock timeout, a statement timeout or a
// session waiting on the batch.
func (s *Sizer) Pressure() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fast = false
	s.size = s.clamp(s.size / 2)
}

// ObserveWAL records the WAL a batch of n rows wrote.
func (s *Sizer) ObserveWAL(n int, bytes float64) {
	if n <= 0 || bytes <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	per := bytes / float64(n)
	if s.perRow == 0 {
		s.perRow = per
	} else {
		s.perRow = 0.7*s.perRow + 0.3*per
	}
}

// PerRow is the WAL a deleted row costs, averaged; 0 until measured.
func (s *Sizer) PerRow() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perRow
}

// Min is the smallest batch.
func (s *Sizer) Min() int { return s.min }
