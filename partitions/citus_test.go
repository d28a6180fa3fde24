package partitions

import (
	"context"
	neturl "net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// citusDDL is mayDDL distributed by consumer over the test Citus cluster.
var citusDDL = mayDDL + pgtest.Distribute("consumer", "public.consumer_inbox")

func setupCitusAny(t *testing.T, ddl, pol string) fixture {
	t.Helper()
	pool, url := pgtest.NewMigratedCitusPool(t, ddl)
	return fixture{pool: pool, url: url, table: pgtest.Resolve(t, pool, pol)[0]}
}

func setupCitus(t *testing.T, ddl, pol string) fixture {
	t.Helper()
	f := setupCitusAny(t, ddl, pol)
	if !f.table.Distributed() {
		t.Fatalf("%s is not seen as distributed", f.table.Name)
	}
	return f
}

// shardOf names the shard of rel that holds consumer's rows, and the URL of
// the worker that has it (in the test's database).
func (f fixture) shardOf(t *testing.T, rel, consumer string) (shard, url string) {
	t.Helper()
	var db string
	var port int
	if err := f.pool.QueryRow(context.Background(), `
SELECT current_database(), shard_name($1::regclass, s.shardid), n.nodeport
FROM pg_dist_shard s JOIN pg_dist_placement pl ON pl.shardid = s.shardid JOIN pg_dist_node n ON n.groupid = pl.groupid
WHERE s.shardid = get_shard_id_for_distribution_column($1::regclass, $2::text)`, rel, consumer).Scan(&db, &shard, &port); err != nil {
		t.Fatal(err)
	}
	return shard, pgtest.CitusWorkerURL(t, port, db)
}

// Partition retirement with a long reader, on a distributed table. A
// reader on the partition (on the coordinator, or straight on the worker
// that holds one of its shards) keeps the plain DETACH from its ACCESS
// EXCLUSIVE lock. The DETACH holds the parent meanwhile, so an application
// insert queues behind it; the lock timeout, which reaches the workers
// through SET LOCAL, must end that wait: the insert waits about the DDL
// lock timeout, never as long as the reader. The retirement retries, gives
// up for this pass and reports the partition blocked; once the reader ends
// the next pass retires it.
func TestCitusRetirementWithALongReader(t *testing.T) {
	t.Parallel()
	for _, on := range []string{"worker", "coordinator"} {
		t.Run("reader on the "+on, func(t *testing.T) {
			t.Parallel()
			f := setupCitus(t, citusDDL, policyText("0"))
			ctx := context.Background()
			f.insertRows(t, "c", 3, may10)
			if _, err := f.manager(Options{Base: service.Base{Clock: service.At(t0)}}).Ensure(ctx); err != nil { // premake only
				t.Fatal(err)
			}

			readerURL, rel := f.url, "public.consumer_inbox_p202605"
			if on == "worker" {
				rel, readerURL = f.shardOf(t, rel, "c")
			}
			reader := pgtest.Connect(t, readerURL)
			rtx := pgtest.Begin(t, reader)
			var n int
			if err := rtx.QueryRow(ctx, "SELECT count(*) FROM "+rel).Scan(&n); err != nil || n != 3 {
				t.Fatalf("the reader saw %d rows of %s: %v", n, rel, err)
			}

			const lockTimeout = 300 * time.Millisecond
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg, nil)
			m.Errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "errors"}, []string{"table", "kind"})
			done := make(chan TableResult, 1)
			go func() {
				res, err := f.manager(Options{Base: service.Base{Clock: service.At(t0), LockTimeout: lockTimeout, MaxRetries: 1}, Metrics: m}).RunPass(ctx)
				if err != nil {
					res = []TableResult{{Outcome: batchloop.Outcome{Err: err}}}
				}
				done <- res[0]
			}()

			// Once the DETACH waits for the reader's lock where the reader
			// is, an application insert through the coordinator (a June
			// row of the same shard) queues behind it.
			pgtest.WaitFor(t, 5*time.Second, "the DETACH to wait for the reader's lock", func() bool {
				var waiting bool
				if err := reader.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
WHERE locktype = 'relation' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				return waiting
			})
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			start := time.Now()
			_, err := f.pool.Exec(ictx, `INSERT INTO public.consumer_inbox VALUES ('c', 'during', NULL, $1)`, t0.AddDate(0, 0, 1))
			waited := time.Since(start)
			if err != nil {
				t.Fatalf("the insert failed after %v: %v", waited, err)
			}
			// The reader outlives any bound: without the timeout on the
			// workers the insert waits until the context ends it (5 s).
			// Two attempts of lockTimeout (MaxRetries 1), plus room for a
			// loaded machine to schedule the DDL's cancellation and the
			// insert (400 ms held in stress runs; 1 s keeps a
			// margin and stays far below the 5 s of a missing timeout).
			if waited > 2*lockTimeout+time.Second {
				t.Errorf("the insert waited %v behind the DETACH; the DDL lock timeout is %v", waited, lockTimeout)
			}
			t.Logf("the insert waited %v", waited)

			var res TableResult
			select {
			case res = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the pass did not end while the reader stayed open")
			}
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if len(res.Detached) != 0 || len(res.Blocked) != 1 || res.Blocked[0].Partition != "public.consumer_inbox_p202605" || res.Blocked[0].Reason != "lock_timeout" {
				t.Fatalf("with a reader open: %+v", res)
			}
			// Two attempts, each ended by the lock timeout (on the worker,
			// for a reader there), then the report.
			if got := testutil.ToFloat64(m.Errors.WithLabelValues("public.consumer_inbox", "lock_timeout")); got != 2 {
				t.Errorf("lock timeouts counted: %v, want 2 (one retry); blocked: %+v", got, res.Blocked)
			}
			if got := m.Blocked.Value("public.consumer_inbox", "lock_timeout"); got != 1 {
				t.Errorf("blocked{reason=lock_timeout} = %v", got)
			}
			// A plain DETACH that gave up leaves nothing pending.
			if got := m.Count.Value("public.consumer_inbox", "detach_pending"); got != 0 {
				t.Errorf("partitions{state=detach_pending} = %v", got)
			}
			if !f.exists(t, "public.consumer_inbox_p202605") || f.count(t, "public.consumer_inbox", "remember_until < '2026-06-01'") != 3 {
				t.Fatal("May should still be attached with its rows")
			}

			if err := rtx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			res = f.pass(t, Options{Base: service.Base{Clock: service.At(t0), LockTimeout: lockTimeout, MaxRetries: 1}, Metrics: m})
			want := []string{"public.consumer_inbox_p202605"}
			if !slices.Equal(res.Detached, want) || !slices.Equal(res.Dropped, want) || len(res.Blocked) != 0 {
				t.Fatalf("after the reader ended: %+v", res)
			}
			if f.exists(t, "public.consumer_inbox_p202605") || f.count(t, "public.consumer_inbox", "true") != 1 {
				t.Fatal("May should be gone, the June row kept")
			}
			if got := m.Blocked.Value("public.consumer_inbox", "lock_timeout"); got != 0 {
				t.Errorf("blocked{reason=lock_timeout} after the reader = %v", got)
			}
		})
	}
}

