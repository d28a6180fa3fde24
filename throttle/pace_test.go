package throttle

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// sim is a fake standby that applies WAL at a fixed rate, read every 50 ms
// on a fake clock, and a daemon that writes what the pacer admits.
type sim struct {
	t       *testing.T
	p       *pacer
	now     time.Time
	rate    float64 // bytes/s the standby applies
	written float64 // the primary's WAL position
	applied float64 // the standby's replay position
	perRow  float64
	peak    float64 // most bytes behind at any reading
	batches int
	maxLag  time.Duration
}

func newSim(t *testing.T, rate float64, maxLag time.Duration) *sim {
	s := &sim{t: t, p: newPacer(fixed(maxLag)), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rate: rate, perRow: 600, maxLag: maxLag}
	s.read()
	return s
}

// read is one pg_stat_replication reading.
func (s *sim) read() {
	s.p.readStarted(s.now)
	behind := s.written - s.applied
	s.peak = max(s.peak, behind)
	s.p.observe("s1", s.applied, behind, behind, s.now)
}

// tick lets 50 ms pass and reads.
func (s *sim) tick() {
	s.now = s.now.Add(50 * time.Millisecond)
	s.applied = min(s.written, s.applied+s.rate*0.05)
	s.read()
}

// step admits and writes one batch if the pacer lets it, then ticks. A
// batch of up to 5000 rows; the minimum is 100.
func (s *sim) step() {
	a := s.p.admit(5000, 100, s.perRowKnown())
	if a.Rows > 0 {
		if a.Behind+a.Predicted > a.Window {
			s.t.Fatalf("admitted %d rows: %.0f behind + %.0f predicted > window %.0f", a.Rows, a.Behind, a.Predicted, a.Window)
		}
		wal := float64(a.Rows) * s.perRow
		s.written += wal
		s.p.wrote(s.now, wal)
		s.batches++
	}
	s.tick()
}

func (s *sim) perRowKnown() float64 {
	if s.batches == 0 {
		return 0
	}
	return s.perRow
}

func (s *sim) standby() *standby { return s.p.standbys["s1"] }

func TestPacerNoStandby(t *testing.T) {
	p := newPacer(fixed(time.Second))
	if a := p.admit(5000, 100, 0); a.Rows != 5000 || a.Hold != "" {
		t.Errorf("without a standby the sizer's size goes through: %+v", a)
	}
}

// TestPacerSlowStartAndSteadyState: from a small window, the window grows
// to about windowFactor x rate x MAX_REPLICA_LAG as the apply rate is
// measured; the queue never exceeds the window, and the standby is busy all
// along once the window is open (the daemon writes as fast as it applies).
func TestPacerSlowStartAndSteadyState(t *testing.T) {
	for _, c := range []struct {
		rate   float64
		maxLag time.Duration
	}{{8 << 20, time.Second}, {2 << 20, time.Second}, {2 << 20, 5 * time.Second}, {8 << 20, 5 * time.Second}} {
		s := newSim(t, c.rate, c.maxLag)
		if a := s.p.admit(5000, 100, 0); a.Rows != 100 || a.Predicted != 100*firstRowBytes || a.Window > floorWindow+busyBytes {
			t.Fatalf("first batch: %+v, want the minimum 100 rows at %d B a row, in a small window", a, firstRowBytes)
		}
		for range 200 { // 10 s
			s.step()
			// Slow start: until the rate is measured, the window grows at
			// most by what the standby replayed.
			if st := s.standby(); !st.measured() && s.p.window(st) > floorWindow+s.applied/2 {
				t.Fatalf("%v: window %.0f before the rate is measured, more than 256 KiB + half the %.0f bytes replayed", c.rate, s.p.window(st), s.applied)
			}
		}
		target := windowFactor * c.rate * c.maxLag.Seconds()
		w := s.p.window(s.standby())
		if math.Abs(w-target) > 0.05*target {
			t.Errorf("%v at %v: window %.0f after 10 s, want about %.0f", c.rate, c.maxLag, w, target)
		}
		if r := s.standby().rate(); math.Abs(r-c.rate) > 0.02*c.rate || len(s.standby().samples) == 0 {
			t.Errorf("%v: apply rate %.0f, want %.0f measured", c.rate, r, c.rate)
		}
		if s.peak > target*1.01 {
			t.Errorf("%v at %v: peak queue %.0f bytes above the window %.0f", c.rate, c.maxLag, s.peak, target)
		}
		// Steady state: over the next 10 s the standby applies at its full rate.
		from := s.applied
		for range 200 {
			s.step()
		}
		if got := (s.applied - from) / 10; got < 0.97*c.rate {
			t.Errorf("%v at %v: the standby applied %.0f B/s, want its full %.0f (the window starves it)", c.rate, c.maxLag, got, c.rate)
		}
		if mult := s.standby().multiplier; mult != 1 {
			t.Errorf("%v at %v: multiplier %v without any overshoot", c.rate, c.maxLag, mult)
		}
	}
}

