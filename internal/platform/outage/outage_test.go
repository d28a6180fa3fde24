package outage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// An episode is news when it starts and when its cause changes, never for
// a repeat however long it lasts; its end says how long and how many.
func TestEpisode(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := New(func() time.Time { return now })
	var news int
	for i := range 3600 {
		if l.Failed("database", CauseConnection) {
			news++
		}
		if i == 1800 && !l.Failed("database", "SQLSTATE 42501") {
			t.Error("a new cause is news")
		}
		now = now.Add(time.Second)
	}
	if news != 1 || !l.Open("database") || l.Open("lease") {
		t.Errorf("news %d times in an hour of one cause, open %v", news, l.Open("database"))
	}
	e, ok := l.Ended("database")
	if !ok || e.Lasted != time.Hour || e.Failures != 3601 || !e.Said {
		t.Errorf("ended: %+v %v, want an hour, 3601 failures, said", e, ok)
	}
	if _, ok := l.Ended("database"); ok || l.Open("database") {
		t.Error("ended twice")
	}
	l.Covered("lease")
	if e, _ := l.Ended("lease"); e.Said || e.Failures != 1 {
		t.Errorf("a covered failure: %+v, want counted and not said", e)
	}
}

// Cause is a class, whatever the text: every way of not answering is one.
func TestCause(t *testing.T) {
	for err, want := range map[error]string{
		&net.OpError{Op: "dial", Err: errors.New("connection refused")}:        CauseConnection,
		fmt.Errorf("lease: %w", &pgconn.PgError{Code: "57P01"}):                CauseConnection,
		&pgconn.PgError{Code: "42501"}:                                         "SQLSTATE 42501",
		errors.New("no rows"):                                                  "error",
		fmt.Errorf("read: %w", &net.OpError{Op: "read", Err: errors.New("x")}): CauseConnection,
	} {
		if got := Cause(err); got != want {
			t.Errorf("Cause(%v) = %q, want %q", err, got, want)
		}
	}
	if got := Cause(context.DeadlineExceeded); got != CauseConnection {
		t.Errorf("a deadline: %q (the retry kinds count it as the connection's)", got)
	}
}

// The database's outage is said once for every part of the daemon that
// meets it, by whichever meets it first, and its end once; a failure that
// is not the database not answering is the caller's to say.
func TestDatabaseFailed(t *testing.T) {
	var nilLog *Log
	if nilLog.DatabaseFailed(&net.OpError{Op: "dial", Err: errors.New("refused")}) {
		t.Error("a nil log takes a failure")
	}
	nilLog.DatabaseAnswers()
	l := New(nil)
	if l.DatabaseFailed(&net.OpError{Op: "dial", Err: errors.New("refused")}) {
		t.Error("a log that says no database outage takes a failure")
	}
	var down, up []string
	l.SayDatabase(func(cause string, _ error) { down = append(down, cause) }, func(e Episode) { up = append(up, fmt.Sprint(e.Failures)) })
	for range 5 {
		if !l.DatabaseFailed(&net.OpError{Op: "dial", Err: errors.New("refused")}) {
			t.Fatal("a connection refused is not the database's outage")
		}
	}
	if l.DatabaseFailed(&pgconn.PgError{Code: "42501"}) {
		t.Error("a statement refused is the caller's to say")
	}
	l.DatabaseAnswers()
	l.DatabaseAnswers()
	if fmt.Sprint(down) != "[connection]" || fmt.Sprint(up) != "[5]" {
		t.Errorf("said %v, ended %v; want once each, 5 failures", down, up)
	}
}
