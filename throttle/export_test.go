package throttle

import "context"

// CheckLocksNow runs one lock-wait check synchronously, as the watcher's
// ticker would.
func (t *Throttler) CheckLocksNow(ctx context.Context) {
	t.mu.Lock()
	pids := make([]uint32, 0, len(t.watched))
	for pid := range t.watched {
		pids = append(pids, pid)
	}
	t.mu.Unlock()
	t.checkBlocked(ctx, pids)
}
