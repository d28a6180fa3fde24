package throttle

import (
	"log/slog"
	"sync"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// failLog logs a failing signal (a reading of the primary, a standby that
// cannot be read, the heartbeat's write) once when it starts failing, once
// more for each new cause while it fails (outage.Cause: the classes, not
// the error's text), and once when it works again, with how long it failed
// and how often. A database that is down fails every collector 20 times a
// second: the failures between are only counted, however long it lasts.
type failLog struct {
	log *slog.Logger

	mu       sync.Mutex
	episodes *outage.Log
	// shared, when set, is the daemon's log of lasting failures: a reading
	// of the primary that fails because the database does not answer is
	// its outage, said once for the daemon (Throttler.ShareOutages).
	shared *outage.Log
}

func newFailLog(log *slog.Logger, now service.Clock) *failLog {
	return &failLog{log: log, episodes: outage.New(now.Now)}
}

// ShareOutages makes the throttle's failures that are the database not
// answering part of l's account of its outages (outage.Log.DatabaseFailed),
// and its successful readings of the primary the end of one. Call it
// before Start.
func (t *Throttler) ShareOutages(l *outage.Log) {
	t.fails.mu.Lock()
	defer t.fails.mu.Unlock()
	t.fails.shared = l
}

// failed records a failed reading of signal on the primary.
func (f *failLog) failed(signal string, err error) {
	f.mu.Lock()
	shared := f.shared
	f.mu.Unlock()
	if shared.DatabaseFailed(err) {
		return
	}
	f.said(signal, err, "throttle: reading failed")
}

// standbyFailed records a failed reading of a listed standby: a database of
// its own, whose failures the primary's outage does not cover.
func (f *failLog) standbyFailed(name string, err error, failOpen bool) {
	msg := "throttle: a listed standby cannot be read; every batch waits until it can (fail closed)"
	if failOpen {
		msg = "throttle: a listed standby cannot be read; batches go on without it (INBOXKEEPER_REPLICA_FAIL_OPEN)"
	}
	f.said("standby "+name, err, msg)
}

func (f *failLog) said(signal string, err error, msg string) {
	cause := outage.Cause(err)
	if f.episodes.Failed(signal, cause) {
		f.log.Warn(msg, "signal", signal, "cause", cause, "error", err)
	}
}

// ok records a successful reading of signal on the primary.
func (f *failLog) ok(signal string) {
	f.mu.Lock()
	shared := f.shared
	f.mu.Unlock()
	shared.DatabaseAnswers()
	f.ended(signal)
}

func (f *failLog) ended(signal string) {
	f.endedSaying(signal, "throttle: reading works again")
}

// standbyRead records a successful reading of a listed standby.
func (f *failLog) standbyRead(name string) {
	f.endedSaying("standby "+name, "throttle: a listed standby can be read again")
}

func (f *failLog) endedSaying(signal, msg string) {
	if e, ok := f.episodes.Ended(signal); ok && e.Said {
		f.log.Info(msg, "signal", signal, "failed_for", e.Lasted, "failures", e.Failures)
	}
}
