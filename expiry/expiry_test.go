package expiry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/gatetest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the pinned "now" of most tests.
var t0 = time.Date(2026, 6, 15, 12, 0, 0, 0, time.UTC)

// forms runs test twice: with the default batches (optimistic, falling back
// to SKIP LOCKED for a batch that meets a locked row), and with every batch
// in the SKIP LOCKED form. Both must keep every guarantee.
func forms(t *testing.T, test func(t *testing.T, sig signals)) {
	t.Run("optimistic", func(t *testing.T) {
		t.Parallel()
		test(t, signals{})
	})
	t.Run("skip_locked", func(t *testing.T) {
		t.Parallel()
		test(t, signals{TestSignals: TestSignals{SkipLockedOnly: true}})
	})
}

// newTest is New with the test's signals.
func newTest(pool *pgxpool.Pool, tables []*catalog.Table, opts Options, sig signals) *Deleter {
	if sig.strategy != "" {
		opts.Strategy = sig.strategy
	}
	d := New(pool, tables, opts)
	d.TestSignals = sig.TestSignals
	return d
}

// signals are a test's hooks, and the strategy its passes are forced to
// (Options.Strategy; empty: the options' own).
type signals struct {
	TestSignals
	strategy Strategy
}

const (
	inboxDDL    = pgtest.ShortInboxDDL
	inboxPolicy = pgtest.ShortInboxPolicy
)

type fixture struct {
	pool   *pgxpool.Pool
	tables []*catalog.Table
}

// setup makes a migrated database with ddl applied and the policy resolved.
func setup(t *testing.T, ddl, pol string) fixture {
	t.Helper()
	pool, _ := pgtest.NewMigratedPool(t, ddl)
	return fixture{pool: pool, tables: pgtest.Resolve(t, pool, pol)}
}

// insert adds n rows of consumer whose expiry is base + i*step and whose
// event time is expiry - 30 days.
func (f fixture) insert(t *testing.T, consumer string, n int, base time.Time, step time.Duration) {
	t.Helper()
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, event_time, remember_until)
SELECT $1, $1 || '-' || i, $2::timestamptz + i * $3::interval - interval '30 days', $2::timestamptz + i * $3::interval
FROM generate_series(0, $4 - 1) i`, consumer, base, step, n)
}

func (f fixture) count(t *testing.T, where string, args ...any) int64 {
	t.Helper()
	return pgtest.Value[int64](t, f.pool, "SELECT count(*) FROM public.consumer_inbox WHERE "+where, args...)
}

func (f fixture) pass(t *testing.T, opts Options) TableResult {
	t.Helper()
	return f.passWith(t, signals{}, opts)
}

// passWith is pass with the test's signals.
func (f fixture) passWith(t *testing.T, sig signals, opts Options) TableResult {
	t.Helper()
	res, err := newTest(f.pool, f.tables, opts, sig).RunPass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil {
		t.Fatalf("pass failed: %v", res[0].Err)
	}
	return res[0]
}

func TestBoundaryAndNull(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, remember_until) VALUES
 ('c', 'minus', $1::timestamptz - interval '1 second'),
 ('c', 'equal', $1::timestamptz),
 ('c', 'plus',  $1::timestamptz + interval '1 second'),
 ('c', 'null',  NULL)`, t0)
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	if res.Deleted != 2 {
		t.Errorf("deleted %d rows, want 2 (expiry -1s and = now)", res.Deleted)
	}
	var left []string
	rows, _ := f.pool.Query(context.Background(), "SELECT message_id FROM public.consumer_inbox ORDER BY message_id")
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(left, ",") != "null,plus" {
		t.Errorf("rows left %v, want [null plus]", left)
	}
}

func TestDatabaseClockIsDefault(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, remember_until) VALUES
 ('c', 'past', now() - interval '1 minute'), ('c', 'future', now() + interval '1 hour')`)
	if res := f.pass(t, Options{}); res.Deleted != 1 {
		t.Errorf("deleted %d, want 1", res.Deleted)
	}
	if f.count(t, "message_id = 'future'") != 1 {
		t.Error("a row expiring in an hour was deleted")
	}
}

// deleteLogDDL records every row deleted from consumer_inbox, with the
// transaction that deleted it.
const deleteLogDDL = `
CREATE TABLE deleted_log (seq bigserial, txid bigint, expiry timestamptz);
CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO deleted_log (txid, expiry) VALUES (txid_current(), OLD.remember_until); RETURN OLD; END $$;
CREATE TRIGGER log_delete AFTER DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION log_delete();`

// checkLoggedBatches fails unless every transaction in deleted_log deleted
// at most size rows, none older than a previous one's newest (oldest
// first), and returns how many transactions deleted rows.
func (f fixture) checkLoggedBatches(t *testing.T, size int) int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT count(*), min(expiry), max(expiry) FROM deleted_log GROUP BY txid ORDER BY min(seq)`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var prevMax time.Time
	batches := 0
	for rows.Next() {
		var n int
		var lo, hi time.Time
		if err := rows.Scan(&n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		batches++
		if n > size {
			t.Errorf("batch %d deleted %d rows, batch size is %d", batches, n, size)
		}
		if lo.Before(prevMax) {
			t.Errorf("batch %d deleted expiry %s after an earlier batch deleted %s: not oldest first", batches, lo, prevMax)
		}
		prevMax = hi
	}
	return batches
}

