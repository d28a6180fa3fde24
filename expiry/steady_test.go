package expiry

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// The deleter's own transactions hold the xmin horizon no longer than a
// batch: every batch is a transaction of its own, and so is every count,
// measurement and bound read ahead; nothing keeps a snapshot across
// batches, but for the exact count a sweep from page 0 reads beside its
// first slices, whose snapshot must be older than their commits (`once`:
// docs/operations/steady-state.md). This test runs the pass as `run` with
// its metrics endpoint does (LiveDue: every due row counted before the
// first batch), where that count is not read beside; under load the one
// beside slices held its snapshot over 3 commits once (159 ms).
// A session samples, every few milliseconds, every client
// transaction of the database that holds a snapshot
// (pg_stat_activity.backend_xmin: its pid, when it began, how long it has
// been open; not autovacuum's), while a pass runs 60 batches; no such
// transaction may stay open while more than one batch commits (a bound
// read ahead runs beside one batch, by design).
func TestOwnTransactionsHoldTheHorizonOneBatchAtMost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 30000, t0.Add(-48*time.Hour), time.Second)

	var mu sync.Mutex
	var commits []time.Time // when each batch had committed
	var longestBatch time.Duration
	opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 500}, LiveDue: true,
		Progress: func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			commits = append(commits, time.Now())
			longestBatch = max(longestBatch, p.BatchDuration)
		}}

	// snapshot is a transaction seen holding one: from its start to the
	// last sample that saw it (the server's clock, this machine's).
	type snapshot struct {
		pid        int32
		start, end time.Time
	}
	sampler := pgtest.Connect(t, f.pool.Config().ConnString())
	stop := make(chan struct{})
	seen := make(chan map[snapshot]time.Time, 1)
	go func() {
		held := map[snapshot]time.Time{} // (pid, start) -> last seen
		defer func() { seen <- held }()
		every := time.NewTicker(2 * time.Millisecond) // the sampling period
		defer every.Stop()
		for {
			select {
			case <-stop:
				return
			case <-every.C:
			}
			rows, err := sampler.Query(ctx, `SELECT pid, xact_start, clock_timestamp() FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND backend_xmin IS NOT NULL
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`)
			if err != nil {
				t.Error(err)
				return
			}
			for rows.Next() {
				var s snapshot
				var at time.Time
				if err := rows.Scan(&s.pid, &s.start, &at); err != nil {
					t.Error(err)
					return
				}
				held[s] = at
			}
			if rows.Err() != nil {
				t.Error(rows.Err())
				return
			}
		}
	}()
	res := f.pass(t, opts)
	close(stop)
	held := <-seen
	if res.Deleted != 30000 || len(commits) != 60 {
		t.Fatalf("deleted %d in %d batches, want 30000 in 60", res.Deleted, len(commits))
	}
	var longest time.Duration
	most := 0 // batches committed while one transaction held its snapshot
	for s, last := range held {
		longest = max(longest, last.Sub(s.start))
		n := 0
		for _, c := range commits {
			if c.After(s.start) && c.Before(last) {
				n++
			}
		}
		most = max(most, n)
	}
	t.Logf("60 batches, the longest %s; %d snapshots seen, the longest held %s, over %d batch commits at most", longestBatch, len(held), longest, most)
	if len(held) == 0 {
		t.Fatal("the sampler saw no transaction holding a snapshot: it measures nothing")
	}
	// A stalled count or bound read ahead on a loaded machine may take
	// longer than a batch (168 ms against batches of at most 38 ms once,
	// with a core kept busy), but batches do not commit beside it: a
	// snapshot kept across batches would be held over many commits.
	if most > 1 {
		t.Errorf("a transaction of the deleter held a snapshot while %d batches committed; want at most one", most)
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
	// One VACUUM, and one more where an older snapshot (another session's,
	// on a busy cluster) kept the deleted rows from the first.
	var n int64
	if err := f.pool.QueryRow(context.Background(), `SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'consumer_inbox'`).Scan(&n); err != nil || n != 1+int64(res.VacuumsHeldBack) {
		t.Errorf("vacuum_count %d (%v), want 1 and one for each held back (%d)", n, err, res.VacuumsHeldBack)
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
