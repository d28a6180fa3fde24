package pass

import (
	"context"
	"time"

	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// Wait is what holds a pass back: the throttle's verdict, the manual pause
// in force (nil: another signal), and how long the pass has waited so far.
type Wait struct {
	State  throttle.State
	Pause  *throttle.Pause
	Waited time.Duration
}

// WatchWaits tells say, until ctx ends, what holds a pass back: as soon as
// the throttle starts to, then every `every` while it does, and once when
// it lets go (a zero State). once runs it beside its pass, so that a pass
// held by `inboxkeeper pause --for 1h` says so, and for how long, instead
// of going quiet after the throttle's one line.
func WatchWaits(ctx context.Context, th *throttle.Throttler, q throttle.Querier, every time.Duration, say func(Wait)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var since, said time.Time
	for {
		s := th.Check()
		now := time.Now()
		switch {
		case s.Throttled && since.IsZero():
			since, said = now, now
			say(wait(ctx, q, s, 0))
		case s.Throttled && now.Sub(said) >= every:
			said = now
			say(wait(ctx, q, s, now.Sub(since)))
		case !s.Throttled && !since.IsZero():
			say(Wait{State: s, Waited: now.Sub(since)})
			since = time.Time{}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// wait is the Wait of state s, with the manual pause when that is what
// holds the pass.
func wait(ctx context.Context, q throttle.Querier, s throttle.State, waited time.Duration) Wait {
	w := Wait{State: s, Waited: waited}
	if s.Kind == throttle.ManualPause {
		w.Pause, _ = throttle.ActivePause(ctx, q)
	}
	return w
}

// UnreadStandby is a standby the throttle cannot read, which holds every
// batch back (fail closed): a listed one (INBOXKEEPER_REPLICA_URLS) or
// the primary's view of its own. False when there is none, or when
// REPLICA_FAIL_OPEN lets the batches go on without it.
func UnreadStandby(th *throttle.Throttler) (throttle.Reading, bool) {
	for _, r := range th.Readings() {
		if r.Kind == throttle.ReplicaUnreachable && r.Over {
			return r, true
		}
	}
	return throttle.Reading{}, false
}

// GiveUpOnStandbys calls giveUp once, and returns, when a standby has
// stayed unread (UnreadStandby) for after; it looks every second until
// ctx ends. once runs it beside its pass: a standby it cannot read must not
// hold a one-shot pass for ever (a CronJob that never ends), nor let it
// end as a success that deleted nothing.
func GiveUpOnStandbys(ctx context.Context, th *throttle.Throttler, after time.Duration, giveUp func(throttle.Reading)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var since time.Time
	for {
		r, unread := UnreadStandby(th)
		switch now := time.Now(); {
		case !unread:
			since = time.Time{}
		case since.IsZero():
			since = now
		case now.Sub(since) >= after:
			giveUp(r)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
