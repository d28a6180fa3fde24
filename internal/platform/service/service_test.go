package service

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// The zero clock is the real time, with nothing pinned for SQL (which then
// takes the database's now()); a pinned one is the same instant for both.
func TestClock(t *testing.T) {
	var real Clock
	if real.Pinned() != nil || time.Since(real.Now()) > time.Minute {
		t.Errorf("the zero clock: pinned %v, now %s", real.Pinned(), real.Now())
	}
	at := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	pinned := Clock(func() time.Time { return at })
	if p := pinned.Pinned(); p == nil || !p.Equal(at) || !pinned.Now().Equal(at) {
		t.Errorf("a pinned clock: pinned %v, now %s", p, pinned.Now())
	}
}

// Unset options get the documented defaults, the lock timeout each
// service's own; set ones stay.
func TestWithDefaults(t *testing.T) {
	b := Base{}.WithDefaults(100 * time.Millisecond)
	if b.Logger == nil || b.LockTimeout != 100*time.Millisecond || b.StatementTimeout != config.DefaultStatementTimeout ||
		b.IdleTimeout != 10*time.Second || b.MaxRetries != DefaultMaxRetries {
		t.Errorf("defaults %+v", b)
	}
	b = Base{LockTimeout: time.Second, MaxRetries: 1}.WithDefaults(100 * time.Millisecond)
	if b.LockTimeout != time.Second || b.MaxRetries != 1 {
		t.Errorf("set options were replaced: %+v", b)
	}
	if s := b.TxSettings(); s.LockTimeout != time.Second || s.StatementTimeout != config.DefaultStatementTimeout || s.IdleInTx != 10*time.Second {
		t.Errorf("transaction settings %+v", s)
	}
}

// The active check's error is the early stop of the table's pass: the
// settings changed, or else the lease is lost.
func TestCheckActive(t *testing.T) {
	if why, ok := (Base{}).CheckActive(); !ok || why.Stopped() {
		t.Errorf("without a check: %v, %v", why, ok)
	}
	lost := errors.New("lease lost to host-b")
	if why, ok := (Base{Active: func() error { return lost }}).CheckActive(); ok || why.Kind != retry.KindLease || why.String() != lost.Error() {
		t.Errorf("a lost lease: %+v, %v", why, ok)
	}
	changed := func() error { return fmt.Errorf("watch: %w", retry.ErrSettingsChanged) }
	if why, ok := (Base{Active: changed}).CheckActive(); ok || why.Kind != retry.KindSettingsChanged {
		t.Errorf("changed settings: %+v, %v", why, ok)
	}
	held := &HeldError{Reason: "replica_lag r: 2s", Err: errors.New("context deadline exceeded")}
	if reason, ok := Held(fmt.Errorf("batch: %w", held)); !ok || reason != "replica_lag r: 2s" {
		t.Errorf("Held(%v) = %q, %v", held, reason, ok)
	}
}
