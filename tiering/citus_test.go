package tiering

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// setupCitus is setup on a Citus coordinator: the inbox and side table
// distributed on consumer, the permanent key table created by
// EnsureKeyTable.
func setupCitus(t *testing.T, pol string) fixture {
	t.Helper()
	ctx := context.Background()
	// The inbox and its side table distributed on consumer, co-located.
	pool, _ := pgtest.NewMigratedCitusPool(t, inboxDDL, pgtest.Distribute("consumer", "public.inbox", "public.inbox_payload"))
	ct := resolve(t, pool, pol)
	if !ct.Distributed() {
		t.Fatalf("public.inbox not seen as distributed")
	}
	created, err := EnsureKeyTable(ctx, pool, ct)
	if err != nil || !created {
		t.Fatalf("EnsureKeyTable on Citus: created=%v, %v", created, err)
	}
	return fixture{pool: pool, table: ct}
}

// asDaemon is f with its pool connected as role.sql's daemon role, given
// what the layout of policy needs: the Citus tests of this package demote
// and measure with only its grants.
func (f fixture) asDaemon(t *testing.T, policy string) fixture {
	t.Helper()
	db := pgtest.CurrentDatabase(t, f.pool)
	vars := []map[string]string{{"table_schema": "public", "table_name": "inbox", "expiry_column": "remember_until",
		"keys_schema": "inboxkeeper", "keys_table": "keys_public_inbox"}}
	if policy == sidePolicy {
		vars[0]["payload_schema"], vars[0]["payload_table"], vars[0]["anchor_column"] = "public", "inbox_payload", "first_seen_at"
	} else {
		for _, c := range []string{"payload", "headers"} {
			vars = append(vars, map[string]string{"table_schema": "public", "table_name": "inbox", "expiry_column": "remember_until", "payload_column": c})
		}
	}
	roles := pgtest.ApplyRoleScript(t, pgtest.Citus(t).Coordinator.URL(db), vars...)
	return fixture{pool: pgtest.Pool(t, roles.Daemon), table: f.table}
}

// Demotion on a distributed table, both layouts: the due rows of every
// shard are demoted in ordered batches, a legal hold keeps its payload, a
// second pass finds nothing; the key table is distributed on consumer and
// co-located with the inbox, and keys written into it land there.
func TestDemotionOnCitus(t *testing.T) {
	t.Parallel()
	eachLayout(t, func(t *testing.T, policy string) {
		ctx := context.Background()
		f := setupCitus(t, policy)
		base := t0.Add(-10 * 24 * time.Hour) // due for demotion, not expired
		for _, c := range []string{"a", "b", "c", "d", "legal"} {
			f.insert(t, c, 10, base, time.Hour)
		}
		f.insert(t, "fresh", 5, t0.Add(-time.Hour), time.Minute)
		s := "legal"
		if _, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: &s, Reason: "litigation", Owner: "legal"}); err != nil {
			t.Fatal(err)
		}
		dryRun := at(t0)
		dryRun.DryRun = true
		dry := f.demote(t, dryRun)
		batches := at(t0)
		batches.BatchSize = 15
		res := f.demote(t, batches)
		if res.Demoted != 40 || res.ProtectedByHolds != 10 || res.Batches != 3 {
			t.Errorf("demoted %d in %d batches, protected %d; want 40 in 3, 10 protected", res.Demoted, res.Batches, res.ProtectedByHolds)
		}
		if dry.Demoted != res.Demoted {
			t.Errorf("dry run would demote %d, the pass demoted %d", dry.Demoted, res.Demoted)
		}
		if n := f.hot(t, "consumer IN ('a', 'b', 'c', 'd')"); n != 0 {
			t.Errorf("%d due rows kept their payload", n)
		}
		if n := f.hot(t, "consumer IN ('legal', 'fresh')"); n != 15 {
			t.Errorf("%d of 15 held or hot rows kept their payload", n)
		}
		if n := f.count(t, "SELECT count(*) FROM public.inbox"); n != 55 {
			t.Errorf("%d inbox rows left, want all 55: demotion deletes no identity", n)
		}
		if res := f.demote(t, at(t0)); res.Demoted != 0 {
			t.Errorf("second pass demoted %d", res.Demoted)
		}

		var colocated bool
		if err := f.pool.QueryRow(ctx, `SELECT k.partmethod = 'h' AND column_to_column_name(k.logicalrelid, k.partkey) = 'consumer' AND k.colocationid = i.colocationid
FROM pg_dist_partition k, pg_dist_partition i
WHERE k.logicalrelid = 'inboxkeeper.keys_public_inbox'::regclass AND i.logicalrelid = 'public.inbox'::regclass`).Scan(&colocated); err != nil || !colocated {
			t.Errorf("key table hash-distributed on consumer and co-located with the inbox: %v, %v", colocated, err)
		}
		// The key table takes keys as the partitions feature writes them.
		tx := pgtest.Begin(t, f.pool)
		n, err := CopyPermanentKeys(ctx, tx, f.table, "public.inbox")
		if err != nil || n != 55 {
			t.Errorf("CopyPermanentKeys on Citus: %d, %v; want 55", n, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// Once the key table exists, resolving and ensuring it again
		// accept it as it is.
		ct := resolve(t, f.pool, policy)
		if created, err := EnsureKeyTable(ctx, f.pool, ct); err != nil || created || !KeyOf(ct).Exists {
			t.Errorf("second EnsureKeyTable: created=%v, %v", created, err)
		}

		// The tiers are measured on the shards (the coordinator's copies
		// are empty): 15 hot rows, 40 warm, 55 permanent keys.
		pgtest.Exec(t, f.pool, "ANALYZE")
		st, err := Measure(ctx, f.asDaemon(t, policy).pool, ct)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("measured: %+v", st)
		near := func(got, want float64) bool { return got > want-0.5 && got < want+0.5 }
		if !near(st.Rows[Hot], 15) || !near(st.Rows[Warm], 40) || !near(st.Rows[Permanent], 55) ||
			st.BytesPerKey[Warm] <= 0 || st.BytesPerKey[Hot] <= st.BytesPerKey[Warm] || st.BytesPerKey[Permanent] <= 0 {
			t.Errorf("tiers measured on the shards: %+v; want 15 hot, 40 warm, 55 permanent, each with its bytes", st)
		}
	})
}