// TestOldestFirstInBatches: batches must respect the size, and each batch
// must only delete rows at least as new as the previous batch's.
func TestOldestFirstInBatches(t *testing.T) {
	t.Parallel()
	forms(t, func(t *testing.T, sig signals) {
		f := setup(t, inboxDDL+deleteLogDDL, inboxPolicy)
		// Inserted newest first so that physical order disagrees with expiry order.
		pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, remember_until)
SELECT 'c', 'm' || i, $1::timestamptz - i * interval '1 minute' FROM generate_series(1, 95) i`, t0)
		f.insert(t, "c2", 20, t0.Add(time.Hour), time.Minute) // not expired

		res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}})
		if res.Deleted != 95 || res.Batches != 10 {
			t.Fatalf("deleted %d in %d batches, want 95 in 10", res.Deleted, res.Batches)
		}
		// Every batch has a clean bound, the last, short one too (the
		// newest of the rows left).
		if want := map[bool]int{false: 10, true: 0}[sig.SkipLockedOnly]; res.RangeBatches != want {
			t.Errorf("%d batches by range, want %d", res.RangeBatches, want)
		}
		if batches := f.checkLoggedBatches(t, 10); batches != 10 {
			t.Errorf("%d transactions deleted rows, want 10", batches)
		}
		if f.count(t, "true") != 20 {
			t.Error("rows that had not expired were deleted")
		}
	})
}

// TestTiesAtTheBound: rows of one expiry that straddle a batch's bound
// would all fall into a range, however many they are: such a batch goes by
// ctid with LIMIT instead, and still no batch is larger than the size.
func TestTiesAtTheBound(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL+deleteLogDDL, inboxPolicy)
	f.insert(t, "early", 5, t0.Add(-3*time.Hour), time.Minute)
	f.insert(t, "tied", 25, t0.Add(-2*time.Hour), 0)
	f.insert(t, "late", 8, t0.Add(-time.Hour), time.Minute)
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}})
	// 5 early + 5 tied (by ctid: ties straddle the bound), 10 tied (ditto),
	// the last 10 tied (by range: the row after them is later), 8 late (by
	// range: the last batch, up to the newest of them).
	if res.Deleted != 38 || res.Batches != 4 || res.RangeBatches != 2 {
		t.Errorf("deleted %d in %d batches, %d by range; want 38 in 4, 2 by range", res.Deleted, res.Batches, res.RangeBatches)
	}
	if batches := f.checkLoggedBatches(t, 10); batches != 4 {
		t.Errorf("%d transactions deleted rows, want 4", batches)
	}
}

// TestRangeOnTimestampColumn: the range form's bound is read and passed
// back in the column's own type, so a timestamp column read as UTC keeps
// its exact boundary under a session time zone far from UTC.
func TestRangeOnTimestampColumn(t *testing.T) {
	t.Parallel()
	f := nserviceBusOutbox(t)
	boundary := t0.Add(-7 * 24 * time.Hour).UTC().Format("2006-01-02 15:04:05.999999")
	// 30 rows due (the newest exactly at the boundary), 10 not yet.
	pgtest.Exec(t, f.pool, `INSERT INTO "Sales_OutboxData" ("MessageId", "Dispatched", "DispatchedAt", "PersistenceVersion", "Operations")
SELECT 'm' || i, true, $1::timestamp - i * interval '1 millisecond', '1', '[]' FROM generate_series(-10, 29) i`, boundary)
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 7}})
	// Four of 7 rows and the short fifth, up to the newest row due (the
	// boundary itself, which a bound off by the zone would miss or pass).
	if res.Deleted != 30 || res.RangeBatches != 5 {
		t.Errorf("deleted %d, %d batches by range; want 30, 5 (the fifth short)", res.Deleted, res.RangeBatches)
	}
	var left int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM "Sales_OutboxData" WHERE "DispatchedAt" > $1::timestamp`, boundary).Scan(&left); err != nil || left != 10 {
		t.Errorf("%d rows after the boundary left (%v), want 10", left, err)
	}
}

func TestLockedRowsAreSkippedThenDeleted(t *testing.T) {
	t.Parallel()
	allForms(t, func(t *testing.T, sig signals) {
		ctx := context.Background()
		f := setup(t, inboxDDL, inboxPolicy)
		f.insert(t, "c", 50, t0.Add(-24*time.Hour), time.Minute)

		locker := pgtest.Lock(t, f.pool, "SELECT 1 FROM public.consumer_inbox WHERE message_id IN ('c-0', 'c-10') FOR UPDATE")

		started := time.Now()
		res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), LockTimeout: 5 * time.Second}, BatchSize: 7}})
		if res.Deleted != 48 || res.Retries != 0 {
			t.Errorf("deleted %d with %d retries, want 48 and none", res.Deleted, res.Retries)
		}
		// Waiting on the lock would have taken the whole lock timeout.
		if el := time.Since(started); el > 4*time.Second {
			t.Errorf("pass took %s: it waited on a locked row", el)
		}
		if n := f.count(t, "true"); n != 2 {
			t.Fatalf("%d rows left, want the 2 locked ones", n)
		}
		if err := locker.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Deleted != 2 {
			t.Errorf("the next pass deleted %d, want the 2 formerly locked rows", res.Deleted)
		}
	})
}

func TestLockTimeoutIsRetriedAndCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 20, t0.Add(-time.Hour), time.Minute)

	locker := pgtest.Lock(t, f.pool, "LOCK TABLE public.consumer_inbox IN ACCESS EXCLUSIVE MODE")

	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, nil)
	retried := make(chan string, 10)
	opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), LockTimeout: 50 * time.Millisecond}}, Metrics: m}
	done := make(chan TableResult, 1)
	go func() {
		res, _ := newTest(f.pool, f.tables, opts, signals{TestSignals: TestSignals{OnRetry: func(kind string) { retried <- kind }}}).RunPass(ctx)
		done <- res[0]
	}()
	select {
	case kind := <-retried:
		if kind != "lock_timeout" {
			t.Errorf("retry kind %q, want lock_timeout", kind)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no retry after a lock timeout")
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var res TableResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("pass did not finish after the lock was released")
	}
	if res.Err != nil || res.Deleted != 20 || res.Retries < 1 {
		t.Errorf("result %+v, want 20 deleted after at least one retry", res)
	}
	if v := testutil.ToFloat64(m.Errors.WithLabelValues("public.consumer_inbox", "lock_timeout")); v < 1 {
		t.Errorf("errors_total{kind=lock_timeout} = %v", v)
	}
	if v := testutil.ToFloat64(m.RowsDeleted.WithLabelValues("public.consumer_inbox")); v != 20 {
		t.Errorf("rows_deleted_total = %v, want 20", v)
	}
	if v := testutil.ToFloat64(m.LastSuccess.WithLabelValues("public.consumer_inbox")); v == 0 {
		t.Error("last_success_timestamp_seconds not set")
	}
}

func TestGivesUpAfterMaxRetriesWithoutEndingThePass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL+`CREATE TABLE public.other (id int, e timestamptz); CREATE INDEX ON public.other (e);
INSERT INTO public.other VALUES (1, '2000-01-01');`, inboxPolicy+`  - table: public.other
    key: [id]
    expires_at: e
`)
	f.insert(t, "c", 5, t0.Add(-time.Hour), time.Minute)
	pgtest.Lock(t, f.pool, "LOCK TABLE public.consumer_inbox IN ACCESS EXCLUSIVE MODE")
	res, err := New(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), LockTimeout: 10 * time.Millisecond, MaxRetries: 1}}}).RunPass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err == nil || retry.KindOf(errors.Unwrap(res[0].Err)) != retry.KindLockTimeout {
		t.Errorf("first table: err %v, want a lock timeout", res[0].Err)
	}
	if res[1].Err != nil || res[1].Deleted != 1 {
		t.Errorf("second table: %+v, want it cleaned despite the first failing", res[1])
	}
}

