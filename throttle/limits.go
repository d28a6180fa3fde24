package throttle

import (
	"time"
)

// limits are the thresholds a runtime setting (`inboxkeeper set`) changes
// while the daemon runs: the collectors read them through Throttler.limits.
type limits struct {
	maxLag      time.Duration
	maxLagBytes int64
	activeHours string
	activeTZ    *time.Location
}

// limits returns the thresholds in force.
func (t *Throttler) limits() *limits { return t.lim.Load() }

// SetLimits changes MAX_REPLICA_LAG, MAX_REPLICA_LAG_BYTES, ACTIVE_HOURS and
// ACTIVE_TZ while the throttle runs: the next reading, admission and check
// use them.
func (t *Throttler) SetLimits(maxLag time.Duration, maxLagBytes int64, activeHours string, activeTZ *time.Location) {
	if activeTZ == nil {
		activeTZ = time.UTC
	}
	t.lim.Store(&limits{maxLag: maxLag, maxLagBytes: maxLagBytes, activeHours: activeHours, activeTZ: activeTZ})
	t.mu.Lock()
	t.pacer.maxLag = maxLag
	t.mu.Unlock()
}
