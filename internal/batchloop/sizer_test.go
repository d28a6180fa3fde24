package batchloop

import (
	"testing"
	"time"
)

func TestSizer(t *testing.T) {
	s := NewSizer(1000, 100, 5000, 200*time.Millisecond)
	s.Observe(1000, 100*time.Millisecond) // fast and full: grow, at most 1.2x
	if s.Size() != 1200 {
		t.Errorf("after a fast full batch: %d, want 1200", s.Size())
	}
	s.Observe(10, time.Millisecond) // short batch: the end of the data says nothing
	if s.Size() != 1200 {
		t.Errorf("after a short batch: %d, want 1200", s.Size())
	}
	s.Observe(1200, 300*time.Millisecond) // overran by 1.5x: shrink to 2/3
	if s.Size() != 800 {
		t.Errorf("after an overrun: %d, want 800", s.Size())
	}
	s.Observe(800, 10*time.Second) // far over: at most halve
	if s.Size() != 400 {
		t.Errorf("after a huge overrun: %d, want 400", s.Size())
	}
	s.Pressure()
	s.Pressure()
	s.Pressure()
	if s.Size() != 100 {
		t.Errorf("after pressure: %d, want the minimum 100", s.Size())
	}
	for range 50 {
		s.Observe(s.Size(), time.Millisecond)
	}
	if s.Size() != 5000 {
		t.Errorf("after many fast batches: %d, want the maximum 5000", s.Size())
	}
	if NewSizer(10, 100, 5000, time.Second).Size() != 100 {
		t.Error("start size not clamped")
	}
}

func TestSizerPerRow(t *testing.T) {
	s := NewSizer(10000, 100, 50000, time.Second)
	if s.PerRow() != 0 || s.Min() != 100 {
		t.Errorf("a new sizer: per row %v, min %d", s.PerRow(), s.Min())
	}
	s.ObserveWAL(1000, 500*1000) // 500 bytes a row
	s.ObserveWAL(0, 1000)        // nothing deleted: says nothing
	if s.PerRow() != 500 {
		t.Errorf("per row %v, want 500", s.PerRow())
	}
	s.ObserveWAL(1000, 1000*1000)
	if got := s.PerRow(); got != 650 {
		t.Errorf("per row after a 1000 B/row batch: %v, want 650 (0.7 x 500 + 0.3 x 1000)", got)
	}
}

// TestSizerGrowsFastWhileFarBelowTarget: batches that take a quarter of the
// target or less double the size, and Grown says so; a batch nearer the
// target grows 1.2x at most; a batch of at least half the size counts by
// the time the full size would have taken.
func TestSizerGrowsFastWhileFarBelowTarget(t *testing.T) {
	s := NewSizer(5000, 100, 50000, 200*time.Millisecond)
	if s.Grown() != 6000 {
		t.Errorf("Grown before any batch: %d, want 6000 (1.2x)", s.Grown())
	}
	s.Observe(5000, 50*time.Millisecond) // a quarter of the target: double
	if s.Size() != 10000 || s.Grown() != 20000 {
		t.Errorf("after a batch at a quarter of the target: size %d, Grown %d; want 10000, 20000", s.Size(), s.Grown())
	}
	// 6,000 of 10,000 rows in 30 ms: 50 ms at the full size, still a quarter.
	s.Observe(6000, 30*time.Millisecond)
	if s.Size() != 20000 {
		t.Errorf("after 6,000 of 10,000 rows in 30 ms: %d, want 20000", s.Size())
	}
	// 9,000 of 20,000 rows: less than half the size says nothing.
	s.Observe(9000, time.Millisecond)
	if s.Size() != 20000 || s.Grown() != 40000 {
		t.Errorf("after a batch under half the size: size %d, Grown %d; want 20000, 40000", s.Size(), s.Grown())
	}
	// Just over a quarter of the target: 1.2x, and Grown says 1.2x next.
	s.Observe(20000, 51*time.Millisecond)
	if s.Size() != 24000 || s.Grown() != 28800 {
		t.Errorf("after a batch just over a quarter of the target: size %d, Grown %d; want 24000, 28800", s.Size(), s.Grown())
	}
	s.Observe(24000, 10*time.Millisecond)
	s.Pressure()
	if s.Size() != 24000 || s.Grown() != 28800 {
		t.Errorf("after doubling, then pressure: size %d, Grown %d; want 24000, 28800", s.Size(), s.Grown())
	}
	for range 10 {
		s.Observe(s.Size(), time.Millisecond)
	}
	if s.Size() != 50000 || s.Grown() != 50000 {
		t.Errorf("after many fast batches: size %d, Grown %d; want the ceiling 50000", s.Size(), s.Grown())
	}
}
