package expiry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
// first batch), where that count is not read beside.
// Each batch, between its DELETE and its COMMIT, lists every client
// transaction of the database that holds the horizon back
// (pg_stat_activity.backend_xmin or backend_xid: its pid and when it
// began), its own among them; a
// transaction open at two batches' commits stayed open across the first
// one's commit and into the next batch, which nothing of the deleter may
// do (a bound read ahead runs beside one batch and ends before the next
// begins, by design). A transaction that spans a commit must be open at
// the next batch's list, whatever the machine's load: an earlier version
// sampled on a timer, stamped a sample with clock_timestamp() read after
// the activity view, and under load saw a read ahead "open" after the
// next batch's commit, or sampled nothing at all.
func TestOwnTransactionsHoldTheHorizonOneBatchAtMost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 30000, t0.Add(-48*time.Hour), time.Second)

	// snapshot is a transaction seen holding the horizon.
	type snapshot struct {
		pid   int32
		start time.Time
	}
	sampler := pgtest.Connect(t, f.pool.Config().ConnString())
	seenAt := map[snapshot][]int{} // the batches at whose commit it was open
	batches, deleting := 0, 0      // batches at their commit, those that deleted rows
	var sampleErr error
	sig := signals{TestSignals: TestSignals{BeforeCommit: func(_ string, n int64) {
		batches++
		if n > 0 {
			deleting++
		}
		if sampleErr != nil {
			return
		}
		rows, err := sampler.Query(ctx, `SELECT pid, xact_start FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`)
		if err != nil {
			sampleErr = err
			return
		}
		seen, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (s snapshot, err error) {
			return s, r.Scan(&s.pid, &s.start)
		})
		if err != nil {
			sampleErr = err
			return
		}
		for _, s := range seen {
			seenAt[s] = append(seenAt[s], batches)
		}
	}}}
	res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 500}, LiveDue: true})
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	if res.Deleted != 30000 || deleting != 60 {
		t.Fatalf("deleted %d in %d batches, want 30000 in 60", res.Deleted, deleting)
	}
	if len(seenAt) < batches {
		// Each batch's own transaction is open at its commit.
		t.Fatalf("%d transactions seen holding the horizon at %d commits, want every batch's own at least: the list measures nothing", len(seenAt), batches)
	}
	for s, at := range seenAt {
		if len(at) > 1 {
			t.Errorf("a transaction of the deleter (pid %d, begun %s) held the horizon at the commits of batches %v; want one batch at most", s.pid, s.start.Format(time.RFC3339Nano), at)
		}
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
