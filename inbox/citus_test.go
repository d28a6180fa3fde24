package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// setupCitus is setup on a Citus coordinator: the plain recommended layout
// hash-distributed on consumer over the workers, the control schema on the
// coordinator.
func setupCitus(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.NewMigratedCitusPool(t, inbox.PlainDDL, pgtest.Distribute("consumer", "public.consumer_inbox"), exampleRule)
	return pool
}

// On a distributed inbox, concurrent claims of one identity give exactly one
// fresh and duplicates otherwise: the unique key of the identity's shard
// serialises them, so they wait on a worker, where Citus's view of the
// cluster's lock waits sees them.
func TestConcurrentClaimsOnCitus(t *testing.T) {
	t.Parallel()
	concurrentClaims(t, setupCitus(t), `SELECT count(DISTINCT waiting_gpid) FROM citus_lock_waits
  WHERE blocked_statement LIKE '%inboxkeeper.claim%'`)
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
