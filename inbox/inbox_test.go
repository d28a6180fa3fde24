package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const day = 24 * time.Hour

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// The article's worked example as a deployed rule: replay horizon 48 days
// (restore 45 d then backlog 3 d), dead-letter redrive 30 days after first
// receipt, margin 2 days.
const exampleRule = `INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, post_receipt, replay, margin)
VALUES ('public', 'consumer_inbox', 'payments', interval '30 days', interval '48 days', interval '2 days')`

// layouts are the recommended tables by name. The partitioned one gets
// partitions that take every remember_until the tests write, as the
// daemon's partition manager would have made them.
var layouts = map[string]string{
	"plain": inbox.PlainDDL,
	"partitioned": inbox.PartitionedDDL + `
CREATE TABLE public.consumer_inbox_p1 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2020-01-01') TO ('2026-07-01');
CREATE TABLE public.consumer_inbox_p2 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-07-01') TO ('2030-01-01');`,
}

func setup(t *testing.T, layout string) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.NewMigratedPool(t, layouts[layout], exampleRule)
	return pool
}

// countingClaimer is a Claimer with metrics of its own.
func countingClaimer() *inbox.Claimer {
	return &inbox.Claimer{Metrics: inbox.NewMetrics(prometheus.NewRegistry())}
}

func msg(id, payload string, event time.Time) inbox.Message {
	return inbox.Message{Table: "public.consumer_inbox", Consumer: "payments", MessageID: id, Payload: []byte(payload), EventTime: event}
}

// claimAt claims m in its own committed transaction with now pinned at now.
func claimAt(t *testing.T, pool *pgxpool.Pool, c *inbox.Claimer, now time.Time, m inbox.Message) inbox.Result {
	t.Helper()
	c.Clock = func() time.Time { return now }
	var r inbox.Result
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		r, err = c.Claim(context.Background(), tx, m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBoundary(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			pool := setup(t, layout)
			c := &inbox.Claimer{}
			m := msg("m-1", "pay 10 EUR", t0)
			first := claimAt(t, pool, c, t0, m)
			if first.Kind != inbox.Fresh || !first.Kind.Apply() {
				t.Fatalf("first delivery: %+v", first)
			}
			// max(t0 + 30d, t0 + 48d) + 2d.
			ru := t0.Add(50 * day)
			if !first.RememberUntil.Equal(ru) {
				t.Fatalf("remember_until %s, want %s", first.RememberUntil, ru)
			}
			if r := claimAt(t, pool, c, ru.Add(-time.Second), m); r.Kind != inbox.Duplicate || r.Kind.Apply() || r.Age != 50*day-time.Second {
				t.Errorf("at remember_until - 1s: %+v, want a duplicate aged 50d-1s", r)
			}
			// At remember_until the promise has ended: the expired policy
			// applies, whether or not the cleaner has run.
			r := claimAt(t, pool, c, ru, m)
			if r.Kind != inbox.ExpiredRedelivery || !r.Kind.Apply() || !r.FirstSeenAt.Equal(ru) {
				t.Errorf("at remember_until: %+v, want an expired redelivery, first seen anew", r)
			}
			// The identity is remembered again from that moment on.
			if r := claimAt(t, pool, c, ru.Add(time.Second), m); r.Kind != inbox.Duplicate {
				t.Errorf("after the redelivery: %+v, want a duplicate", r)
			}
			m2 := msg("m-2", "x", t0)
			claimAt(t, pool, c, t0, m2)
			if r := claimAt(t, pool, c, ru.Add(time.Second), m2); r.Kind != inbox.ExpiredRedelivery {
				t.Errorf("at remember_until + 1s: %+v, want an expired redelivery", r)
			}
			var rows int
			if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM public.consumer_inbox").Scan(&rows); err != nil || rows != 2 {
				t.Errorf("%d rows (%v), want one per identity", rows, err)
			}
		})
	}
}

func TestConflictIsNeverSuppressed(t *testing.T) {
	t.Parallel()
	pool := setup(t, "plain")
	c := countingClaimer()
	claimAt(t, pool, c, t0, msg("m-1", "pay 10 EUR", t0))
	r := claimAt(t, pool, c, t0.Add(20*day), msg("m-1", "pay 1000 EUR", t0))
	if r.Kind != inbox.Conflict || r.Kind.Apply() || r.Age != 20*day {
		t.Errorf("same id, other payload after 20 days: %+v, want a conflict aged 20d", r)
	}
	if v := testutil.ToFloat64(c.Metrics.Conflicts.WithLabelValues("public.consumer_inbox")); v != 1 {
		t.Errorf("conflicts counted %v, want 1", v)
	}
	// The stored hash is the original one: a conflict changes nothing.
	if r := claimAt(t, pool, c, t0.Add(21*day), msg("m-1", "pay 10 EUR", t0)); r.Kind != inbox.Duplicate {
		t.Errorf("the original payload again: %+v, want a duplicate", r)
	}
}

