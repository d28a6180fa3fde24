package batchloop

import (
	"sync"
	"time"
)

// Sizer adapts a batch size toward a target batch duration: it grows by at
// most 1.2x a step, shrinks in proportion to how far a batch overran (at
// most halving), halves on pressure, and stays within [Min, Max].
type Sizer struct {
	mu       sync.Mutex
	size     int
	min, max int
	target   time.Duration
	perRow   float64 // WAL bytes a deleted row costs, averaged; 0 until measured
	observed bool    // a batch has been observed
	// probe, when not 0, is the size of the next batch, a probe (Probe);
	// before is the size it was asked at.
	probe, before int
}

// NewSizer starts at start (clamped into [min, max]).
func NewSizer(start, min, max int, target time.Duration) *Sizer {
	s := &Sizer{min: min, max: max, target: target}
	s.size = s.clamp(start)
	return s
}

// maxGrowth is the most a batch size grows in one step.
const maxGrowth = 1.2

func (s *Sizer) clamp(n int) int { return max(s.min, min(s.max, n)) }

// Size is the size of the next batch.
func (s *Sizer) Size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probe > 0 {
		return s.probe
	}
	return s.size
}

// Probe makes the next batch a probe of about a tenth of the size (at least
// the minimum), when the sizer adapts and has seen no batch yet: for a
// table whose deletes cost more per row than a plain row's (triggers,
// foreign key checks, TOAST), where a first batch of the full size could
// take many times the target. The batch after it is as large as the
// probe's time per row fits in the target, never larger than the size
// before the probe; the sizer adapts as ever from there.
func (s *Sizer) Probe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.observed || s.target <= 0 || s.probe > 0 {
		return
	}
	s.before = s.size
	s.probe = s.clamp(s.size / 10)
}

// Observe records a batch of n rows that took d. Only a full batch says
// anything about growing; any batch that overran says to shrink.
func (s *Sizer) Observe(n int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d <= 0 || s.target <= 0 {
		return
	}
	s.observed = true
	if s.probe > 0 {
		s.probe = 0
		if n > 0 {
			perRow := float64(d) / float64(n)
			s.size = s.clamp(min(s.before, int(float64(s.target)/perRow)))
		}
		return
	}
	ratio := float64(s.target) / float64(d)
	if ratio > 1 && n < s.size {
		return
	}
	ratio = max(0.5, min(maxGrowth, ratio))
	s.size = s.clamp(int(float64(s.size) * ratio))
}

// Grown is the largest size the next batch can have: the size grown by the
// most one full batch grows it.
func (s *Sizer) Grown() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clamp(int(float64(s.size) * maxGrowth))
}

// Pressure halves the size: a lock timeout, a statement timeout or a
// session waiting on the batch. A probe not yet observed is dropped: what
// it would have measured is lost with its batch.
func (s *Sizer) Pressure() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probe = 0
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
