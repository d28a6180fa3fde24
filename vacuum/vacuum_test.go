package vacuum

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/gatetest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup is a table of 10,000 rows with autovacuum off (the test vacuums),
// of which the first deleted are deleted.
func setup(t *testing.T, deleted int) (*pgxpool.Pool, *catalog.Table) {
	t.Helper()
	pool, tbl, _ := setupURL(t, deleted)
	return pool, tbl
}

// setupURL is setup, and the database's URL.
func setupURL(t *testing.T, deleted int) (*pgxpool.Pool, *catalog.Table, string) {
	t.Helper()
	pool, url := pgtest.NewMigratedPool(t, pgtest.ShortInboxDDL+`
ALTER TABLE public.consumer_inbox SET (autovacuum_enabled = off);
INSERT INTO public.consumer_inbox SELECT 'c', 'm' || i, now(), now() - interval '1 day' + i * interval '1 second' FROM generate_series(1, 10000) i;`)
	pgtest.Exec(t, pool, `DELETE FROM public.consumer_inbox WHERE message_id IN (SELECT 'm' || i FROM generate_series(1, $1) i)`, deleted)
	return pool, pgtest.Resolve(t, pool, pgtest.ShortInboxPolicy)[0], url
}

// wantVacuums fails the test unless the table has had want manual VACUUMs
// (vacuum_count); while, when not empty, says in what situation.
func wantVacuums(t *testing.T, pool *pgxpool.Pool, want int64, while string) {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'consumer_inbox'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Errorf("vacuum_count %d%s, want %d", n, while, want)
	}
}

func TestVacuumAfterPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A pass that deleted 20% of the table's tuples, which the statistics
	// do not show yet, leaves it vacuumed: what it deleted counts.
	t.Run("over the ratio", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 2000)
		v := New(pool, Options{DeadRatio: 0.1})
		out := v.AfterPass(ctx, tbl, 2000, 8000, 0)
		if !out.Ran || out.Err != nil || out.Dead != 2000 {
			t.Fatalf("outcome %+v, want a VACUUM of 2000 dead tuples", out)
		}
		wantVacuums(t, pool, 1, "")
	})

	// Under the 1,000 rows a VACUUM is worth (500), or under the ratio
	// (1,000 of 9,500: 10.5%, under 12%), nothing runs; the rows deleted
	// meanwhile add up until it is worth one.
	t.Run("under the ratio, then over", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 1500)
		v := New(pool, Options{DeadRatio: 0.12})
		for _, deleted := range []int64{500, 500} {
			if out := v.AfterPass(ctx, tbl, deleted, 8500, 0); out.Ran {
				t.Fatalf("vacuumed at %d dead tuples: %+v", out.Dead, out)
			}
		}
		if out := v.AfterPass(ctx, tbl, 500, 8500, 0); !out.Ran || out.Dead != 1500 {
			t.Fatalf("outcome %+v, want a VACUUM at 1500 dead tuples (15%% of 10,000, over 12%%)", out)
		}
		if New(pool, Options{DeadRatio: 0}) != nil {
			t.Error("a ratio of 0 made a Vacuumer")
		}
	})

	// A session that holds a lock VACUUM needs: it skips the table at once
	// instead of queueing, tries again after each of passedOverWaits, and
	// returns, saying it did not run; the rows deleted still count, and
	// the next pass vacuums.
	t.Run("never in a lock queue", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 5000)
		tx := pgtest.Lock(t, pool, "LOCK TABLE public.consumer_inbox IN SHARE UPDATE EXCLUSIVE MODE")
		v := New(pool, Options{DeadRatio: 0.1})
		var attempts atomic.Int32
		v.retrying = func(Outcome) { attempts.Add(1) }
		done := make(chan Outcome, 1)
		go func() { done <- v.AfterPass(ctx, tbl, 5000, 5000, 0) }()
		select {
		case out := <-done:
			if out.Err != nil || out.Ran || out.NotRun == "" {
				t.Fatalf("outcome %+v, want no VACUUM, and why", out)
			}
			if n := attempts.Load(); n != int32(len(passedOverWaits)) || out.PassedOver != len(passedOverWaits)+1 {
				t.Errorf("tried again %d times, %d passed over, want %d and %d", n, out.PassedOver, len(passedOverWaits), len(passedOverWaits)+1)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the VACUUM waited for the lock for 30 s")
		}
		wantVacuums(t, pool, 0, " while another session held the lock (it skips the table)")
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if out := v.AfterPass(ctx, tbl, 0, 5000, 0); !out.Ran || out.Dead != 5000 {
			t.Fatalf("the next pass: %+v, want a VACUUM of the 5000 dead tuples", out)
		}
		wantVacuums(t, pool, 1, " after the lock was released")
	})

	// A lock that another session (autovacuum) releases soon after: the
	// VACUUM it passed over runs within the pass.
	t.Run("tried again within the pass", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 5000)
		tx := pgtest.Lock(t, pool, "LOCK TABLE public.consumer_inbox IN SHARE UPDATE EXCLUSIVE MODE")
		v := New(pool, Options{DeadRatio: 0.1})
		var attempts atomic.Int32
		v.retrying = func(Outcome) {
			if attempts.Add(1) == 1 {
				if err := tx.Rollback(ctx); err != nil {
					t.Error(err)
				}
			}
		}
		if out := v.AfterPass(ctx, tbl, 5000, 5000, 0); !out.Ran || out.NotRun != "" || out.Err != nil || out.PassedOver != 1 {
			t.Fatalf("outcome %+v, want a VACUUM once the lock was released, one passed over", out)
		}
		if n := attempts.Load(); n != 1 {
			t.Errorf("passed over %d times, want 1", n)
		}
		wantVacuums(t, pool, 1, " after the lock was released")
	})

	// The VACUUM passed over by a lock, and another session's VACUUM
	// ending before the table's count of VACUUMs is read again: the count
	// went up by one, as if this one had run. On the daemon's connections
	// (dbconn) the WARNING of the one passed over says it did not, and it
	// is tried again. (The count alone took the other's for this one.)
	t.Run("another session's VACUUM ends meanwhile", func(t *testing.T) {
		t.Parallel()
		_, tbl, url := setupURL(t, 5000)
		cfg, err := dbconn.Pool(url, 4)
		if err != nil {
			t.Fatal(err)
		}
		pool := pgtest.PoolWith(t, cfg)
		tx := pgtest.Lock(t, pool, "LOCK TABLE public.consumer_inbox IN SHARE UPDATE EXCLUSIVE MODE")
		v := New(pool, Options{DeadRatio: 0.1})
		var statements atomic.Int32
		v.afterVacuum = func() {
			if statements.Add(1) == 1 {
				if err := tx.Rollback(ctx); err != nil {
					t.Error(err)
				}
				pgtest.Exec(t, pool, "VACUUM public.consumer_inbox")
			}
		}
		out := v.AfterPass(ctx, tbl, 5000, 5000, 0)
		// One more for a VACUUM an older snapshot held back (an ANALYZE of
		// autovacuum's, on a loaded machine), as in TestPassVacuums.
		if held := int32(out.HeldBack); !out.Ran || out.PassedOver != 1 || out.Err != nil || statements.Load() != 2+held {
			t.Fatalf("outcome %+v after %d VACUUM statements, want one passed over, then one run", out, statements.Load())
		}
		wantVacuums(t, pool, 2+int64(out.HeldBack), " (the other session's and the daemon's second)")
	})

	// A snapshot older than the deletes (an insert that began just before
	// the pass's last commit) keeps them from the VACUUM: it runs, leaves
	// them dead, and is tried once more after heldBackWait, which finds
	// them removable once the snapshot is gone. One held longer gets no
	// third VACUUM.
	t.Run("held back by an older snapshot", func(t *testing.T) {
		t.Parallel()
		for _, release := range []bool{true, false} {
			pool, tbl := setup(t, 0)
			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT 1"); err != nil {
				t.Fatal(err)
			}
			pgtest.Exec(t, pool, `DELETE FROM public.consumer_inbox WHERE message_id IN (SELECT 'm' || i FROM generate_series(1, 5000) i)`)
			v := New(pool, Options{DeadRatio: 0.1})
			var retries atomic.Int32
			v.retrying = func(o Outcome) {
				retries.Add(1)
				if o.HeldBack == 1 && release {
					if err := holder.Rollback(ctx); err != nil {
						t.Error(err)
					}
				}
			}
			out := v.AfterPass(ctx, tbl, 5000, 5000, 0)
			if !out.Ran || out.HeldBack != 1 || out.PassedOver != 0 || out.Err != nil || retries.Load() != 1 {
				t.Errorf("released %v: outcome %+v after %d retries, want a VACUUM held back once, then run", release, out, retries.Load())
			}
			var left int64
			if err := pool.QueryRow(ctx, `SELECT pg_stat_get_dead_tuples('public.consumer_inbox'::regclass)`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if release && left != 0 {
				t.Errorf("%d dead tuples left once the snapshot was gone, want 0", left)
			}
			if !release && left < 5000 {
				t.Errorf("%d dead tuples left under the snapshot, want the 5000 deleted", left)
			}
			wantVacuums(t, pool, 2, fmt.Sprintf(" (snapshot released: %v)", release))
			_ = holder.Rollback(ctx)
		}
	})

	// Where track_counts is off a VACUUM counts nothing in the table's
	// statistics: the one that ran is reported as run (the count cannot
	// tell), and pg_class says it ran (relallvisible).
	t.Run("track_counts off", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 5000)
		cfg := pool.Config().Copy()
		cfg.ConnConfig.RuntimeParams["track_counts"] = "off"
		off, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer off.Close()
		if out := New(off, Options{DeadRatio: 0.1}).AfterPass(ctx, tbl, 5000, 5000, 0); !out.Ran || out.NotRun != "" || out.Err != nil {
			t.Errorf("outcome %+v, want a VACUUM that ran", out)
		}
		var visible int64
		if err := pool.QueryRow(ctx, `SELECT relallvisible FROM pg_class WHERE oid = 'public.consumer_inbox'::regclass`).Scan(&visible); err != nil {
			t.Fatal(err)
		}
		if visible == 0 {
			t.Error("relallvisible 0: no VACUUM ran")
		}
		wantVacuums(t, pool, 0, " (track_counts off: the VACUUM counted nothing)")
	})

	// The empty pages at the end stay: cutting them off takes ACCESS
	// EXCLUSIVE, which every insert would queue behind.
	t.Run("no truncation", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 0)
		pgtest.Exec(t, pool, `DELETE FROM public.consumer_inbox WHERE message_id NOT IN ('m1', 'm2')`)
		var before, after int64
		if err := pool.QueryRow(ctx, `SELECT pg_relation_size('public.consumer_inbox')`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		if out := New(pool, Options{DeadRatio: 0.1}).AfterPass(ctx, tbl, 9998, 2, 0); !out.Ran {
			t.Fatalf("outcome %+v", out)
		}
		if err := pool.QueryRow(ctx, `SELECT pg_relation_size('public.consumer_inbox')`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("the heap went from %d to %d bytes: the VACUUM truncated it", before, after)
		}
	})

	// A role that does not own the table may not vacuum it (before
	// PostgreSQL 17's MAINTAIN): PostgreSQL would skip it with a warning
	// only the server log sees, so the Vacuumer asks first, and leaves it
	// to autovacuum.
	t.Run("a role that may not", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 5000)
		role := "vac_" + strings.ToLower(strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))[len("testvacuumafterpass_"):]
		pgtest.Exec(t, pool, "CREATE ROLE "+role+" LOGIN; GRANT SELECT, DELETE ON public.consumer_inbox TO "+role)
		t.Cleanup(func() { pgtest.Exec(t, pool, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
		cfg := pool.Config().Copy()
		cfg.ConnConfig.User = role
		as, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer as.Close()
		out := New(as, Options{DeadRatio: 0.1}).AfterPass(ctx, tbl, 5000, 5000, 0)
		if out.Ran || out.Err != nil || !strings.Contains(out.NotRun, "may not vacuum") {
			t.Errorf("outcome %+v, want not run: this role may not vacuum", out)
		}
		wantVacuums(t, pool, 0, "")
	})

	// Throttled: no VACUUM (it writes WAL too); the next pass tries again.
	t.Run("throttled", func(t *testing.T) {
		t.Parallel()
		pool, tbl := setup(t, 5000)
		out := New(pool, Options{Base: service.Base{Throttle: gatetest.Held{Reason: "replica_lag walsender s: 9s (threshold 1s)"}}, DeadRatio: 0.1}).AfterPass(ctx, tbl, 5000, 5000, 0)
		if out.Ran || !strings.Contains(out.NotRun, "replica_lag") {
			t.Errorf("outcome %+v, want not run: throttled", out)
		}
		wantVacuums(t, pool, 0, "")
	})
}

