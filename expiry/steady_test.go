package expiry

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// The deleter's own transactions hold the xmin horizon no longer than a
// batch: every batch is a transaction of its own, and so is every count,
// measurement and bound read ahead; nothing keeps a snapshot across
// batches. A session samples, every few milliseconds, every transaction of
// the database that holds a snapshot (pg_stat_activity.backend_xmin) and
// how long it has been open, while a pass runs 60 batches.
func TestOwnTransactionsHoldTheHorizonOneBatchAtMost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 30000, t0.Add(-48*time.Hour), time.Second)

	var mu sync.Mutex
	var longestBatch time.Duration
	batches := 0
	opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 500},
		Progress: func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			batches++
			longestBatch = max(longestBatch, p.BatchDuration)
		}}

	sampler := pgtest.Connect(t, f.pool.Config().ConnString())
	stop := make(chan struct{})
	held := make(chan time.Duration, 1)
	go func() {
		var longest time.Duration
		defer func() { held <- longest }()
		every := time.NewTicker(2 * time.Millisecond) // the sampling period
		defer every.Stop()
		for {
			select {
			case <-stop:
				return
			case <-every.C:
			}
			var age *time.Duration
			err := sampler.QueryRow(ctx, `SELECT max(clock_timestamp() - xact_start) FROM pg_stat_activity
WHERE datname = current_database() AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&age)
			if err != nil {
				t.Error(err)
				return
			}
			if age != nil {
				longest = max(longest, *age)
			}
		}
	}()
	res := f.pass(t, opts)
	close(stop)
	longestHeld := <-held
	t.Logf("%d batches, the longest %s; the longest snapshot held %s", batches, longestBatch, longestHeld)
	if res.Deleted != 30000 || batches != 60 {
		t.Fatalf("deleted %d in %d batches, want 30000 in 60", res.Deleted, batches)
	}
	// Twice the longest batch: a count or a bound read ahead is shorter
	// than a batch, but a loaded machine may stall one of them once. A
	// snapshot kept across batches would be held for many of them.
	if longestHeld > 2*longestBatch {
		t.Errorf("a transaction of the deleter held a snapshot for %s, more than twice its longest batch (%s)", longestHeld, longestBatch)
	}
}

// A pass that deletes a fifth of the table vacuums it (vacuum.Vacuumer):
// the result says so, with the dead tuples it left.
func TestPassVacuums(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 5000, t0.Add(-48*time.Hour), time.Second)
	f.insert(t, "live", 15000, t0.Add(48*time.Hour), time.Second)
	v := vacuum.New(f.pool, vacuum.Options{DeadRatio: 0.1})
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}, Vacuum: v})
	if res.Deleted != 5000 || !res.Vacuumed || res.DeadTuples < 5000 {
		t.Fatalf("deleted %d, vacuumed %v, dead tuples %d; want 5000, true, at least 5000", res.Deleted, res.Vacuumed, res.DeadTuples)
	}
	var n int64
	if err := f.pool.QueryRow(context.Background(), `SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'consumer_inbox'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("vacuum_count %d (%v), want 1", n, err)
	}
}

// A VACUUM the dead tuples call for that does not run (here: the instance
// stopped being the active one) is said in the result, for the pass's log
// line (vacuum_not_run), and nothing is vacuumed.
func TestPassSaysWhyNoVacuum(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 5000, t0.Add(-48*time.Hour), time.Second)
	f.insert(t, "live", 15000, t0.Add(48*time.Hour), time.Second)
	v := vacuum.New(f.pool, vacuum.Options{DeadRatio: 0.1, Base: service.Base{Active: func() error { return errors.New("lease lost") }}})
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}, Vacuum: v})
	if res.Deleted != 5000 || res.Vacuumed || !strings.Contains(res.VacuumNotRun, "lease lost") {
		t.Fatalf("deleted %d, vacuumed %v, not run because %q; want 5000, false, the lease lost", res.Deleted, res.Vacuumed, res.VacuumNotRun)
	}
}