// A row an application holds locked on a worker: SKIP LOCKED does not run on
// a distributed table, so the batch that meets it waits at most the short
// locked-row wait (forwarded to the worker), rolls back, is halved until it
// commits without the row, and steps over it, as SKIP LOCKED would; the
// next pass, once the row is free, demotes it.
func TestDemotionOnCitusStepsOverALockedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupCitus(t, sidePolicy)
	f.insert(t, "a", 10, t0.Add(-10*24*time.Hour), time.Hour)
	app := pgtest.Lock(t, f.pool, `SELECT 1 FROM public.inbox_payload WHERE consumer = 'a' AND message_id = 'a-4' FOR UPDATE`)

	steps := 0
	o := at(t0)
	o.LockTimeout = 20 * time.Second
	d := New(f.asDaemon(t, sidePolicy).pool, f.tables(), o)
	d.TestSignals.OnStep = func() { steps++ }
	began := time.Now()
	res, err := d.RunPass(ctx)
	took := time.Since(began)
	t.Logf("took %s: %+v", took, res)
	if err != nil || res[0].Err != nil || res[0].Demoted != 9 || res[0].Retries != 0 || steps != 1 {
		t.Fatalf("pass over a locked row: %v, %+v, %d steps; want 9 demoted, no retry, one step", err, res, steps)
	}
	// Waiting on the row for the set lock timeout would take 20 s; the
	// batch halves from 5,000 rows to the 4 before the row, then to 1:
	// about 15 failed attempts of 50 ms and a distributed round trip each
	// (1.8 s here, on a loaded machine).
	if took > 15*time.Second {
		t.Errorf("the pass took %s against a locked row: it waited on it", took)
	}
	if n := f.hot(t, "true"); n != 1 {
		t.Errorf("%d rows kept their payload, want the locked one", n)
	}
	if err := app.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res := f.demote(t, at(t0)); res.Demoted != 1 {
		t.Errorf("once the row is free the pass demoted %d, want 1", res.Demoted)
	}
}

func (f fixture) tables() []*catalog.Table { return []*catalog.Table{f.table} }

// On a reference table and a Citus local table demotion goes as on a
// distributed one (Citus refuses the one-node batch's ctid list there),
// both layouts, the side table made the same kind of table. A row an
// application holds locked is stepped over on the Citus local table; the
// reference table Citus locks whole for that session, so the pass ends
// with the lock timeout, demoting nothing, and says why. Once the row is
// free, the next pass demotes the rest. Once, every batch on such a table
// failed (cannot perform distributed planning).
func TestDemotionOnCitusReferenceAndLocalTables(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"create_reference_table", "citus_add_local_table_to_metadata"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			eachLayout(t, func(t *testing.T, policy string) {
				ctx := context.Background()
				sql := []string{inboxDDL, "SELECT " + kind + "('public.inbox')"}
				if policy == sidePolicy {
					sql = append(sql, "SELECT "+kind+"('public.inbox_payload')")
				}
				pool, _ := pgtest.NewMigratedCitusPool(t, sql...)
				f := fixture{pool: pool, table: resolve(t, pool, policy)}
				if !f.table.ThroughCitus() || f.table.Distributed() {
					t.Fatalf("public.inbox resolves through Citus %v, distributed %v; want true, false", f.table.ThroughCitus(), f.table.Distributed())
				}
				f.insert(t, "a", 10, t0.Add(-10*24*time.Hour), time.Hour)
				app := pgtest.Lock(t, f.pool, "SELECT 1 FROM "+walked(f.table)+" WHERE consumer = 'a' AND message_id = 'a-4' FOR UPDATE")
				o := at(t0)
				o.LockTimeout, o.MaxRetries = 20*time.Second, 1
				res, err := New(f.pool, f.tables(), o).RunPass(ctx)
				if err != nil {
					t.Fatal(err)
				}
				left := int64(1)
				if kind == "create_reference_table" {
					if res[0].Demoted != 0 || retry.KindOf(res[0].Err) != retry.KindLockTimeout || !strings.Contains(fmt.Sprint(res[0].Err), "Citus locks the reference table public.inbox whole") {
						t.Errorf("pass over a locked row: demoted %d (%v); want none, and the lock timeout, saying why", res[0].Demoted, res[0].Err)
					}
					left = 10
				} else if res[0].Err != nil || res[0].Demoted != 9 {
					t.Errorf("pass over a locked row: demoted %d (%v); want 9", res[0].Demoted, res[0].Err)
				}
				if err := app.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				if res := f.demote(t, at(t0)); res.Err != nil || res.Demoted != left {
					t.Errorf("once the row is free the pass demoted %d (%v), want %d", res.Demoted, res.Err, left)
				}
				if n := f.hot(t, "true"); n != 0 {
					t.Errorf("%d rows kept their payload, want none", n)
				}
			})
		})
	}
}
