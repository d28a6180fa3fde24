package expiry

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/syncbuf"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// citusSetup is setup on a Citus coordinator: the inbox distributed on
// consumer over the test cluster's workers.
func citusSetup(t *testing.T) fixture {
	t.Helper()
	pool, _ := pgtest.NewMigratedCitusPool(t, inboxDDL, pgtest.Distribute("consumer", "public.consumer_inbox"))
	f := fixture{pool: pool, tables: pgtest.Resolve(t, pool, inboxPolicy)}
	if !f.tables[0].Distributed() {
		t.Fatal("the table does not resolve as distributed")
	}
	return f
}

// asDaemon is f with its pool connected as role.sql's daemon role: the
// Citus tests of this package run the Deleter with only its grants.
func (f fixture) asDaemon(t *testing.T) fixture {
	t.Helper()
	db := pgtest.CurrentDatabase(t, f.pool)
	roles := pgtest.ApplyRoleScript(t, pgtest.Citus(t).Coordinator.URL(db),
		map[string]string{"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until"})
	return fixture{pool: pgtest.Pool(t, roles.Daemon), tables: f.tables}
}

// On a distributed table a pass deletes exactly the due rows no hold or
// replay covers, by expiry windows, and by key where more rows share one
// expiry than a batch may hold.
func TestCitusExpiryWithHoldsAndReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := citusSetup(t)
	for i, c := range []string{"a", "b", "c", "held", "replayed"} {
		f.insert(t, c, 40, t0.Add(-48*time.Hour+time.Duration(i)*time.Second), time.Minute)
	}
	// Ties across the bound: the key form.
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox SELECT 'tie', 'tie-' || i, $1::timestamptz - interval '30 days', $1 FROM generate_series(1, 9) i`, t0.Add(-time.Hour))
	// Not yet due.
	f.insert(t, "a-late", 10, t0.Add(time.Minute), time.Minute)
	held := "held"
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &held, Reason: "legal", Owner: "legal"}); err != nil {
		t.Fatal(err)
	}
	from, to := t0.Add(-60*24*time.Hour), t0
	if _, err := holds.StartReplay(ctx, f.pool, f.tables[0], holds.ReplaySpec{Scope: "replayed", From: from, To: to, Owner: "ops", Force: true}); err != nil {
		t.Fatal(err)
	}
	// The shards' statistics, for the bytes per key.
	pgtest.Exec(t, f.pool, "ANALYZE public.consumer_inbox")
	// One row per shard a batch (4 shards): the 9 tied rows are more than
	// a window can bound, and go by key.
	res := f.asDaemon(t).pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 1}})
	if res.Deleted != 3*40+9 || res.ProtectedByHolds != 40 || res.ProtectedByReplays != 40 {
		t.Errorf("deleted %d, held %d, replayed %d; want %d, 40, 40", res.Deleted, res.ProtectedByHolds, res.ProtectedByReplays, 3*40+9)
	}
	if res.RangeBatches == 0 || res.RangeBatches == res.Batches {
		t.Errorf("%d of %d batches by window; want the tie deleted by key", res.RangeBatches, res.Batches)
	}
	if n := f.count(t, "consumer IN ('held', 'replayed', 'a-late')"); n != 90 {
		t.Errorf("%d protected or undue rows left, want 90", n)
	}
	if n := f.count(t, "true"); n != 90 {
		t.Errorf("%d rows left, want 90", n)
	}
	// Measured on the shards: their size over the 219 rows ANALYZE saw.
	var perRow float64
	if err := f.pool.QueryRow(ctx, "SELECT citus_total_relation_size('public.consumer_inbox') / 219.0").Scan(&perRow); err != nil {
		t.Fatal(err)
	}
	if res.BytesPerKey < 0.9*perRow || res.BytesPerKey > 1.1*perRow {
		t.Errorf("bytes per key %.0f, want about %.0f (the shards' size per row)", res.BytesPerKey, perRow)
	}
}

// A distributed table never sweeps, even when a pass is told to and its
// due rows lie scattered over every shard's heap: a ctid means nothing
// through a coordinator (each shard has its own), so the pass goes by
// expiry windows and deletes exactly the due rows.
func TestCitusNeverSweeps(t *testing.T) {
	t.Parallel()
	f := citusSetup(t)
	due := f.scatter(t, 4000)
	res := f.passWith(t, signals{strategy: StrategySweep}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 100}})
	if res.Deleted != due || res.SweepBatches != 0 || res.RangeBatches == 0 {
		t.Errorf("pass %+v: want all %d due rows deleted by expiry windows, no sweep", res, due)
	}
	if n := f.count(t, "remember_until <= $1", t0); n != 0 {
		t.Errorf("%d due rows left", n)
	}
}

// Oldest first across shards: a pass cut short after two batches has
// deleted only rows older than every row left, whatever shard they lie on,
// and each batch held about the batch size per shard.
func TestCitusOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := citusSetup(t)
	base := t0.Add(-24 * time.Hour)
	for i := 0; i < 8; i++ {
		f.insert(t, fmt.Sprintf("c%d", i), 40, base.Add(time.Duration(i)*time.Second), time.Minute)
	}
	batches := 0
	d := newTest(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 3}}, signals{})
	d.opts.Active = func() error {
		if batches == 2 {
			return fmt.Errorf("stop after two batches")
		}
		batches++
		return nil
	}
	res, err := d.RunPass(ctx)
	// 3 rows a shard, 4 shards: 12 a batch, at most twice that.
	if err != nil || res[0].Err != nil || res[0].Deleted < 12 || res[0].Deleted > 48 {
		t.Fatalf("pass: %v %+v; want 12 to 48 deleted in two batches", err, res[0])
	}
	rows, err := f.pool.Query(ctx, "SELECT message_id, remember_until FROM public.consumer_inbox")
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	var oldestLeft, newestGone time.Time
	for rows.Next() {
		var id string
		var e time.Time
		if err := rows.Scan(&id, &e); err != nil {
			t.Fatal(err)
		}
		left[id] = true
		if oldestLeft.IsZero() || e.Before(oldestLeft) {
			oldestLeft = e
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		for j := 0; j < 40; j++ {
			if e := base.Add(time.Duration(j)*time.Minute + time.Duration(i)*time.Second); !left[fmt.Sprintf("c%d-%d", i, j)] && e.After(newestGone) {
				newestGone = e
			}
		}
	}
	if !oldestLeft.After(newestGone) {
		t.Errorf("a row expiring %s was deleted while one expiring %s is left", newestGone, oldestLeft)
	}
}

// The fence on a distributed table: a hold added while a batch is in flight
// waits for that batch, and no later batch deletes a row it covers.
func TestCitusFenceInFlightBatch(t *testing.T) {
	t.Parallel()
	f := citusSetup(t)
	// 10 rows a shard, 4 shards: a batch holds 40 rows, at most 80.
	f.insert(t, "payments", 100, t0.Add(-2*time.Hour), time.Minute)
	f.insert(t, "orders", 100, t0.Add(-2*time.Hour+time.Second), time.Minute)
	res, first := fenceRace(t, f, signals{})
	// The in-flight batch took the oldest rows of both consumers; every
	// orders row goes, every payments row the first batch left stays.
	paymentsGoneFirst := 100 - f.count(t, "consumer = 'payments'")
	if first == 0 || first > 80 || res.Deleted != 100+paymentsGoneFirst || paymentsGoneFirst > first {
		t.Errorf("deleted %d, %d of them payments, %d in the first batch; want every orders row and only the payments rows of the first batch", res.Deleted, paymentsGoneFirst, first)
	}
	if n := f.count(t, "consumer = 'orders'"); n != 0 {
		t.Errorf("%d orders rows left, want 0", n)
	}
}

// Rows a session holds locked on a worker: without SKIP LOCKED, the pass
// waits for each at most the optimistic lock timeout, steps over it, and
// deletes every other due row; an application session that wants a row
// the batch holds waits at most about that long; the next pass, once the
// locks are gone, deletes the rest.
func TestCitusLockedRowsOnAWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := citusSetup(t)
	f.insert(t, "c", 60, t0.Add(-24*time.Hour), time.Minute)
	f.insert(t, "d", 60, t0.Add(-24*time.Hour+time.Second), time.Minute)

	// The session that holds the rows is on the worker that has consumer
	// c's shard, connected to it directly, as an application's router
	// query would leave it.
	var shard, db string
	var port int
	if err := f.pool.QueryRow(ctx, `SELECT shard_name, nodeport, current_database() FROM citus_shards
