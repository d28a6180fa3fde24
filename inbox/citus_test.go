package inbox_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/pgtest"
)

// setupCitus is setup on a Citus coordinator: the plain recommended layout
// hash-distributed on consumer (4 shards over the workers), the control
// schema on the coordinator.
func setupCitus(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, url := pgtest.NewCitusPool(t)
	pgtest.Migrate(t, url)
	ddl, err := os.ReadFile("testdata/inbox_plain.sql")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pool, string(ddl))
	pgtest.Exec(t, pool, `SET citus.shard_count = 4; SELECT create_distributed_table('public.consumer_inbox', 'consumer')`)
	pgtest.Exec(t, pool, exampleRule)
	return pool
}

// On a distributed inbox, concurrent claims of one identity give exactly one
// fresh and duplicates otherwise; the identity lock is taken on the
// coordinator, where every claim runs.
func TestConcurrentClaimsOnCitus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setupCitus(t)
	const n = 8
	c := &inbox.Claimer{Clock: func() time.Time { return t0 }}
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
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
	pgtest.WaitFor(t, 30*time.Second, "every other claim to wait on the identity lock", func() bool {
		var w int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&w)
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

// The other results on a distributed inbox are those of one node: a
// duplicate, a conflict, an extension, an expired redelivery (the row
// reused), and a fresh claim once the cleaner deleted the expired row.
func TestClaimResultsOnCitus(t *testing.T) {
	t.Parallel()
	pool := setupCitus(t)
	c := &inbox.Claimer{}
	m := msg("m-1", "pay 10 EUR", t0)
	if r := claimAt(t, pool, c, t0, m); r.Kind != inbox.Fresh || !r.RememberUntil.Equal(t0.Add(50*day)) {
		t.Fatalf("first delivery: %+v, want fresh until t0+50d", r)
	}
	if r := claimAt(t, pool, c, t0.Add(day), m); r.Kind != inbox.Duplicate || r.Age != day {
		t.Errorf("second delivery: %+v, want a duplicate aged 1d", r)
	}
	if r := claimAt(t, pool, c, t0.Add(2*day), msg("m-1", "pay 1000 EUR", t0)); r.Kind != inbox.Conflict {
		t.Errorf("other payload: %+v, want a conflict", r)
	}
	pgtest.Exec(t, pool, `UPDATE inboxkeeper.retention_rules SET (extend_on_duplicate, extend_by, extension_cap) = (true, interval '7 days', interval '60 days')`)
	if r := claimAt(t, pool, c, t0.Add(49*day), m); r.Kind != inbox.Duplicate || !r.RememberUntil.Equal(t0.Add(56*day)) {
		t.Errorf("duplicate with an extension rule: %+v, want remembered until t0+56d", r)
	}
	ru := t0.Add(56 * day)
	if r := claimAt(t, pool, c, ru, m); r.Kind != inbox.ExpiredRedelivery || !r.FirstSeenAt.Equal(ru) {
		t.Errorf("at remember_until: %+v, want an expired redelivery first seen anew", r)
	}
	if r := claimAt(t, pool, c, ru.Add(time.Second), m); r.Kind != inbox.Duplicate {
		t.Errorf("after the redelivery: %+v, want a duplicate", r)
	}
	// Expired and deleted by the cleaner: the identity is new.
	m2 := msg("m-2", "x", t0)
	claimAt(t, pool, c, t0, m2)
	pgtest.Exec(t, pool, `DELETE FROM public.consumer_inbox WHERE consumer = 'payments' AND message_id = 'm-2'`)
	if r := claimAt(t, pool, c, t0.Add(61*day), m2); r.Kind != inbox.Fresh {
		t.Errorf("after the cleaner deleted it: %+v, want fresh", r)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM public.consumer_inbox").Scan(&rows); err != nil || rows != 2 {
		t.Errorf("%d rows (%v), want one per identity", rows, err)
	}
}