// A backend sends its statistics at most once a second, so the deletes of
// a pass's last batches may reach pg_stat_user_tables after the VACUUM
// that removed their rows, and read as dead tuples again (the next pass
// would vacuum again for nothing). AfterPass has the pool's idle
// connections send theirs first: after its VACUUM the dead tuples are the
// ones it left, even once every backend has sent what it held.
func TestVacuumAfterTheLastDeletesAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, tbl := setup(t, 0)
	dead := func() int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'consumer_inbox'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	flushAll := func() {
		t.Helper()
		for _, c := range pool.AcquireAllIdle(ctx) {
			_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
			c.Release()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// The deletes of a pass: on a connection that has just sent its
	// statistics, so that it holds these back.
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, c, "SELECT pg_stat_force_next_flush()")
	pgtest.Exec(t, c, "DELETE FROM public.consumer_inbox WHERE message_id IN (SELECT 'm' || i FROM generate_series(1, 5000) i)")
	c.Release()
	if n := dead(); n >= 5000 {
		t.Fatalf("premise: the statistics show %d dead tuples at once, want the deletes held back by their backend", n)
	}
	v := New(pool, Options{DeadRatio: 0.1})
	if out := v.AfterPass(ctx, tbl, 5000, 5000, 0); !out.Ran || out.Err != nil {
		t.Fatalf("outcome %+v, want a VACUUM", out)
	}
	flushAll() // what every backend would have sent within ten seconds
	if n := dead(); n != 0 {
		t.Errorf("%d dead tuples after the VACUUM, once every backend sent its statistics: want 0", n)
	}
}