// On a distributed parent: the months are made on the coordinator and
// Citus distributes each, colocated with the parent; coverage is measured;
// a hold keeps a due partition attached, a hold added after the detach
// keeps the detached table, and both go once released.
func TestCitusPartitions(t *testing.T) {
	t.Parallel()
	f := setupCitus(t, citusDDL, policyText("1d"))
	ctx := context.Background()
	f.insertRows(t, "a", 10, may10)
	f.insertRows(t, "b", 10, may10)
	id := f.legalHold(t, "a")
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, nil)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}, Metrics: m})
	if len(res.Created) != 6 || len(res.Detached) != 0 || len(res.Blocked) != 1 || res.Blocked[0].Reason != "hold" || res.Blocked[0].Partition != "public.consumer_inbox_p202605" {
		t.Fatalf("with a hold: %+v", res)
	}
	var distributed int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_dist_partition d ON d.logicalrelid = i.inhrelid
WHERE i.inhparent = 'public.consumer_inbox'::regclass AND d.partmethod = 'h'
  AND d.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'public.consumer_inbox'::regclass)`).Scan(&distributed); err != nil || distributed != 7 {
		t.Fatalf("%d partitions distributed with the parent (%v), want 7", distributed, err)
	}
	wantCoverage := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Sub(t0)
	if got := m.Coverage.Value("public.consumer_inbox"); got != wantCoverage.Seconds() {
		t.Fatalf("coverage metric %v, want %v", got, wantCoverage.Seconds())
	}
	if got := m.Blocked.Value("public.consumer_inbox", "hold"); got != 1 {
		t.Fatalf("blocked{reason=hold} = %v", got)
	}

	if err := holds.ReleaseHold(ctx, f.pool, id); err != nil {
		t.Fatal(err)
	}
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}, Metrics: m})
	if !slices.Equal(res.Detached, []string{"public.consumer_inbox_p202605"}) || len(res.Dropped) != 0 || len(res.Waiting) != 1 {
		t.Fatalf("after the release: %+v", res)
	}
	// Detached: a distributed table of its own, rows intact, out of the parent.
	if f.count(t, "public.consumer_inbox", "true") != 0 || f.count(t, "public.consumer_inbox_p202605", "true") != 20 {
		t.Fatal("the detached partition should keep its rows apart from the parent")
	}
	if n := f.count(t, "pg_dist_partition", "logicalrelid = 'public.consumer_inbox_p202605'::regclass AND partmethod = 'h'"); n != 1 {
		t.Fatal("the detached partition should stay a distributed table")
	}
	for state, want := range map[string]float64{"attached": 6, "detach_pending": 0, "detached": 1} {
		if got := m.Count.Value("public.consumer_inbox", state); got != want {
			t.Errorf("partitions{state=%s} = %v, want %v", state, got, want)
		}
	}

	id, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Reason: "incident", Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	later := t0.AddDate(0, 0, 2)
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(later)}, Metrics: m})
	if len(res.Dropped) != 0 || len(res.Blocked) != 1 || !res.Blocked[0].Detached || res.Blocked[0].Reason != "hold" || !f.exists(t, "public.consumer_inbox_p202605") {
		t.Fatalf("a hold on detached rows must keep them: %+v", res)
	}
	if err := holds.ReleaseHold(ctx, f.pool, id); err != nil {
		t.Fatal(err)
	}
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(later)}, Metrics: m})
	if !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) || f.exists(t, "public.consumer_inbox_p202605") {
		t.Fatalf("after the second release: %+v", res)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues("public.consumer_inbox")); got != 1 {
		t.Fatalf("dropped metric %v", got)
	}
}

// A partitioned Citus local table (in Citus metadata, not distributed):
// Citus refuses DETACH CONCURRENTLY on it too, so it is retired the same
// way as a distributed one.
func TestCitusLocalPartitionedTable(t *testing.T) {
	t.Parallel()
	f := setupCitusAny(t, mayDDL+`