WHERE table_name = 'public.consumer_inbox'::regclass AND shardid = get_shard_id_for_distribution_column('public.consumer_inbox', 'c')`).Scan(&shard, &port, &db); err != nil {
		t.Fatal(err)
	}
	locker := pgtest.Lock(t, pgtest.Connect(t, pgtest.CitusWorkerURL(t, port, db)), fmt.Sprintf("SELECT 1 FROM public.%s WHERE message_id IN ('c-3', 'c-4', 'c-30') FOR UPDATE", pgx.Identifier{shard}.Sanitize()))

	fallbacks := 0
	started := time.Now()
	res := f.passWith(t, signals{TestSignals: TestSignals{OnFallback: func() { fallbacks++ }}}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), LockTimeout: 20 * time.Second}, BatchSize: 16}})
	if res.Deleted != 117 || res.Retries != 0 {
		t.Errorf("deleted %d with %d retries, want 117 (all but the 3 locked) and none", res.Deleted, res.Retries)
	}
	t.Logf("pass: %s, %+v", time.Since(started), res)
	if fallbacks != 3 {
		t.Errorf("stepped over %d locked rows, want 3", fallbacks)
	}
	// Waiting on a lock for the set lock timeout would have taken 20 s.
	if el := time.Since(started); el > 15*time.Second {
		t.Errorf("pass took %s: it waited on a locked row", el)
	}
	if n := f.count(t, "true"); n != 3 {
		t.Fatalf("%d rows left, want the 3 locked ones", n)
	}
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Deleted != 3 {
		t.Errorf("the next pass deleted %d, want the 3 formerly locked rows", res.Deleted)
	}
}

// A batch whose window met a locked row near the end of a dense run of
// expiries, with an hour of none after it, leaves the narrowed windows once
// they are as wide as the one that met the lock: it does not cross the
// hour in windows of that width (seen in CI under a shard rebalance: 239
// ms windows through an hour, 26 s of empty transactions).
func TestCitusNarrowedWindowsDoNotCrawlAGap(t *testing.T) {
	t.Parallel()
	f := citusSetup(t)
	// 300 rows 10 ms apart: the windows settle at about 0.64 s (64 due
	// rows, 16 a shard), and the fifth batch's holds the last 44, among
	// them the locked one; then an hour without, then 30 more.
	f.insert(t, "c", 300, t0.Add(-2*time.Hour), 10*time.Millisecond)
	f.insert(t, "d", 30, t0.Add(-time.Hour), time.Second)
	pgtest.Lock(t, f.pool, "SELECT 1 FROM public.consumer_inbox WHERE consumer = 'c' AND message_id = 'c-295' FOR UPDATE")
	fallbacks := 0
	res := f.passWith(t, signals{TestSignals: TestSignals{OnFallback: func() { fallbacks++ }}}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 16}})
	t.Logf("%+v", res)
	if res.Err != nil || res.Deleted != 329 || fallbacks != 1 {
		t.Errorf("deleted %d (%v), stepped over %d locked rows; want 329 (all but the locked one), one", res.Deleted, res.Err, fallbacks)
	}
	// Over the hour in 0.64 s windows: some 5,600 of them.
	if res.RangeBatches > 200 {
		t.Errorf("%d windows committed: the batch crossed the empty hour in narrowed windows", res.RangeBatches)
	}
}

// An application session that wants a row a batch on a distributed table
// has deleted, while that batch waits on a row locked on a worker, waits at
// most about the batch's lock wait: the lock timeout reaches the workers.
func TestCitusApplicationWaitsAtMostLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := citusSetup(t)
	f.insert(t, "c", 40, t0.Add(-24*time.Hour), time.Minute)
	a := pgtest.Lock(t, f.pool, "SELECT 1 FROM public.consumer_inbox WHERE consumer = 'c' AND message_id = 'c-20' FOR UPDATE")
	const wait = 2 * time.Second // long enough to see the deleter waiting
	// The batch's statement on the worker waits on c-20: the worker's
	// pg_stat_activity shows it (citus_stat_activity gathers every node's).
	done := f.deleterWaitingOnALock(t, signals{}, wait, "citus_stat_activity", "DELETE%")
	b, el := f.applicationWait(t, "SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL lock_timeout = '30s'", "SELECT 1 FROM public.consumer_inbox WHERE consumer = 'c' AND message_id = 'c-5' FOR UPDATE")
	if el > wait+time.Second {
		t.Errorf("the application session waited %s on the deleter, longer than its lock timeout %s", el, wait)
	}
	if err := b.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.Err != nil || res.Deleted < 38 {
			t.Errorf("result %+v: want at least 38 deleted", res)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the pass did not finish")
	}
}

// On a distributed table with a permanent key, both batch forms (range,
// and key for the short last batch) write the keys of the rows they delete
// in the same statement, into the key table co-located with the inbox. On
// a reference table and a Citus local table, which go by windows too, into
// the key table on the coordinator: each key once.
func TestCitusPermanentKeys(t *testing.T) {
	t.Parallel()
	for name, sql := range map[string]string{
		"distributed": pgtest.Distribute("consumer", "public.inbox"),
		"reference":   "SELECT create_reference_table('public.inbox')",
		"local":       "SELECT citus_add_local_table_to_metadata('public.inbox')",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewMigratedCitusPool(t, pgtest.TieredInboxDDL, sql)
			tables := pgtest.Resolve(t, pool, pgtest.TieredInboxPolicy)
			pgtest.Exec(t, pool, tiering.KeyTableDDL(tables[0]))
			f := fixture{pool: pool, tables: tables}
			base := t0.Add(-40 * 24 * time.Hour)
			pgtest.Exec(t, pool, `INSERT INTO public.inbox (consumer, message_id, payload_hash, first_seen_at, remember_until, business_key, payload)