func TestHoldsAndReplays(t *testing.T) {
	t.Parallel()
	allForms(t, func(t *testing.T, sig signals) {
		ctx := context.Background()
		f := setup(t, inboxDDL, inboxPolicy)
		tbl := f.tables[0]
		// Every row expired; event times are expiry - 30d, one row per hour
		// from t0 - 10d.
		base := t0.Add(-10 * 24 * time.Hour)
		for _, c := range []string{"billing", "payments", "shipping", "email"} {
			f.insert(t, c, 48, base, time.Hour)
		}
		str := func(s string) *string { return &s }
		tm := func(d time.Duration) *time.Time { v := base.Add(-30*24*time.Hour + d); return &v }

		payments, err := holds.AddHold(ctx, f.pool, tbl, holds.HoldSpec{Scope: str("payments"), Reason: "legal", Owner: "legal"})
		if err != nil {
			t.Fatal(err)
		}
		// Billing rows with event time in [base-30d+10h, base-30d+20h): 10 rows.
		if _, err := holds.AddHold(ctx, f.pool, tbl, holds.HoldSpec{Scope: str("billing"), From: tm(10 * time.Hour), To: tm(20 * time.Hour), Reason: "incident", Owner: "ops"}); err != nil {
			t.Fatal(err)
		}
		// A range hold on every scope: email rows in [base-30d, +2h) also stay.
		if _, err := holds.AddHold(ctx, f.pool, tbl, holds.HoldSpec{From: tm(0), To: tm(2 * time.Hour), Reason: "audit", Owner: "ops"}); err != nil {
			t.Fatal(err)
		}
		// Expired at the pinned now: no effect. (AddHold refuses a hold that
		// has already ended, so it is written as one that has ended since.)
		pgtest.Exec(t, f.pool, `INSERT INTO inboxkeeper.holds (table_name, scope_value, reason, owner, expires_at)
VALUES ($1, 'email', 'old', 'ops', $2)`, tbl.Name, t0.Add(-time.Minute))
		replay, err := holds.StartReplay(ctx, f.pool, tbl, holds.ReplaySpec{Scope: "shipping", From: *tm(30 * time.Hour), To: *tm(40 * time.Hour), Owner: "ops"})
		if err != nil {
			t.Fatal(err)
		}

		dry := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), DryRun: true}}})
		res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 16}})
		// payments 48; billing 10 + 2 (range hold on all scopes); shipping 2 by the
		// all-scope range hold; email 2 by it as well.
		wantHeld := int64(48 + 12 + 2 + 2)
		if res.ProtectedByHolds != wantHeld || res.ProtectedByReplays != 10 {
			t.Errorf("protected by holds %d, by replays %d; want %d and 10", res.ProtectedByHolds, res.ProtectedByReplays, wantHeld)
		}
		if want := int64(4*48) - wantHeld - 10; res.Deleted != want {
			t.Errorf("deleted %d, want %d", res.Deleted, want)
		}
		if dry.Deleted != res.Deleted || dry.ProtectedByHolds != res.ProtectedByHolds || dry.ProtectedByReplays != res.ProtectedByReplays {
			t.Errorf("dry run %+v disagrees with the pass %+v", dry, res)
		}
		if n := f.count(t, "consumer = 'payments'"); n != 48 {
			t.Errorf("%d payments rows left, want all 48", n)
		}

		if err := holds.ReleaseHold(ctx, f.pool, payments); err != nil {
			t.Fatal(err)
		}
		if err := holds.ReleaseHold(ctx, f.pool, payments); !errors.Is(err, holds.ErrNotFound) {
			t.Errorf("releasing twice: %v, want ErrNotFound", err)
		}
		if err := holds.FinishReplay(ctx, f.pool, replay); err != nil {
			t.Fatal(err)
		}
		res = f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
		// Payments rows go but the 2 under the all-scope range hold; the
		// shipping rows the replay kept go; billing 10 + 2 and 2 of each other
		// scope stay.
		if res.Deleted != 46+10 || res.ProtectedByHolds != 18 {
			t.Errorf("after release: deleted %d, held %d; want 56 and 18", res.Deleted, res.ProtectedByHolds)
		}
	})
}

func TestHoldNeedsConfiguredColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    expires_at: remember_until
`)
	s := "x"
	from, to := t0, t0.Add(time.Hour)
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &s, Reason: "r", Owner: "o"}); !errors.Is(err, holds.ErrInvalid) || !strings.Contains(err.Error(), "scope") {
		t.Errorf("scope hold without a scope column: %v", err)
	}
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{From: &from, To: &to, Reason: "r", Owner: "o"}); !errors.Is(err, holds.ErrInvalid) || !strings.Contains(err.Error(), "event_time") {
		t.Errorf("range hold without an event_time column: %v", err)
	}
	if _, err := holds.StartReplay(ctx, f.pool, f.tables[0], holds.ReplaySpec{Scope: "x", From: from, To: to, Owner: "o"}); !errors.Is(err, holds.ErrInvalid) {
		t.Errorf("replay without columns: %v", err)
	}
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Owner: "o"}); !errors.Is(err, holds.ErrInvalid) {
		t.Errorf("hold without a reason: %v", err)
	}
	if err := holds.ReleaseHold(ctx, f.pool, 999); !errors.Is(err, holds.ErrNotFound) {
		t.Errorf("release unknown: %v", err)
	}
}

// TestFenceInFlightBatch races a hold against a batch that has already read
// the (empty) coverage and deleted rows but not committed: AddHold must not
// return before that batch commits, and no later batch deletes a held row.
func TestFenceInFlightBatch(t *testing.T) {
	t.Parallel()
	forms(t, func(t *testing.T, sig signals) {
		f := setup(t, inboxDDL, inboxPolicy)
		f.insert(t, "payments", 30, t0.Add(-time.Hour), time.Minute)
		res, _ := fenceRace(t, f, sig)
		// The in-flight batch deleted 10 before the hold existed; the rest stay.
		if res.Deleted != 10 {
			t.Errorf("pass deleted %d, want only the 10 of the batch already in flight", res.Deleted)
		}
		// The second batch's bound was read ahead while the first batch was
		// in flight, before the hold existed: the holds read under the fence
		// differ, so the batch read its own.
		if res.BoundsAhead != 0 {
			t.Errorf("%d bounds read ahead used, want none: the hold came after (%+v)", res.BoundsAhead, res)
		}
		if n := f.count(t, "true"); n != 20 {
			t.Errorf("%d rows left, want 20", n)
		}
	})
}

// TestBoundsReadAhead: in a pass of range batches, each batch's bound is
// read while the batch before it deletes, and the rows still go oldest
// first and all of them.
func TestBoundsReadAhead(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 200, t0.Add(-time.Hour), time.Second)
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}})
	if res.Deleted != 200 || res.Err != nil {
		t.Fatalf("pass %+v: want all 200 deleted", res)
	}
	// Every batch after the first has a bound read ahead, while the size
	// grows by the full 1.2x (or stays at its ceiling).
	if res.BoundsAhead == 0 || res.BoundsAhead > res.RangeBatches-1 {
		t.Errorf("%d bounds read ahead of %d range batches, want some, and never the first's", res.BoundsAhead, res.RangeBatches)
	}
}

// fenceRace runs a pass in batches of 10 and, while its first batch is
// held open before COMMIT, adds a hold on consumer payments. It checks
// that the hold writer queues on the fence and returns only after that
// batch committed, and returns the pass's result and the rows of that batch.
func fenceRace(t *testing.T, f fixture, sig signals) (TableResult, int64) {
	t.Helper()
	ctx := context.Background()
	inFlight := make(chan struct{})
	release := make(chan struct{})
	committed := make(chan struct{})
	first := true
	var firstRows int64
	// The optimistic form reads the next batch's bound ahead while the
	// first batch is in flight: the hold is added after that read.
	aheadRead := make(chan struct{}, 100)
	sig.AheadRead = func() { aheadRead <- struct{}{} }
	sig.BeforeCommit = func(_ string, n int64) {
		if first {
			first, firstRows = false, n
			// A Citus batch is a window, and a sweep a slice: neither has a bound.
			if !sig.SkipLockedOnly && !f.tables[0].Distributed() && sig.strategy != StrategySweep {
				select {
				case <-aheadRead:
				case <-time.After(30 * time.Second):
					t.Error("the next batch's bound was not read ahead while the first batch was in flight")
				}
			}
			close(inFlight)
			<-release
		}
	}
	passDone := make(chan TableResult, 1)
	go func() {
		res, _ := newTest(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}}, sig).RunPass(ctx)
		passDone <- res[0]
	}()
	select {
	case <-inFlight:
	case res := <-passDone:
		t.Fatalf("the pass ended before its first batch reached COMMIT: %+v", res)
	}

	holdDone := pgtest.QueueOnFence(t, f.pool, func() error {
		s := "payments"
		_, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &s, Reason: "legal", Owner: "legal"})
		select {
		case <-committed:
		default:
			err = fmt.Errorf("AddHold returned while a batch that ignored the hold was still open")
		}
		return err
	})
	close(committed) // the batch commits right after release
	close(release)

	if err := <-holdDone; err != nil {
		t.Fatal(err)
	}
	res := <-passDone
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	return res, firstRows
}

func TestRunTimeStopsThePass(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 100, t0.Add(-time.Hour), time.Second)
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10, RunTime: time.Nanosecond}})
	if res.StoppedEarly.Kind != retry.KindRunTime || res.Deleted >= 100 {
		t.Errorf("result %+v: want the pass stopped early by RUN_TIME", res)
	}
}

func TestCleanupLagAndStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "payments", 3, t0.Add(-48*time.Hour), time.Hour) // oldest, held
	f.insert(t, "c", 3, t0.Add(-24*time.Hour), time.Hour)        // due, not held
	f.insert(t, "d", 2, t0.Add(time.Hour), time.Hour)            // not due
	s := "payments"
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &s, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	d := New(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	st, err := d.Status(ctx, f.tables[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.Due != 3 || st.ProtectedByHolds != 3 || st.ProtectedByReplays != 0 || st.DueCapped || st.CleanupLag != 24*time.Hour || len(st.Holds) != 1 {
		t.Errorf("status %+v: want 3 due and 3 protected by holds (due rows are deletable now), lag 24h (held rows do not count), 1 hold", st)
	}
	if !st.Oldest.Equal(t0.Add(-48*time.Hour)) || !st.Newest.Equal(t0.Add(2*time.Hour)) {
		t.Errorf("oldest %v newest %v", st.Oldest, st.Newest)
	}
	// The look a pass begins with says the same (it exports the lag: a
	// pass held back by the throttle shows it until its first batch).
	var begin TableResult
	if due, err := d.look(ctx, f.tables[0], &begin, 0, nil); err != nil || due.Lag != 24*time.Hour || due.Rows != 3 ||
		begin.Oldest == nil || !begin.Oldest.Equal(t0.Add(-48*time.Hour)) {
		t.Errorf("the pass's first look: %+v, oldest %v (%v), want 3 due, lag 24h, oldest 48h ago", due, begin.Oldest, err)
	}
	if res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.CleanupLag != 0 || res.Deleted != 3 {
		t.Errorf("after a pass: %+v, want lag 0 and 3 deleted", res)
	}
}

// A row whose event time is unknown may lie inside a held range, so it
// stays; a row with no scope belongs to no scope's hold.
func TestHoldNullSemantics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, `CREATE TABLE public.consumer_inbox (consumer text, message_id text, event_time timestamptz, remember_until timestamptz);
CREATE INDEX ON public.consumer_inbox (remember_until);`, inboxPolicy)
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox VALUES
 ('a', '1', NULL, $1::timestamptz - interval '1 day'),
 ('a', '2', $1::timestamptz - interval '100 days', $1::timestamptz - interval '1 day'),
 (NULL, '3', $1::timestamptz - interval '5 days', $1::timestamptz - interval '1 day'),
 ('b', '4', $1::timestamptz - interval '5 days', $1::timestamptz - interval '1 day')`, t0)
	from, to := t0.Add(-10*24*time.Hour), t0
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{From: &from, To: &to, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	b := "b"
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &b, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	// Kept: 1 (NULL event time, in the range hold), 3 (in range), 4 (scope b).
	if res.Deleted != 1 || res.ProtectedByHolds != 3 {
		t.Errorf("deleted %d held %d, want 1 and 3", res.Deleted, res.ProtectedByHolds)
	}
	if f.count(t, "message_id = '2'") != 0 {
		t.Error("row 2 (outside every hold) was kept")
	}
}