// The article's scenarios, through the claim path, with the worked example's
// rule (replay 48 d from the event, redrive 30 d from first receipt, 2 d margin).
func TestScenarios(t *testing.T) {
	t.Parallel()
	pool := setup(t, "plain")
	c := countingClaimer()

	// Restored backup: 45 days after the event the restore replays it, and
	// the backlog holds it 3 more days: still blocked on day 48.
	claimAt(t, pool, c, t0, msg("restore", "a", t0))
	if r := claimAt(t, pool, c, t0.Add(48*day), msg("restore", "a", t0)); r.Kind != inbox.Duplicate {
		t.Errorf("restore + backlog on day 48: %+v, want duplicate", r)
	}
	// Dead-letter redrive 29 days after first receipt: blocked.
	claimAt(t, pool, c, t0, msg("dlq", "b", t0))
	if r := claimAt(t, pool, c, t0.Add(29*day), msg("dlq", "b", t0)); r.Kind != inbox.Duplicate {
		t.Errorf("redrive on day 29: %+v, want duplicate", r)
	}
	// Offset rewind of 10 days: blocked.
	claimAt(t, pool, c, t0, msg("rewind", "c", t0))
	if r := claimAt(t, pool, c, t0.Add(10*day), msg("rewind", "c", t0)); r.Kind != inbox.Duplicate {
		t.Errorf("rewind on day 10: %+v, want duplicate", r)
	}
	// Late first delivery: the event is 60 days old when first seen. An
	// anchor on event time alone would forget it at once; first receipt
	// keeps it 30 + 2 days, so tomorrow's retry is blocked. It is late.
	old := t0.Add(-60 * day)
	first := claimAt(t, pool, c, t0, msg("late", "d", old))
	if first.Kind != inbox.Fresh || !first.Late || !first.RememberUntil.Equal(t0.Add(32*day)) {
		t.Errorf("late first delivery: %+v, want fresh, late, remembered until t0+32d", first)
	}
	if r := claimAt(t, pool, c, t0.Add(day), msg("late", "d", old)); r.Kind != inbox.Duplicate {
		t.Errorf("retry of a late first delivery: %+v, want duplicate", r)
	}
	if v := testutil.ToFloat64(c.Metrics.Late.WithLabelValues("public.consumer_inbox")); v != 1 {
		t.Errorf("late deliveries counted %v, want 1", v)
	}
	if v := testutil.ToFloat64(c.Metrics.Claims.WithLabelValues("public.consumer_inbox", "duplicate")); v != 4 {
		t.Errorf("duplicates counted %v, want 4", v)
	}
	if n := testutil.CollectAndCount(c.Metrics.DuplicateAge); n != 1 {
		t.Errorf("duplicate age histogram series: %d", n)
	}
}

// A row whose promise ended is redelivered while the cleaner runs: whether
// the cleaner deleted it first or not, the claim treats it the same way.
func TestCleanupConcurrentWithDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t, "plain")
	c := &inbox.Claimer{}
	m := msg("m-1", "a", t0)
	claimAt(t, pool, c, t0, m)
	expired := t0.Add(51 * day)

	// The claim looks the row up, then the cleaner deletes it before the
	// claim's own UPDATE: the claim must still write the identity.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	cleaner, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, cleaner, "DELETE FROM public.consumer_inbox WHERE remember_until <= $1", expired)
	done := make(chan inbox.Result, 1)
	go func() {
		c := &inbox.Claimer{Clock: func() time.Time { return expired }}
		r, err := c.Claim(ctx, tx, m)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	// The claim's UPDATE waits on the cleaner's row lock.
	pgtest.WaitFor(t, 30*time.Second, "the claim to wait on the cleaner's row lock", func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%inboxkeeper.claim%'").Scan(&n)
		return n > 0
	})
	if err := cleaner.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r.Kind != inbox.ExpiredRedelivery {
		t.Errorf("claim racing the cleaner: %+v, want an expired redelivery", r)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until > $1", expired).Scan(&n); err != nil || n != 1 {
		t.Errorf("identity rows after the race: %d (%v), want 1", n, err)
	}
	// And after the cleaner: a plain fresh claim, the same decision to apply.
	pgtest.Exec(t, pool, "DELETE FROM public.consumer_inbox")
	if r := claimAt(t, pool, &inbox.Claimer{}, expired, m); r.Kind != inbox.Fresh || !r.Kind.Apply() {
		t.Errorf("after the cleaner: %+v", r)
	}
}

