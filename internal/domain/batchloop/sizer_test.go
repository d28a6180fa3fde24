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

// A probe: a tenth of the size, then at once the size its time per row
// fits in the target, never more than before; and only before any batch.
func TestSizerProbe(t *testing.T) {
	s := NewSizer(5000, 100, 50000, 200*time.Millisecond)
	s.Probe()
	if s.Size() != 500 {
		t.Fatalf("probe %d, want 500", s.Size())
	}
	s.Observe(500, 500*time.Millisecond) // 1 ms a row: 200 rows fit
	if s.Size() != 200 {
		t.Errorf("after a probe of 1 ms a row: %d, want 200", s.Size())
	}
	s.Probe() // a batch was seen: no probe
	if s.Size() != 200 {
		t.Errorf("a second probe: %d, want 200", s.Size())
	}
	cheap := NewSizer(5000, 100, 50000, 200*time.Millisecond)
	cheap.Probe()
	cheap.Observe(500, 5*time.Millisecond) // cheap rows: back to the size before, not more
	if cheap.Size() != 5000 {
		t.Errorf("after a cheap probe: %d, want 5000", cheap.Size())
	}
	fixed := NewSizer(5000, 5000, 5000, 0)
	fixed.Probe()
	if fixed.Size() != 5000 {
		t.Errorf("a fixed size probed: %d", fixed.Size())
	}
}

// Pressure during a probe drops the probe and halves the size.
func TestSizerProbeUnderPressure(t *testing.T) {
	s := NewSizer(100, 10, 1000, time.Minute)
	s.Probe()
	s.Pressure()
	if s.Size() != 50 {
		t.Errorf("after pressure on a probe: %d, want 50", s.Size())
	}
}