// TestPacerCutsOnOvershoot: another writer puts 20 MiB in the standby's
// queue (2.5 s at its 8 MiB/s); the queue measures more than
// MAX_REPLICA_LAG and the multiplier halves, once for the whole overshoot
// (the queue drains for seconds), then grows back by growStep per
// MAX_REPLICA_LAG once the queue is under it again and the window limits
// the daemon.
func TestPacerCutsOnOvershoot(t *testing.T) {
	s := newSim(t, 8<<20, time.Second)
	for range 200 {
		s.step()
	}
	st := s.standby()
	s.written += 20 << 20
	for range 20 { // 1 s: still draining
		s.step()
	}
	if st.multiplier != 0.5 {
		t.Fatalf("multiplier %v after an overshoot, want 0.5 (one cut per overshoot)", st.multiplier)
	}
	for range 300 {
		s.step()
	}
	if r := st.rate(); math.Abs(r-(8<<20)) > 0.05*(8<<20) {
		t.Errorf("rate %.0f after the overshoot, want 8 MiB/s", r)
	}
	if st.multiplier != 1 {
		t.Errorf("multiplier %v after 15 s back under the target, want 1 again", st.multiplier)
	}

	// Growth is additive: one growStep per MAX_REPLICA_LAG while busy.
	st.multiplier, st.cutAt, st.grewAt = minMultiplier, time.Time{}, s.now
	for range 21 { // 1.05 s: one growth step at most
		s.step()
	}
	if want := minMultiplier + growStep; math.Abs(st.multiplier-want) > 1e-9 {
		t.Errorf("multiplier %v after 1 s, want %v", st.multiplier, want)
	}
}

func TestPacerHeartbeatLagCuts(t *testing.T) {
	s := newSim(t, 8<<20, time.Second)
	for range 100 {
		s.step()
	}
	before := s.p.window(s.standby())
	s.p.lagged(0.9, s.now)
	if s.standby().multiplier != 1 {
		t.Fatal("a heartbeat lag under MAX_REPLICA_LAG cut the window")
	}
	s.p.lagged(1.2, s.now)
	s.p.lagged(1.5, s.now.Add(100*time.Millisecond))
	if s.standby().multiplier != 0.5 {
		t.Fatalf("multiplier %v after two heartbeat overshoots within MAX_REPLICA_LAG, want 0.5", s.standby().multiplier)
	}
	if after := s.p.window(s.standby()); math.Abs(after-before/2) > 0.05*before {
		t.Errorf("window %.0f after a cut, want about half of %.0f", after, before)
	}
	// The lag measured after a cut still shows the queue written before it:
	// no second cut until a reading was under MAX_REPLICA_LAG again.
	s.p.lagged(1.5, s.now.Add(2*time.Second))
	if s.standby().multiplier != 0.5 {
		t.Errorf("multiplier %v: cut again within one overshoot", s.standby().multiplier)
	}
	s.p.lagged(0.5, s.now.Add(2100*time.Millisecond))
	s.p.lagged(1.5, s.now.Add(2200*time.Millisecond))
	if s.standby().multiplier != 0.25 {
		t.Errorf("multiplier %v after a second overshoot, want 0.25", s.standby().multiplier)
	}
}