// TestOptimisticFallsBackToSkipLocked: a batch runs without a lock pass
// while no row it picks is locked, and falls back to SKIP LOCKED, for that
// batch only, when one is: the locked row stays, every other row goes.
func TestOptimisticFallsBackToSkipLocked(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 40, t0.Add(-24*time.Hour), time.Minute)

	fallbacks := 0
	opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}}
	sig := signals{TestSignals: TestSignals{OnFallback: func() { fallbacks++ }}}
	res := f.passWith(t, sig, opts)
	if res.Deleted != 40 || res.SkipLockedBatches != 0 || fallbacks != 0 {
		t.Fatalf("no row locked: deleted %d, %d batches fell back (hook: %d); want 40 and none", res.Deleted, res.SkipLockedBatches, fallbacks)
	}

	f.insert(t, "d", 40, t0.Add(-24*time.Hour), time.Minute)
	pgtest.Lock(t, f.pool, "SELECT 1 FROM public.consumer_inbox WHERE message_id = 'd-15' FOR UPDATE")
	started := time.Now()
	res = f.passWith(t, sig, opts)
	// The second batch (rows 10 to 19) meets the locked row, waits the short
	// optimistic lock timeout, and runs again with SKIP LOCKED; the batches
	// before and after it need no fallback.
	if res.Deleted != 39 || res.SkipLockedBatches != 1 || fallbacks != 1 || res.Retries != 0 {
		t.Errorf("deleted %d, %d batches fell back (hook: %d), %d retries; want 39, 1, 1, 0", res.Deleted, res.SkipLockedBatches, fallbacks, res.Retries)
	}
	if el := time.Since(started); el > 5*time.Second {
		t.Errorf("pass took %s: it waited on the locked row beyond the optimistic lock timeout", el)
	}
	if n := f.count(t, "true"); n != 1 {
		t.Errorf("%d rows left, want the locked one", n)
	}
}

// TestApplicationWaitsAtMostLockTimeout: while the optimistic statement
// waits for a row the application holds, it holds the rows it has already
// deleted. Another application session that wants one of them waits on
// the deleter, but only until the deleter's lock timeout ends its wait and
// rolls the batch back; the fallback batch then skips both rows. In expiry
// order (the batch by ctid), and in a sweep (the slice by ctid range).
func TestApplicationWaitsAtMostLockTimeout(t *testing.T) {
	t.Parallel()
	for _, form := range []struct {
		strategy  Strategy
		statement string
	}{{"", `%d."remember_until" >= $%`}, {StrategySweep, "%d.ctid >= %"}} {
		t.Run("strategy_"+cmp.Or(string(form.strategy), "expiry"), func(t *testing.T) {
			t.Parallel()
			applicationWaitsAtMostLockTimeout(t, signals{strategy: form.strategy}, form.statement)
		})
	}
}

func applicationWaitsAtMostLockTimeout(t *testing.T, sig signals, statement string) {
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	// Inserted in expiry order: the DELETE's TID order is expiry order, so
	// it deletes c-5 before it reaches c-20.
	f.insert(t, "c", 40, t0.Add(-24*time.Hour), time.Minute)
	a := pgtest.Lock(t, f.pool, "SELECT 1 FROM public.consumer_inbox WHERE message_id = 'c-20' FOR UPDATE")

	const wait = 2 * time.Second // long enough to see the deleter waiting
	done := f.deleterWaitingOnALock(t, sig, wait, "pg_stat_activity", statement)
	if _, el := f.applicationWait(t, "SET LOCAL lock_timeout = '30s'", "SELECT 1 FROM public.consumer_inbox WHERE message_id = 'c-5' FOR UPDATE"); el > wait+time.Second {
		t.Errorf("the application session waited %s on the deleter, longer than its lock timeout %s", el, wait)
	}
	var res TableResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the pass did not finish")
	}
	// c-20 stays locked by a throughout. c-5 is locked by b once the
	// deleter's optimistic batch rolls back, but b re-locks the row only
	// after that rollback, so the fallback batch may take it first (b then
	// finds it deleted): 38 or 39 rows.
	if res.Err != nil || (res.Deleted != 38 && res.Deleted != 39) || res.SkipLockedBatches != 1 {
		t.Errorf("result %+v: want 38 or 39 deleted, the locked rows skipped by one fallback batch", res)
	}
	var left []string
	if err := a.QueryRow(ctx, "SELECT array_agg(message_id ORDER BY message_id) FROM public.consumer_inbox").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if len(left) != 40-int(res.Deleted) || !slices.Contains(left, "c-20") {
		t.Errorf("left %v after deleting %d, want c-20 (and maybe c-5) kept", left, res.Deleted)
	}
}

