package throttle

import (
	"context"
	"sync"
	"time"
)

// When the signals are read. Every read is a transaction the DBA sees in
// pg_stat_database and pg_stat_statements, so the throttle reads at each
// signal's own cadence only while it is awake: from the first batch of a
// pass that asks for admission (Admit, Wait, Pace wake it, after measuring
// every signal whose reading is older than its cadence) until the daemon
// says the pass is over (Idle). A pass with nothing to do asks nothing and
// wakes nothing. Between passes only what has a subject to export (a
// streaming standby, a logical slot, a listed standby) is read, every
// idleEvery, and a signal whose last reading found nothing to measure
// (no standby streams, no slot exists) is looked for every discoverEvery
// while awake, and not at all between passes.
const (
	// idleEvery keeps the gauges of what exists (standby lag, slot lag)
	// meaningful between passes at one read a subject every ten seconds:
	// a Prometheus scrape interval's worth.
	idleEvery = 10 * time.Second
	// discoverEvery: a standby that connects, or a slot created, while a
	// pass runs is paced within a second or two.
	discoverEvery = 2 * time.Second
	// keepAliveEvery: while awake, a long pause must not end with a dead
	// idle connection.
	keepAliveEvery = 30 * time.Second
)

// collector measures one or more signals; poll runs it at its cadence,
// wake and MeasureOnce run it once.
type collector struct {
	interval time.Duration // while awake
	run      func(ctx context.Context)
	close    func()
	idle     func() bool // nil: not read between passes
	sparse   func() bool // nil: never sparse
	// writes: it writes to the database (the heartbeat), which MeasureOnce,
	// status's reading, never does.
	writes bool

	mu   sync.Mutex // one run at a time: wake runs it too
	last time.Time  // the start of its last run
}

// measure runs the collector once.
func (c *collector) measure(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = time.Now()
	c.run(ctx)
}

func (c *collector) lastRun() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// period is how often c runs now, 0 for not at all, and the channel that
// is closed when that changes.
func (t *Throttler) period(c *collector) (time.Duration, <-chan struct{}) {
	t.mu.Lock()
	awake, woken := t.awake, t.woken
	t.mu.Unlock()
	switch {
	case awake && c.sparse != nil && c.sparse():
		return max(c.interval, discoverEvery), woken
	case awake:
		return c.interval, woken
	case c.idle != nil && c.idle():
		return max(c.interval, idleEvery), woken
	}
	return 0, woken
}

// poll runs c at its cadence until ctx ends.
func (t *Throttler) poll(ctx context.Context, c *collector) {
	for {
		period, woken := t.period(c)
		var fire <-chan time.Time
		var timer *time.Timer
		if period > 0 {
			timer = time.NewTimer(max(period-time.Since(c.lastRun()), 0))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-woken:
		case <-fire:
			c.measure(ctx)
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// wake makes the signals read at their working cadence, after reading now
// every one whose reading is older than that: the batch that asked is
// checked against readings of its pass. It does nothing when awake.
func (t *Throttler) wake(ctx context.Context) {
	t.mu.Lock()
	if t.awake || t.cs == nil { // not started (status): nothing polls
		t.mu.Unlock()
		return
	}
	t.awake = true
	t.flip()
	cs := t.cs
	t.mu.Unlock()
	for _, c := range cs {
		if time.Since(c.lastRun()) >= c.interval {
			c.measure(ctx)
		}
	}
}

// Idle says a pass is over: until the next batch asks for admission, only
// what exists is read, every idleEvery (see the top of this file). The
// daemon calls it after every pass.
func (t *Throttler) Idle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.awake {
		t.awake = false
		t.flip()
	}
}

// Awake reports whether the signals are read at their working cadence.
func (t *Throttler) Awake() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.awake
}

// flip wakes every poll loop to look at its cadence again; t.mu is held.
func (t *Throttler) flip() {
	close(t.woken)
	t.woken = make(chan struct{})
}
