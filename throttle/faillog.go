package throttle

import (
	"log/slog"
	"sync"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/service"
)

// failLogEvery is how often a signal that keeps failing for the same cause
// is logged again: a database that is down fails every collector 20 times
// a second.
const failLogEvery = 30 * time.Second

// failLog logs a failing signal once when it starts failing (or fails for a
// new cause), then at most once per failLogEvery per cause with a count of
// the failures in between, and once when it works again.
type failLog struct {
	log *slog.Logger
	now service.Clock

	mu      sync.Mutex
	signals map[string]*failing // by signal
}

type failing struct {
	failures int                  // since the signal started failing
	causes   map[string]*causeLog // by error text
}

type causeLog struct {
	logged  time.Time
	repeats int // failures not logged since
}

func newFailLog(log *slog.Logger, now service.Clock) *failLog {
	return &failLog{log: log, now: now, signals: map[string]*failing{}}
}

// failed records a failed reading of signal.
func (f *failLog) failed(signal string, err error) {
	now := f.now.Now()
	cause := err.Error()
	f.mu.Lock()
	s := f.signals[signal]
	if s == nil {
		s = &failing{causes: map[string]*causeLog{}}
		f.signals[signal] = s
	}
	s.failures++
	c := s.causes[cause]
	if c == nil {
		c = &causeLog{}
		s.causes[cause] = c
	}
	if !c.logged.IsZero() && now.Sub(c.logged) < failLogEvery {
		c.repeats++
		f.mu.Unlock()
		return
	}
	repeats := c.repeats
	c.logged, c.repeats = now, 0
	f.mu.Unlock()
	if repeats == 0 {
		f.log.Warn("throttle: reading failed", "signal", signal, "error", err)
		return
	}
	f.log.Warn("throttle: reading still failing", "signal", signal, "error", err, "repeats", repeats, "since_last_log", failLogEvery)
}

// ok records a successful reading of signal.
func (f *failLog) ok(signal string) {
	f.mu.Lock()
	s := f.signals[signal]
	delete(f.signals, signal)
	f.mu.Unlock()
	if s != nil {
		f.log.Info("throttle: reading works again", "signal", signal, "failures", s.failures)
	}
}
