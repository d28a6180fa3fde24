// Package outage keeps the log of a failure that lasts to a few lines,
// however long it lasts: a database that does not answer, a standby that
// went away, a lease that cannot be renewed, a throttle reading that fails.
// Such a failure repeats at every attempt (a pass every second, a reading
// every 50 ms): a line per attempt was 46 lines for an 8-second outage at
// INTERVAL=1s, 18,000 for an hour.
//
// A Log keeps one episode per subject (the database, a signal of the
// throttle, the lease): its first failure is news to log, and so is the
// first failure of each new cause while it lasts; every other failure is
// only counted; its end is news once more, with how long it lasted and how
// many attempts failed. Causes are a few fixed classes (Cause), not an
// error's text, which changes from one attempt to the next (the connection
// terminated, then refused) and would make each attempt news.
//
// Daemon internals.
package outage

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// Database is the subject of the outage of the database the daemon works
// on, which every part of the daemon that reads it (its passes, the lease,
// the throttle's readings of the primary) meets at once: it is said once
// for them all (DatabaseFailed), by whichever meets it first.
const Database = "database"

// CauseConnection is the cause of every failure that is the database not
// answering: a connection lost, refused, or not made.
const CauseConnection = "connection"

// Cause is the class of err that decides whether a failure is news: one
// cause for every way a database does not answer (CauseConnection), one
// per reason a connection is refused that the configuration must fix
// (authentication, TLS, an unknown database: they do not change by
// themselves), "SQLSTATE xxxxx" for another server error, "timeout", and
// "error" for the rest.
func Cause(err error) string {
	err = dbconn.Classify(err)
	var ce *dbconn.ConnectError
	switch {
	case errors.As(err, &ce) && ce.Config():
		return string(ce.Cause)
	case errors.As(err, &ce), retry.KindOf(err) == retry.KindConnection:
		return CauseConnection
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case retry.Code(err) != "":
		return "SQLSTATE " + retry.Code(err)
	}
	return "error"
}

// Log keeps the episodes of failure by subject. A nil *Log says nothing
// of the database (DatabaseFailed is false).
type Log struct {
	now func() time.Time

	mu   sync.Mutex
	open map[string]*episode
	// start and end say the database's outage (SayDatabase).
	start func(cause string, err error)
	end   func(Episode)
}

type episode struct {
	since    time.Time
	failures int
	causes   map[string]bool // the causes said
}

// Episode is a failure that lasted, as it ended.
type Episode struct {
	Since    time.Time
	Lasted   time.Duration
	Failures int // the failed attempts, the first included
	// Said: a line said it started (Failed returned true at least once); a
	// failure that was part of another's (Covered) says nothing, and
	// neither does its end.
	Said bool
}

// New returns an empty Log on the host's clock, or on now when set (tests).
func New(now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{now: now, open: map[string]*episode{}}
}

// Failed records a failed attempt at subject for cause, and reports
// whether it is news to log: the first of an episode, or the first of a
// cause new to it.
func (l *Log) Failed(subject, cause string) bool {
	return l.record(subject, cause, true)
}

// Covered records a failed attempt at subject that another's account
// already says: it is counted, and never news.
func (l *Log) Covered(subject string) {
	l.record(subject, "", false)
}

func (l *Log) record(subject, cause string, say bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.open[subject]
	if e == nil {
		e = &episode{since: l.now(), causes: map[string]bool{}}
		l.open[subject] = e
	}
	e.failures++
	if !say || e.causes[cause] {
		return false
	}
	e.causes[cause] = true
	return true
}

// Ended closes subject's episode: an attempt worked. It reports the
// episode, and false when none was open.
func (l *Log) Ended(subject string) (Episode, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.open[subject]
	if e == nil {
		return Episode{}, false
	}
	delete(l.open, subject)
	now := l.now()
	return Episode{Since: e.since, Lasted: now.Sub(e.since), Failures: e.failures, Said: len(e.causes) > 0}, true
}

// Open reports whether subject is failing.
func (l *Log) Open(subject string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[subject] != nil
}

// SayDatabase makes l the one account of the database's outages: start
// says one when it starts (and when its cause changes), end when it ends.
// Both may be called from any goroutine.
func (l *Log) SayDatabase(start func(cause string, err error), end func(Episode)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start, l.end = start, end
}

// DatabaseFailed takes err into the database's outage when it is the
// database not answering (a connection lost, refused or not made) and l
// says those (SayDatabase): it is said once, when news, and the caller
// says nothing. False: err is the caller's to say.
func (l *Log) DatabaseFailed(err error) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	start := l.start
	l.mu.Unlock()
	if start == nil || !ConnectionFailed(err) {
		return false
	}
	cause := Cause(err)
	if l.Failed(Database, cause) {
		start(cause, err)
	}
	return true
}

// DatabaseAnswers ends the database's outage, if one is open: something
// read or wrote it again. The end is said once.
func (l *Log) DatabaseAnswers() {
	if l == nil {
		return
	}
	e, ok := l.Ended(Database)
	l.mu.Lock()
	end := l.end
	l.mu.Unlock()
	if ok && end != nil {
		end(e)
	}
}

// ConnectionFailed reports whether err is a connection that failed or was
// lost: the database not answering (or refusing, for a reason of the
// configuration's), not a statement it refused.
func ConnectionFailed(err error) bool {
	var ce *dbconn.ConnectError
	return errors.As(dbconn.Classify(err), &ce) || retry.KindOf(err) == retry.KindConnection
}
