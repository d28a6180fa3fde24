package pgtest

import (
	"sync"
	"testing"
	"time"
)

// ReplayStall pauses a standby's replay while a run's batches go on, and
// says which batches ended once the throttle should have held them: the
// standby promise's test for every writer that runs in batches. The run's
// progress hook calls BatchEnded after each batch.
type ReplayStall struct {
	mu              sync.Mutex
	ends            []time.Time
	paused, resumed time.Time
	during          int // batches ended when replay resumed
}

// BatchEnded records a batch's end.
func (s *ReplayStall) BatchEnded() {
	s.mu.Lock()
	s.ends = append(s.ends, time.Now())
	s.mu.Unlock()
}

func (s *ReplayStall) batches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ends)
}

// Stall waits for the run's first three batches, pauses replay on the
// standby at url, waits until held says the throttle holds the batches
// back, calls whileHeld (checks of the throttle's state) and resumes
// replay.
func (s *ReplayStall) Stall(t testing.TB, url string, held func() bool, whileHeld func()) {
	t.Helper()
	WaitFor(t, 30*time.Second, "the first batches", func() bool { return s.batches() >= 3 })
	ExecOn(t, url, "SELECT pg_wal_replay_pause()")
	s.paused = time.Now()
	WaitFor(t, 30*time.Second, "the throttle to see the lag", held)
	whileHeld()
	s.during = s.batches()
	ExecOn(t, url, "SELECT pg_wal_replay_resume()")
	s.resumed = time.Now()
}

// Late counts the batches that ended while replay was paused, later than
// crossed after the pause (when the lag was over the threshold and the
// throttle could see it): at most one may be in flight then.
func (s *ReplayStall) Late(crossed time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	late := 0
	for _, at := range s.ends[:s.during] {
		if at.After(s.paused.Add(crossed)) && at.Before(s.resumed) {
			late++
		}
	}
	return late
}

// Outlived reports whether batches ended after replay resumed: a run that
// ended before the lag held it back proves nothing.
func (s *ReplayStall) Outlived() bool { return s.batches() > s.during }