// Exactly one of many concurrent claims of one identity is fresh, also on
// the partitioned layout that has no unique index.
func TestConcurrentClaims(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			concurrentClaims(t, setup(t, layout), lockWaits)
		})
	}
}

// lockWaits counts the claims of this test's database that wait on a lock,
// whatever serialises them (a unique key, a row lock). pg_stat_activity
// shows every database of the shared cluster: this test's other layout, or
// another run of it, waits in its own.
const lockWaits = `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
  AND query LIKE '%inboxkeeper.claim%' AND datname = current_database()`

// concurrentClaims claims one identity from many transactions at once and
// checks that exactly one claim is fresh, the others duplicates, and one
// row was written. waiting counts the claims that wait on another.
func concurrentClaims(t *testing.T, pool *pgxpool.Pool, waiting string) {
	t.Helper()
	ctx := context.Background()
	const n = 8
	first := pgtest.Begin(t, pool)
	c := &inbox.Claimer{Clock: func() time.Time { return t0 }}
	r0, err := c.Claim(ctx, first, msg("same", "a", t0))
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan inbox.Kind, n)
	var wg sync.WaitGroup
	for range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				r, err := c.Claim(ctx, tx, msg("same", "a", t0))
				results <- r.Kind
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	// Hold the first claim open until every other one waits on it.
	pgtest.WaitFor(t, 30*time.Second, "every other claim to wait on the first", func() bool {
		var w int
		_ = pool.QueryRow(ctx, waiting).Scan(&w)
		return w == n-1
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(results)
	fresh := 0
	if r0.Kind == inbox.Fresh {
		fresh++
	}
	for k := range results {
		if k == inbox.Fresh {
			fresh++
		} else if k != inbox.Duplicate {
			t.Errorf("unexpected %s", k)
		}
	}
	if fresh != 1 {
		t.Errorf("%d fresh claims, want exactly 1", fresh)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM public.consumer_inbox").Scan(&rows); err != nil || rows != 1 {
		t.Errorf("%d rows (%v), want 1", rows, err)
	}
}

func TestExtensionRule(t *testing.T) {
	t.Parallel()
	pool := setup(t, "plain")
	c := &inbox.Claimer{}
	claimAt(t, pool, c, t0, msg("m", "a", t0))
	// Without an extension rule a duplicate never moves remember_until.
	if r := claimAt(t, pool, c, t0.Add(49*day), msg("m", "a", t0)); !r.RememberUntil.Equal(t0.Add(50 * day)) {
		t.Errorf("no extension rule, remember_until moved to %s", r.RememberUntil)
	}
	pgtest.Exec(t, pool, `UPDATE inboxkeeper.retention_rules SET (extend_on_duplicate, extend_by, extension_cap) = (true, interval '7 days', interval '60 days')`)
	r := claimAt(t, pool, c, t0.Add(49*day), msg("m", "a", t0))
	if !r.RememberUntil.Equal(t0.Add(56 * day)) {
		t.Errorf("extended to %s, want now + 7d = t0+56d", r.RememberUntil)
	}
	// A producer that keeps resending cannot keep the key alive past the cap.
	for d := 50; d < 60; d++ {
		r = claimAt(t, pool, c, t0.Add(time.Duration(d)*day), msg("m", "a", t0))
	}
	if !r.RememberUntil.Equal(t0.Add(60 * day)) {
		t.Errorf("extended to %s, want the cap first_seen + 60d", r.RememberUntil)
	}
	if r := claimAt(t, pool, c, t0.Add(60*day), msg("m", "a", t0)); r.Kind != inbox.ExpiredRedelivery {
		t.Errorf("at the cap: %+v, want expired", r)
	}
}

func TestClaimErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t, "plain")
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		_, err := inbox.Claim(ctx, tx, msg("m", "a", t0))
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Errorf("repeatable read: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*inbox.Message)
		want string // in the error; "" for any error
	}{
		{"no rule", func(m *inbox.Message) { m.Consumer = "unknown" }, "no retention rule"},
		{"no payload or hash", func(m *inbox.Message) { m.Payload = nil }, ""},
		{"unknown table", func(m *inbox.Message) { m.Table = "public.nope" }, "nope"},
	} {
		m := msg("m", "a", t0)
		c.edit(&m)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := inbox.Claim(ctx, tx, m)
			return err
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