// inboxkeeper_dead_tuples is the figure status shows (n_dead_tup), not
// the rows deleted since the daemon's last VACUUM: under the recommended
// role, which may not vacuum, autovacuum reclaims each pass's rows (a
// VACUUM by the owner stands in for it here), and the gauge follows it
// down rather than adding every pass's deletions up for ever.
func TestDeadTuplesGaugeIsTheStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, tbl, url := setupURL(t, 0)
	roles := pgtest.ApplyRoleScript(t, url, map[string]string{"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until"})
	daemon := pgtest.Pool(t, roles.Daemon)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, daemonmetrics.NewFacts())
	v := New(daemon, Options{DeadRatio: 0.1, Metrics: m})
	deadNow := func() int64 {
		t.Helper()
		var n int64
		pgtest.Exec(t, owner, "SELECT pg_stat_force_next_flush()")
		if err := owner.QueryRow(ctx, "SELECT pg_stat_get_dead_tuples($1::oid)", tbl.OID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for pass := 1; pass <= 4; pass++ {
		// The pass deletes 2,000 rows as the daemon, then autovacuum comes.
		tag, err := daemon.Exec(ctx, `DELETE FROM public.consumer_inbox WHERE message_id IN (SELECT 'm' || i FROM generate_series($1::int, $2::int) i)`,
			(pass-1)*2000+1, pass*2000)
		if err != nil || tag.RowsAffected() != 2000 {
			t.Fatalf("pass %d: deleted %d: %v", pass, tag.RowsAffected(), err)
		}
		out := v.AfterPass(ctx, tbl, 2000, int64(10000-pass*2000), 0)
		if out.Ran || out.Err != nil {
			t.Fatalf("pass %d: %+v: the role may not vacuum", pass, out)
		}
		if got, want := m.DeadTuples.Value(tbl.Name), float64(deadNow()); got != want || want != 2000 {
			t.Errorf("pass %d: inboxkeeper_dead_tuples %v, n_dead_tup %v: want both the pass's 2000", pass, got, want)
		}
		pgtest.Exec(t, owner, "VACUUM public.consumer_inbox")
	}
	// After the last autovacuum, the next pass that deletes a few rows.
	pgtest.Exec(t, daemon, `DELETE FROM public.consumer_inbox WHERE message_id = 'm9001'`)
	v.AfterPass(ctx, tbl, 1, 1999, 0)
	if got := m.DeadTuples.Value(tbl.Name); got != 1 {
		t.Errorf("after the VACUUM and a pass that deleted one row: inboxkeeper_dead_tuples %v, want 1 (status's n_dead_tup), not the 8001 deleted since the daemon started", got)
	}
}
