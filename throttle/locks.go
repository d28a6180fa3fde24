package throttle

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// While a batch or DDL statement runs, sessions waiting on its locks get
// it cancelled (watchLocks); new batches then stay out for a second.
const LockWait = "lock_wait"

func init() {
	register(kind{name: LockWait, verdict: (*Throttler).lockWaited,
		counter: &counter{"inboxkeeper_lock_waits_total", "Batches cancelled because another session waited on a lock they held."}})
}

// lockWaited throttles for lockWaitCooldown after a lock wait.
func (t *Throttler) lockWaited(time.Time) (Reading, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	waited := !t.lockWait.IsZero() && time.Since(t.lockWait) < lockWaitCooldown
	return Reading{Kind: LockWait, Detail: "a session waited on a lock the daemon held"}, waited
}

type watch struct {
	blocked bool
	// xactStart is the watched transaction's start (its now()): the cancel
	// hits the backend only while it still runs that transaction, not the
	// next one a pooled or reused connection runs there. Zero: any (a DDL
	// session).
	xactStart time.Time
}

// Watch registers the backend running a batch. While it is registered, any
// session waiting on a lock that backend holds makes the throttler cancel
// the backend's statement (the batch rolls back and its locks go at once),
// and blocked reports true. done unregisters it. xactStart is the
// transaction's start (zero for a session watched as a whole).
func (t *Throttler) Watch(pid uint32, xactStart time.Time) (done func(), blocked func() bool) {
	w := &watch{xactStart: xactStart}
	t.mu.Lock()
	t.watched[pid] = w
	t.mu.Unlock()
	return func() {
			t.mu.Lock()
			delete(t.watched, pid)
			t.mu.Unlock()
		}, func() bool {
			t.mu.Lock()
			defer t.mu.Unlock()
			return w.blocked
		}
}

// LockPollInterval is how often running batches are checked for sessions
// waiting on them.
const LockPollInterval = 50 * time.Millisecond

// CitusLockPollInterval is how often, on a Citus coordinator, the lock
// waits on the workers are read as well (citus_lock_waits asks every node,
// some 40 ms here: too much for every LockPollInterval).
const CitusLockPollInterval = 250 * time.Millisecond

func (t *Throttler) watchLocks(ctx context.Context, citus bool) {
	tick := time.NewTicker(LockPollInterval)
	defer tick.Stop()
	var citusRead time.Time
	for {
		t.mu.Lock()
		awake, woken := t.awake, t.woken
		t.mu.Unlock()
		if !awake {
			// Between passes no batch runs: nothing to watch.
			select {
			case <-ctx.Done():
				return
			case <-woken:
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		pids := make([]uint32, 0, len(t.watched))
		for pid := range t.watched {
			pids = append(pids, pid)
		}
		t.mu.Unlock()
		if len(pids) > 0 {
			t.checkBlocked(ctx, pids, localWaitsSQL)
			if citus && time.Since(citusRead) >= CitusLockPollInterval {
				citusRead = time.Now()
				t.checkBlocked(ctx, pids, citusWaitsSQL)
			}
		}
	}
}

// The queries that find sessions waiting on a watched backend ($1): each
// returns the blocker's pid, the waiter's (global, on Citus) pid and the
// blocker's transaction start.
const (
	// localWaitsSQL looks only at sessions already waiting on a lock
	// before asking pg_blocking_pids, which briefly locks the lock manager.
	localWaitsSQL = `
WITH waiting AS MATERIALIZED (
  SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()
)
SELECT DISTINCT b.blocker, w.pid::int8, a.xact_start
FROM waiting w, LATERAL unnest(pg_blocking_pids(w.pid)) AS b(blocker)
LEFT JOIN pg_stat_activity a ON a.pid = b.blocker
WHERE b.blocker = ANY ($1::int4[])`

	// citusWaitsSQL finds the sessions waiting, on any node, on a lock a
	// watched coordinator backend holds there through its connections to
	// the workers: Citus gives those connections the backend's global pid
	// (the coordinator's node id times 10^10 plus its pid).
	citusWaitsSQL = `
SELECT DISTINCT (w.blocking_gpid % 10000000000)::int4, w.waiting_gpid, a.xact_start
FROM citus_lock_waits w
LEFT JOIN pg_stat_activity a ON a.pid = (w.blocking_gpid % 10000000000)::int4
WHERE w.blocking_gpid / 10000000000 = citus_backend_gpid() / 10000000000
  AND (w.blocking_gpid % 10000000000)::int4 = ANY ($1::int4[])`
)

// citusLockWaits says whether the database is a Citus coordinator, whose
// workers' lock waits watchLocks reads too. Start asks with the first
// reading, so that nothing it starts after it begins with a statement.
func (t *Throttler) citusLockWaits(ctx context.Context) bool {
	var citus bool
	if err := t.pool.QueryRow(ctx, "SELECT to_regclass('pg_catalog.citus_lock_waits') IS NOT NULL").Scan(&citus); err != nil && ctx.Err() == nil {
		t.Logger.Warn("throttle: could not tell whether the database is a Citus coordinator; watching its own lock waits only", "error", err)
	}
	return citus
}

// checkBlocked cancels the watched batches other sessions wait on.
func (t *Throttler) checkBlocked(ctx context.Context, pids []uint32, sql string) {
	type hit struct {
		blocker   uint32
		waiter    int64
		xactStart *time.Time
	}
	hits, err := queryRows(ctx, t.pool, sql, func(row pgx.CollectableRow, h *hit) error {
		return row.Scan(&h.blocker, &h.waiter, &h.xactStart)
	}, pids)
	if !t.recorded(ctx, readLocks, err) {
		return
	}
	for _, h := range hits {
		t.mu.Lock()
		w := t.watched[h.blocker]
		if w != nil && !w.xactStart.IsZero() && (h.xactStart == nil || !h.xactStart.Equal(w.xactStart)) {
			// The backend now runs another transaction (a pooled server
			// connection handed to someone else): neither ours to cancel
			// nor a wait on us.
			t.mu.Unlock()
			continue
		}
		if w != nil {
			w.blocked = true
		}
		t.lockWait = time.Now()
		t.mu.Unlock()
		if w == nil {
			continue // the batch ended meanwhile
		}
		t.Logger.Warn("throttle: a session waits on a lock the daemon holds; cancelling the batch", "daemon_pid", h.blocker, "waiting_pid", h.waiter)
		t.metrics.count(LockWait)
		var start *time.Time
		if !w.xactStart.IsZero() {
			start = &w.xactStart
		}
		if _, err := t.pool.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity
WHERE pid = $1 AND ($2::timestamptz IS NULL OR xact_start = $2)`, int32(h.blocker), start); err != nil && ctx.Err() == nil {
			t.Logger.Warn("throttle: cancel batch", "error", err)
		}
	}
}
