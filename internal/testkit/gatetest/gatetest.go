// Package gatetest is a throttle for tests (a service.Gate) that holds
// every admission back: a standby that applies nothing, or a signal over
// its threshold, until the test opens it or the caller's context ends.
package gatetest

import (
	"context"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// Held holds every Admit until Open is closed (a nil Open: never) or the
// caller's context ends, when it returns a *service.HeldError giving
// Reason, as the throttle does. It watches no statement and counts no WAL.
type Held struct {
	Open   <-chan struct{}
	Reason string
}

// Admit waits for Open, then admits the sizer's size (nil sizer: 0).
func (g Held) Admit(ctx context.Context, s service.Sizer) (int, error) {
	select {
	case <-g.Open:
		if s == nil {
			return 0, nil
		}
		return s.Size(), nil
	case <-ctx.Done():
		return 0, &service.HeldError{Reason: g.Reason, Err: ctx.Err()}
	}
}

// Watch watches nothing: no session ever queues behind a statement.
func (Held) Watch(uint32, time.Time) (func(), func() bool) {
	return func() {}, func() bool { return false }
}

// Wrote forgets the WAL.
func (Held) Wrote(float64) {}