SELECT citus_add_local_table_to_metadata('public.consumer_inbox');`, policyText("0"))
	if f.table.Distributed() || !f.table.InCitusMetadata {
		t.Fatalf("distributed=%v, in Citus metadata=%v; want a Citus local table", f.table.Distributed(), f.table.InCitusMetadata)
	}
	f.insertRows(t, "a", 3, may10)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	want := []string{"public.consumer_inbox_p202605"}
	if len(res.Created) != 6 || !slices.Equal(res.Detached, want) || !slices.Equal(res.Dropped, want) || len(res.Blocked) != 0 {
		t.Fatalf("pass: %+v", res)
	}
}

// Premaking while a session straight on a worker holds a lock on the
// parent's shard there. A reader (an open transaction that read it) is no
// obstacle: the months are made. A lock that conflicts with attaching a
// partition (SHARE, as a CREATE INDEX on the shard holds) is: the DDL lock
// timeout reaches the worker, so the premake gives up within it, is
// retried once, and the table's pass fails naming the lock timeout instead
// of waiting for the lock; once it is gone, the next pass makes the months.
func TestCitusPremakeWithALockOnAWorker(t *testing.T) {
	t.Parallel()
	f := setupCitus(t, citusDDL, policyText("0"))
	ctx := context.Background()
	f.insertRows(t, "c", 1, may10)
	shard, url := f.shardOf(t, "public.consumer_inbox", "c")
	worker := pgtest.Connect(t, url)
	const lockTimeout = 300 * time.Millisecond
	ensure := func(now time.Time) TableResult {
		res, err := f.manager(Options{Base: service.Base{Clock: service.At(now), LockTimeout: lockTimeout, MaxRetries: 1}}).Ensure(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}

	reader := pgtest.Begin(t, worker)
	pgtest.Exec(t, reader, "SELECT count(*) FROM public."+pgx.Identifier{shard}.Sanitize())
	if res := ensure(t0); res.Err != nil || len(res.Created) == 0 {
		t.Fatalf("premake with a reader on a worker: %+v; want the months made", res)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	later := t0.AddDate(0, 3, 0) // three more months to make
	locker := pgtest.Lock(t, worker, "SET LOCAL citus.enable_manual_changes_to_shards = on; LOCK TABLE public."+pgx.Identifier{shard}.Sanitize()+" IN SHARE MODE")
	start := time.Now()
	res := ensure(later)
	took := time.Since(start)
	t.Logf("premake against a SHARE lock on a worker: %s, %v", took, res.Err)
	if res.Err == nil || retry.KindOf(res.Err) != retry.KindLockTimeout || len(res.Created) != 0 {
		t.Fatalf("premake with a SHARE lock on a worker: %+v; want it failed on the lock timeout, nothing made", res)
	}
	// The error names the worker whose lock stopped it.
	if wu, err := neturl.Parse(url); err != nil || !strings.Contains(res.Err.Error(), "(while executing command on "+wu.Host+")") {
		t.Errorf("the premake's error does not name the worker %s: %v", url, res.Err)
	}
	// Two attempts of lockTimeout and a backoff (at most 100 ms), and 2 s
	// for a loaded machine; without the timeout on the worker it would wait
	// for the lock as long as it stays (the test's).
	if took > 2*lockTimeout+100*time.Millisecond+2*time.Second {
		t.Errorf("the premake took %s against a lock on a worker; the DDL lock timeout is %s", took, lockTimeout)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res := ensure(later); res.Err != nil || len(res.Created) != 3 {
		t.Fatalf("once the lock is gone: %+v; want the three months made", res)
	}
}