// deleterWaitingOnALock starts a pass with sig (optimistic lock wait and
// lock timeout wait) and returns once its batch waits on a locked row, seen in
// view running a statement LIKE query; the channel gets the pass's result.
func (f fixture) deleterWaitingOnALock(t *testing.T, sig signals, wait time.Duration, view, query string) <-chan TableResult {
	t.Helper()
	sig.OptimisticWait = wait
	done := make(chan TableResult, 1)
	go func() {
		res, _ := newTest(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), LockTimeout: wait}, BatchSize: 100}}, sig).RunPass(context.Background())
		done <- res[0]
	}()
	pgtest.WaitForLockWait(t, f.pool, view, query, "the deleter to wait on the locked row")
	return done
}

// applicationWait runs, in an application transaction of its own, setup
// and then sql, which takes a lock; it returns the transaction, still
// holding the lock, and how long sql waited for it.
func (f fixture) applicationWait(t *testing.T, setup, sql string) (pgx.Tx, time.Duration) {
	t.Helper()
	tx := pgtest.Lock(t, f.pool, setup)
	started := time.Now()
	pgtest.Exec(t, tx, sql)
	return tx, time.Since(started)
}

// TestFirstBatchBoundFromTheCount: where the pass's look counted fewer rows
// due than the first batch wants, that batch deletes them all by range up
// to the newest, without walking the index to a size-th row that is not
// there; where it counted more, every bound is walked to as before.
func TestFirstBatchBoundFromTheCount(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		size                       int
		strategy                   Strategy
		batches, ranges, fromCount int
	}{
		{50, "", 1, 1, 1},
		// 10, 10, 10 by range (the third ends exactly at the last due row),
		// then a batch that finds nothing. With the sample to choose, the
		// look counts up to two batches only; in expiry order it counts
		// them all, 30, more than the first batch wants.
		{10, "", 3, 3, 0},
		{10, StrategyExpiry, 3, 3, 0},
	} {
		t.Run(fmt.Sprintf("batch_%d_%s", c.size, cmp.Or(string(c.strategy), "auto")), func(t *testing.T) {
			t.Parallel()
			f := setup(t, inboxDDL+deleteLogDDL, inboxPolicy)
			f.insert(t, "c", 30, t0.Add(-24*time.Hour), time.Minute)
			f.insert(t, "later", 5, t0.Add(time.Hour), time.Minute) // not due
			res := f.pass(t, Options{Strategy: c.strategy, Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: c.size}})
			if res.Deleted != 30 || res.Batches != c.batches || res.RangeBatches != c.ranges || res.boundsFromCount != c.fromCount {
				t.Errorf("deleted %d in %d batches, %d by range, %d bounded from the count; want 30 in %d, %d, %d",
					res.Deleted, res.Batches, res.RangeBatches, res.boundsFromCount, c.batches, c.ranges, c.fromCount)
			}
			if f.count(t, "true") != 5 {
				t.Error("rows that had not expired were deleted")
			}
			if batches := f.checkLoggedBatches(t, c.size); batches != c.batches {
				t.Errorf("%d transactions deleted rows, want %d", batches, c.batches)
			}
		})
	}
}

// TestFirstBatchLongAfterTheLook: the bound a first batch takes from the
// pass's look is the newest row due at the look's cutoff, so that its range
// holds the rows counted and none that fell due since (those are the next
// pass's); a first batch that begins a second or more after the look (the
// throttle held it) reads its bound as any other batch, at its own cutoff,
// and the pass goes on through the rows that fell due meanwhile.
func TestFirstBatchLongAfterTheLook(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		gap                time.Duration
		deleted, fromCount int64
	}{{500 * time.Millisecond, 30, 1}, {2 * time.Second, 35, 0}} {
		t.Run(c.gap.String(), func(t *testing.T) {
			t.Parallel()
			f := setup(t, inboxDDL+deleteLogDDL, inboxPolicy)
			f.insert(t, "c", 30, t0.Add(-24*time.Hour), time.Minute)
			f.insert(t, "soon", 5, t0.Add(c.gap/2), 0) // due after the look, before the batch
			var calls atomic.Int32
			clock := service.Clock(func() time.Time {
				if calls.Add(1) == 1 {
					return t0 // the look's now
				}
				return t0.Add(c.gap)
			})
			res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: clock}, BatchSize: 50}})
			if res.Deleted != c.deleted || res.Batches != 1 || int64(res.boundsFromCount) != c.fromCount {
				t.Errorf("deleted %d in %d batches, %d bounded from the count; want %d in 1, %d", res.Deleted, res.Batches, res.boundsFromCount, c.deleted, c.fromCount)
			}
		})
	}
}

