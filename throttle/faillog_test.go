package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// countHandler counts log records by message.
type countHandler struct {
	mu    sync.Mutex
	msgs  []string
	lines []string // with signal, cause, error and failures
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "error", "signal", "cause", "failures":
			line += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	h.msgs = append(h.msgs, r.Message)
	h.lines = append(h.lines, line)
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

func (h *countHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func (h *countHandler) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "\n")
}

// A signal failing 20 times a second logs once when it starts failing,
// once for a new cause (a class, not the error's text, which changes from
// one attempt to the next), and once when it works again with how many
// attempts failed: the same lines for a minute as for an hour.
func TestFailLogSaysAnOutageOnce(t *testing.T) {
	h := &countHandler{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFailLog(slog.New(h), func() time.Time { return now })
	for i := range 20 * 3600 { // an hour
		// The text changes (a port, a counter); the class does not.
		f.failed(readStatReplication, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("connection refused (attempt %d)", i)})
		f.failed(readSlots, errors.Join(context.DeadlineExceeded, errors.New("attempt "+string(rune('a'+i%26)))))
		now = now.Add(50 * time.Millisecond)
	}
	f.failed(readStatReplication, &pgconn.PgError{Code: "42501", Message: "permission denied"}) // a new cause
	f.ok(readStatReplication)
	f.ok(readStatReplication) // already working: nothing
	want := []string{
		"throttle: reading failed", "throttle: reading failed", // both signals at 0 s
		"throttle: reading failed", // a new cause
		"throttle: reading works again",
	}
	if strings.Join(h.msgs, "|") != strings.Join(want, "|") {
		t.Fatalf("log lines:\n%s\nwant:\n%s", h, strings.Join(want, "\n"))
	}
	if !strings.Contains(h.lines[3], "failures=72001") {
		t.Errorf("the end says %q, want the 72,001 failures of the hour", h.lines[3])
	}
}

// Stopping the database under the collectors: each failing reading logs
// once, the failed pg_stat_replication read throttles (fail closed), and
// each says once that it works again. Shared with the daemon's account of
// the database's outages, the readings say nothing: the daemon says it.
func TestDatabaseDownLogsSparingly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, pool := pgtest.NewMigratedCluster(t)
	run := func(shared *outage.Log) *countHandler {
		h := &countHandler{}
		th := New(pool, config.Config{}, service.Base{Logger: slog.New(h)}, nil)
		th.ShareOutages(shared)
		th.MeasureOnce(ctx)
		if s := th.Check(); s.Throttled {
			t.Fatalf("throttled with the database up: %s", s.Reason)
		}
		if err := c.StopServer(ctx); err != nil {
			t.Fatal(err)
		}
		for range 40 { // 2 s of readings at 50 ms
			th.MeasureOnce(ctx)
		}
		if s := th.Check(); s.Kind != ReplicaUnreachable || !strings.Contains(s.Reason, readStatReplication) {
			t.Errorf("a failed pg_stat_replication read must throttle: %+v", s)
		}
		if err := c.StartServer(ctx); err != nil {
			t.Fatal(err)
		}
		th.MeasureOnce(ctx)
		if s := th.Check(); s.Throttled {
			t.Errorf("still throttled once the database is back: %s", s.Reason)
		}
		return h
	}
	// Two signals read the primary here: pg_stat_replication and the
	// pause; a shutdown fails them for one cause (connection).
	h := run(nil)
	if n := h.count("throttle: reading failed"); n != 2 {
		t.Errorf("%d 'reading failed' lines in 2 s of failures, want 2 (one per signal):\n%s", n, h)
	}
	if n := h.count("throttle: reading works again"); n != 2 {
		t.Errorf("%d 'works again' lines, want 2:\n%s", n, h)
	}

	var down, up int
	shared := outage.New(nil)
	shared.SayDatabase(func(string, error) { down++ }, func(outage.Episode) { up++ })
	if h := run(shared); len(h.msgs) != 0 || down != 1 || up != 1 {
		t.Errorf("with the daemon's account: %d lines of the throttle's own, the outage said %d times and its end %d, want 0, 1, 1:\n%s", len(h.msgs), down, up, h)
	}
}