// TestPacerBurstDoesNotInflateRate: one reading with an outsized replay
// progress (a standby that saved up) is one sample of five: the median
// ignores it, once the trailing three seconds have forgotten it.
func TestPacerBurstDoesNotInflateRate(t *testing.T) {
	p := newPacer(fixed(time.Second))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	replayed, behind := 0.0, float64(10<<20)
	for i := range 80 { // 4 s of readings at 50 ms, 1 MiB/s, always 10 MiB behind
		now = now.Add(50 * time.Millisecond)
		replayed += 1 << 20 / 20
		if i == 7 {
			replayed += 4 << 20 // a burst
		}
		p.observe("s1", replayed, behind, behind, now)
	}
	if r := p.standbys["s1"].rate(); math.Abs(r-(1<<20)) > 0.01*(1<<20) {
		t.Errorf("rate %.0f, want 1 MiB/s despite one burst", r)
	}
}

// TestPacerRateNotBelowProgress: samples that underestimate the standby
// cannot shrink the window below what it was just seen to replay.
func TestPacerRateNotBelowProgress(t *testing.T) {
	s := newSim(t, 8<<20, time.Second)
	for range 100 {
		s.step()
	}
	st := s.standby()
	for i := range st.samples {
		st.samples[i] = 1 << 10 // 1 KiB/s: measured in a bad moment
	}
	for range 100 {
		s.step()
	}
	if r := st.rate(); r < 0.9*(8<<20) {
		t.Errorf("rate %.0f after wrong samples, want about 8 MiB/s again", r)
	}
}

func TestPacerFailsClosed(t *testing.T) {
	p := newPacer(fixed(time.Second))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p.observe("s1", 1000, 0, 0, now)
	if a := p.admit(5000, 100, 500); a.Rows == 0 {
		t.Fatalf("an idle standby holds: %+v", a)
	}
	p.failure = "cannot read pg_stat_replication: boom"
	if a := p.admit(5000, 100, 500); a.Rows != 0 || !strings.Contains(a.Hold, "boom") {
		t.Errorf("a failed reading must hold and say why: %+v", a)
	}
	p.failure = ""
	p.observe("s2", -1, 0, 0, now) // connected, no replay position yet
	if a := p.admit(5000, 100, 500); a.Rows != 0 || !strings.Contains(a.Hold, "s2") {
		t.Errorf("a standby without a replay position must hold: %+v", a)
	}
	p.forget(map[string]bool{"s1": true})
	if a := p.admit(5000, 100, 500); a.Rows == 0 {
		t.Errorf("after s2 went away: %+v", a)
	}
}

// TestWriterPace: a writer that cannot be split into batches (a VACUUM)
// starts once the standby's queue is within half its window, may write at
// the rate the window measures (the standby's apply rate once measured),
// and is told to stop (overrun) once the queue is over two windows, 0.8 x
// MAX_REPLICA_LAG of apply: at its pace the standby keeps up and it runs
// to its end; at 1.5 times the standby's rate it is stopped before the
// queue is a second of apply. A failed reading holds and stops it; a
// standby without a replay position holds it.
func TestWriterPace(t *testing.T) {
	for _, c := range []struct {
		rate   float64
		maxLag time.Duration
	}{{8 << 20, time.Second}, {2 << 20, 5 * time.Second}} {
		s := newSim(t, c.rate, c.maxLag)
		for range 200 { // 10 s of batches: the rate is measured
			s.step()
		}
		var wp service.WriterPace
		for i := 0; ; i++ {
			p, hold := s.p.writerPace()
			if hold == "" {
				wp = p
				break
			}
			if behind := s.written - s.applied; behind <= s.p.window(s.standby())/2 || i > 100 {
				t.Fatalf("%v: the writer is held (%s) with %.0f behind, within half the window", c.rate, hold, behind)
			}
			s.tick()
		}
		if behind := s.written - s.applied; behind > wp.Window/2 {
			t.Errorf("%v: the writer starts %.0f behind, over half its window %.0f", c.rate, behind, wp.Window)
		}
		if !wp.Measured || math.Abs(wp.Rate-c.rate) > 0.05*c.rate || wp.Standby != "s1" {
			t.Fatalf("%v: writer pace %+v, want the measured %.0f B/s of s1", c.rate, wp, c.rate)
		}
		write := func(share float64, seconds int) (ticks int, overrun string) {
			for ticks = 1; ticks <= seconds*20; ticks++ {
				s.written += share * wp.Rate * 0.05
				s.tick()
				if overrun = s.p.overrun(); overrun != "" {
					return ticks, overrun
				}
			}
			return ticks, ""
		}
		if _, why := write(0.8, 30); why != "" {
			t.Errorf("%v: a writer at 0.8 of the standby's rate was stopped: %s", c.rate, why)
		}
		ticks, why := write(1.5, 60)
		if why == "" {
			t.Fatalf("%v: a writer at 1.5 times the standby's rate ran 60 s unstopped", c.rate)
		}
		queue := (s.written - s.applied) / c.rate
		if lim := overrunWindows * windowFactor * c.maxLag.Seconds(); queue > lim*1.1 || queue < lim*0.9 {
			t.Errorf("%v: stopped after %d ticks with %.2f s of apply queued (%s), want about %.2f", c.rate, ticks, queue, why, lim)
		}
	}

	p := newPacer(fixed(time.Second))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if wp, hold := p.writerPace(); hold != "" || wp.Paced() || !math.IsInf(wp.Rate, 1) {
		t.Errorf("no standby: %+v (%s), want an unpaced writer", wp, hold)
	}
	p.observe("s1", 1000, 0, 0, now)
	p.failure = "cannot read pg_stat_replication: boom"
	if _, hold := p.writerPace(); !strings.Contains(hold, "boom") {
		t.Errorf("a failed reading lets a writer start: %q", hold)
	}
	if why := p.overrun(); !strings.Contains(why, "boom") {
		t.Errorf("a failed reading does not stop a writer: %q", why)
	}
	p.failure = ""
	p.observe("s2", -1, 0, 0, now)
	if _, hold := p.writerPace(); !strings.Contains(hold, "s2") {
		t.Errorf("a standby without a replay position lets a writer start: %q", hold)
	}
}