// TestRangeScanTrials: a pass's first range batches alternate the index
// scan and the bitmap heap scan, two of each, and then keep one; both
// delete exactly their range, oldest first.
func TestRangeScanTrials(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL+deleteLogDDL, inboxPolicy)
	f.insert(t, "c", 75, t0.Add(-24*time.Hour), time.Minute)
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}})
	// 8 range batches, the last of them short.
	if res.Deleted != 75 || res.Batches != 8 || res.RangeBatches != 8 {
		t.Fatalf("deleted %d in %d batches, %d by range; want 75 in 8, 8 by range", res.Deleted, res.Batches, res.RangeBatches)
	}
	// Trials: index, bitmap, index, bitmap; then four of the one chosen.
	if b := res.BitmapBatches; b != 2 && b != 6 {
		t.Errorf("%d range batches read by bitmap, want 2 (index scan chosen) or 6 (bitmap chosen)", b)
	}
	if batches := f.checkLoggedBatches(t, 10); batches != 8 {
		t.Errorf("%d transactions deleted rows, want 8", batches)
	}
}

func TestScanChooser(t *testing.T) {
	t.Parallel()
	var c scanChooser
	var got []bool
	for range 2 * scanTrials {
		b := c.next()
		got = append(got, b)
		took := 10 * time.Millisecond // a bitmap batch is twice as fast
		if b {
			took = 5 * time.Millisecond
		}
		c.observe(b, 1000, took)
	}
	if fmt.Sprint(got) != "[false true false true]" {
		t.Errorf("trials %v, want alternating, index scan first", got)
	}
	if !c.next() {
		t.Error("after the trials the faster bitmap scan was not chosen")
	}
	c = scanChooser{}
	for range 2 * scanTrials {
		b := c.next()
		c.observe(b, 1000, map[bool]time.Duration{false: time.Millisecond, true: 3 * time.Millisecond}[b])
	}
	if c.next() {
		t.Error("after the trials the faster index scan was not chosen")
	}
}

// When every row a pass leaves lies behind its keyset (held rows older than
// the last one it deleted), the retained range still has both ends: the
// held rows' oldest expiry and the newest. (An oldest without a newest
// crashed the daemon's metrics.)
func TestRetainedRangeWhenOnlyHeldRowsAreLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "held", 3, t0.Add(-48*time.Hour), time.Hour)
	f.insert(t, "c", 3, t0.Add(-24*time.Hour), time.Hour)
	s := "held"
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &s, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	if res.Deleted != 3 || res.Oldest == nil || res.Newest == nil ||
		!res.Oldest.Equal(t0.Add(-48*time.Hour)) || !res.Newest.Equal(t0.Add(-46*time.Hour)) {
		t.Fatalf("pass: deleted %d, oldest %v, newest %v; want 3, and the held rows' %v and %v",
			res.Deleted, res.Oldest, res.Newest, t0.Add(-48*time.Hour), t0.Add(-46*time.Hour))
	}
}

// While the throttle holds a pass back before its first batch, rows_due
// and the cleanup lag keep up: rows that fall due meanwhile show, as they
// would between passes. (They were refreshed only at a batch's end, so a
// pass held back for hours froze them at its start.)
func TestDueRefreshedWhileHeldBack(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "c", 3, t0.Add(-time.Hour), time.Second)
	reg := prometheus.NewRegistry()
	open := make(chan struct{})
	gate := gatetest.Held{Open: open, Reason: "test"}
	estimates := make(chan int64, 100)
	d := New(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), Throttle: gate}}, Metrics: NewMetrics(reg, nil),
		Progress: func(p Progress) { estimates <- p.Estimate }})
	d.dueRefresh = 20 * time.Millisecond
	refreshed := make(chan struct{}, 100)
	d.TestSignals.OnDueRefresh = func() { refreshed <- struct{}{} }
	done := make(chan []TableResult, 1)
	go func() {
		res, err := d.RunPass(context.Background())
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	wait := func() {
		t.Helper()
		select {
		case <-refreshed:
		case <-time.After(30 * time.Second):
			t.Fatal("no count of the due rows within 30 s while the pass was held back")
		}
	}
	wait()
	if due, lag := gauge(t, reg, "inboxkeeper_rows_due"), gauge(t, reg, "inboxkeeper_cleanup_lag_seconds"); due != 3 || lag != 3600 {
		t.Errorf("held back: rows_due %v, lag %vs, want 3 and 3600", due, lag)
	}
	f.insert(t, "c2", 2, t0.Add(-2*time.Hour), time.Second)
	for len(refreshed) > 0 { // the counts that ended before the insert
		<-refreshed
	}
	for range 2 { // one count may have begun before the insert
		wait()
	}
	if due, lag := gauge(t, reg, "inboxkeeper_rows_due"), gauge(t, reg, "inboxkeeper_cleanup_lag_seconds"); due != 5 || lag != 7200 {
		t.Errorf("rows fell due while held back: rows_due %v, lag %vs, want 5 and 7200", due, lag)
	}
	close(open)
	select {
	case res := <-done:
		if res[0].Err != nil || res[0].Deleted != 5 {
			t.Errorf("the pass once let go: %+v, want the 5 due rows deleted", res[0])
		}
		// The progress line counts down from the last count, not from the
		// 3 the pass began with.
		if len(estimates) == 0 {
			t.Fatal("no progress line")
		}
		if e := <-estimates; e != 5 {
			t.Errorf("the first batch's progress estimated %d rows, want the 5 the last count saw", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the pass did not end within 30 s of the throttle letting go")
	}
}
