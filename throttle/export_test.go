package throttle

import (
	"context"
)

// CheckLocksNow runs one lock-wait check synchronously, as the watcher's
// ticker would; citus adds the check of every node's lock waits.
func (t *Throttler) CheckLocksNow(ctx context.Context, citus bool) {
	t.mu.Lock()
	pids := make([]uint32, 0, len(t.watched))
	for pid := range t.watched {
		pids = append(pids, pid)
	}
	t.mu.Unlock()
	t.checkBlocked(ctx, pids, localWaitsSQL)
	if citus {
		t.checkBlocked(ctx, pids, citusWaitsSQL)
	}
}