// TestPacerCountsUnreadWAL: WAL written after the last reading began counts
// as behind, until a reading that includes it.
func TestPacerCountsUnreadWAL(t *testing.T) {
	p := newPacer(fixed(time.Second))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p.observe("s1", 0, 0, 0, now)
	a := p.admit(5000, 100, 500)
	if a.Rows != 262 { // half the floor window, 256 KiB, at 500 B a row
		t.Fatalf("admitted %d rows, want 262", a.Rows)
	}
	p.wrote(now.Add(time.Millisecond), a.Predicted)
	if b := p.admit(5000, 100, 500); b.Rows != 262 || b.Behind != a.Predicted {
		t.Fatalf("second batch: %+v, want another half window with the first counted as behind", b)
	}
	p.wrote(now.Add(time.Millisecond), a.Predicted)
	if b := p.admit(5000, 100, 500); b.Rows != 0 {
		t.Fatalf("admitted %d more rows before any reading saw the first batch", b.Rows)
	}
	p.readStarted(now.Add(time.Millisecond / 2)) // began before the commit: the batch is not in it
	p.observe("s1", 0, 0, 0, now.Add(time.Millisecond/2))
	if b := p.admit(5000, 100, 500); b.Rows != 0 {
		t.Fatal("a reading that began before the commit released its WAL")
	}
	p.readStarted(now.Add(2 * time.Millisecond))
	p.observe("s1", 2*a.Predicted, 0, 0, now.Add(2*time.Millisecond))
	if b := p.admit(5000, 100, 500); b.Rows == 0 {
		t.Fatalf("held after the standby applied everything: %+v", b)
	}
}

// TestPacerSlowerThanOneBatch: a standby that applies less than one
// minimum batch in MAX_REPLICA_LAG gets one minimum batch at a time, when
// it has caught up.
func TestPacerSlowerThanOneBatch(t *testing.T) {
	s := newSim(t, 200<<10, 100*time.Millisecond) // 200 KiB/s: 20 KiB per MAX_REPLICA_LAG
	s.perRow = 10 << 10                           // 1 MiB a minimum batch
	for range 400 {
		s.step()
	}
	if s.batches < 3 {
		t.Fatalf("%d batches in 20 s: a standby too slow for the window must still get minimum batches", s.batches)
	}
	if s.peak > float64(100*(10<<10)+busyBytes) {
		t.Errorf("peak queue %.0f, want at most one minimum batch and the slack", s.peak)
	}
}

// fixed is a MAX_REPLICA_LAG that never changes.
func fixed(maxLag time.Duration) func() time.Duration { return func() time.Duration { return maxLag } }