SELECT c, c || i, sha256(i::text::bytea), $1::timestamptz + i * interval '1 hour', $1::timestamptz + interval '30 days' + i * interval '1 hour', 'bk' || i, 'p'
FROM generate_series(0, 24) i, unnest(ARRAY['payments', 'orders']) c`, base)
			res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 20}})
			if res.Deleted != 50 || res.PermanentKeys != 50 || res.RangeBatches == 0 {
				t.Errorf("pass: %+v; want 50 deleted, 50 keys, some by range", res)
			}
			var keys, all int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE payload_hash = sha256(substr(business_key, 3)::bytea)), count(*) FROM inboxkeeper.keys_public_inbox`).Scan(&keys, &all); err != nil || keys != 50 || all != 50 {
				t.Errorf("%d complete keys of %d (%v), want 50 of 50", keys, all, err)
			}
		})
	}
}

// A batch that commits a narrowed window and then fails (its connection
// cut before the next window's COMMIT) counts the committed window's rows:
// the pass reports exactly the rows it deleted.
func TestCitusCommittedWindowsOfAFailedBatchAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := citusSetup(t)
	f.insert(t, "c", 60, t0.Add(-24*time.Hour), time.Minute)
	// A row held locked narrows the batch's window: its part before the
	// row commits on its own.
	pgtest.Lock(t, f.pool, "SELECT 1 FROM public.consumer_inbox WHERE consumer = 'c' AND message_id = 'c-40' FOR UPDATE")
	daemon := f.asDaemon(t)
	commits := 0
	cut := func(string, int64) {
		// The second window to commit loses its connection first.
		if commits++; commits != 2 {
			return
		}
		pgtest.Exec(t, f.pool, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'idle in transaction' AND query LIKE 'DELETE%'`)
	}
	var deleted int64
	for pass := 1; ; pass++ {
		res, err := newTest(daemon.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), MaxRetries: 2}, BatchSize: 100}},
			signals{TestSignals: TestSignals{BeforeCommit: cut}}).RunPass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pass %d: %+v", pass, res[0])
		deleted += res[0].Deleted
		if res[0].Err == nil {
			break
		}
		if pass == 3 {
			t.Fatalf("pass %d failed: %v", pass, res[0].Err)
		}
	}
	if commits < 2 {
		t.Fatalf("%d windows committed: the cut never happened", commits)
	}
	if left := f.count(t, "true"); deleted != 60-left || left != 1 {
		t.Errorf("the passes reported %d deleted, %d rows are gone (%d left, want the locked one)", deleted, 60-left, left)
	}
}

// A worker that goes away in the middle of a pass (stopped as a batch is
// about to commit) fails the table's pass cleanly, with the node named in
// the error and the log; once it is back, the next pass deletes the rest,
// and the passes together report exactly the rows that went. Not parallel:
// the worker serves every Citus test of this binary, and the parallel ones
// wait until the sequential ones are done.
func TestCitusWorkerRestartMidPass(t *testing.T) {
	ctx := context.Background()
	f := citusSetup(t)
	for i, c := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		f.insert(t, c, 25, t0.Add(-24*time.Hour+time.Duration(i)*time.Second), time.Minute)
	}
	worker := pgtest.Citus(t).Workers[1]
	node := fmt.Sprintf("127.0.0.1:%d", worker.Port)
	restart := sync.OnceFunc(func() {
		if err := worker.StartServer(context.Background()); err != nil {
			t.Fatalf("restart the worker: %v", err)
		}
	})
	t.Cleanup(restart)
	commits := 0
	var logs syncbuf.Buffer
	d := newTest(f.asDaemon(t).pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), MaxRetries: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, BatchSize: 5}}, signals{TestSignals: TestSignals{BeforeCommit: func(string, int64) {
		if commits++; commits == 3 {
			if err := worker.StopServer(ctx); err != nil {
				t.Errorf("stop the worker: %v", err)
			}
		}
	}}})
	res, err := d.RunPass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := res[0]
	if first.Err == nil || !strings.Contains(first.Err.Error(), node) || retry.KindOf(first.Err) != retry.KindConnection {
		t.Fatalf("pass with the worker gone: %v; want a connection error naming %s", first.Err, node)
	}
	if !strings.Contains(logs.String(), "expiry: table failed") || !strings.Contains(logs.String(), node) {
		t.Errorf("the log does not name the node %s:\n%s", node, logs.String())
	}
	restart()
	if gone := 200 - f.count(t, "true"); first.Deleted != gone || gone == 0 {
		t.Errorf("the failed pass reported %d deleted, %d rows are gone; want the two committed batches counted", first.Deleted, gone)
	}
	d.TestSignals = TestSignals{}
	res, err = d.RunPass(ctx)
	if err != nil || res[0].Err != nil {
		t.Fatalf("the pass after the restart: %v %v", err, res[0].Err)
	}
	if left := f.count(t, "true"); first.Deleted+res[0].Deleted != 200 || left != 0 {
		t.Errorf("the passes reported %d + %d deleted, %d rows left; want 200 and none", first.Deleted, res[0].Deleted, left)
	}
}

// A reference table and a Citus local table go by expiry windows too: the
// coordinator sends each statement to every copy of the table, where a
// ctid means another row, and refuses SKIP LOCKED in a modification. A
// pass over one with due rows another table points at, while an
// application holds a due row locked, waits for it at most the lock
// timeout (a worker's own is none: the batch sends its own). On the Citus
// local table it steps over the row and deletes every other due row; on
// the reference table, which Citus locks whole for a session that holds a
// row of it, the pass ends with the lock timeout, having deleted nothing,
// and says why. Once the lock is gone, the next pass deletes what is left
// due, and nothing else, in every copy alike (one copy's rows were put at
// other ctids first). Once, a batch waited on the lock until the statement
// timeout, six times over, and a referenced row failed every batch (cannot
// perform distributed planning).
func TestCitusReferenceAndLocalTables(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"create_reference_table", "citus_add_local_table_to_metadata"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewMigratedCitusPool(t, inboxDDL, "SELECT "+kind+"('public.consumer_inbox')",
				`CREATE TABLE public.outbox (id int PRIMARY KEY, consumer text, message_id text, FOREIGN KEY (consumer, message_id) REFERENCES public.consumer_inbox (consumer, message_id))`,
				"SELECT "+kind+"('public.outbox')")
			f := fixture{pool: pool, tables: pgtest.Resolve(t, pool, inboxPolicy)}
			if f.tables[0].Distributed() || !f.tables[0].ThroughCitus() {
				t.Fatalf("the table resolves as distributed %v, through Citus %v; want false, true", f.tables[0].Distributed(), f.tables[0].ThroughCitus())
			}
			f.insert(t, "a", 100, t0.Add(-50*time.Hour), 30*time.Minute) // all due
			f.insert(t, "b", 50, t0.Add(time.Hour), time.Minute)         // none
			pgtest.Exec(t, pool, `INSERT INTO public.outbox SELECT i, 'a', 'a-' || i FROM generate_series(10, 19) i`)
			copies := func() []string {
				t.Helper()
				rows, err := pool.Query(ctx, `SELECT result FROM run_command_on_placements('public.consumer_inbox',
  $$SELECT count(*) || ' ' || md5(string_agg(message_id, ',' ORDER BY message_id)) FROM %s$$)`)
				if err != nil {
					t.Fatal(err)
				}
				out, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			if kind == "create_reference_table" {
				var shard string
				var port int
				if err := pool.QueryRow(ctx, `SELECT shard_name, nodeport FROM citus_shards WHERE table_name = 'public.consumer_inbox'::regclass AND nodeport <> inet_server_port() ORDER BY nodeport LIMIT 1`).Scan(&shard, &port); err != nil {
					t.Fatal(err)
				}
				w := pgtest.Connect(t, pgtest.CitusWorkerURL(t, port, pgtest.CurrentDatabase(t, pool)))
				before := pgtest.Value[string](t, w, fmt.Sprintf("SELECT ctid::text FROM public.%s WHERE message_id = 'a-0'", pgx.Identifier{shard}.Sanitize()))
				pgtest.Exec(t, w, fmt.Sprintf("UPDATE public.%s SET event_time = event_time WHERE consumer = 'a'", pgx.Identifier{shard}.Sanitize()))
				if after := pgtest.Value[string](t, w, fmt.Sprintf("SELECT ctid::text FROM public.%s WHERE message_id = 'a-0'", pgx.Identifier{shard}.Sanitize())); after == before {
					t.Fatalf("a-0 stayed at %s in the copy on port %d", after, port)
				}
			}
			held := pgtest.Lock(t, pool, `SELECT 1 FROM public.consumer_inbox WHERE message_id = 'a-5' FOR UPDATE`)
			o := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), LockTimeout: 500 * time.Millisecond, StatementTimeout: 20 * time.Second, MaxRetries: 1}, BatchSize: 16}}
			res, err := newTest(f.pool, f.tables, o, signals{}).RunPass(ctx)
			if err != nil {
				t.Fatal(err)
			}
			left := int64(1)
			if kind == "create_reference_table" {
				if res[0].Deleted != 0 || retry.KindOf(res[0].Err) != retry.KindLockTimeout || !strings.Contains(fmt.Sprint(res[0].Err), "Citus locks the reference table public.consumer_inbox whole") {
					t.Errorf("pass: deleted %d (%v); want none, and the lock timeout, saying why", res[0].Deleted, res[0].Err)
				}
				left = 90
			} else if res[0].Err != nil || res[0].Deleted != 89 || res[0].Retries != 0 {
				t.Errorf("pass: deleted %d with %d retries (%v); want 89 (all due rows but the locked one and the 10 referenced), none, no error", res[0].Deleted, res[0].Retries, res[0].Err)
			}
			if err := held.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if res := f.pass(t, o); res.Err != nil || res.Deleted != left {
				t.Errorf("the next pass deleted %d (%v), want %d", res.Deleted, res.Err, left)
			}
			if n := f.count(t, "consumer = 'b'"); n != 50 {
				t.Errorf("%d rows not due left, want 50", n)
			}
			if c := copies(); len(c) < 1 || slices.ContainsFunc(c, func(s string) bool { return s != c[0] }) || !strings.HasPrefix(c[0], "60 ") {
				t.Errorf("the copies hold %v; want each the same 60 rows", c)
			}
		})
	}
}
