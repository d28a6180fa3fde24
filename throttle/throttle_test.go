package throttle_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is a migrated database with an inbox of expired rows.
type env struct {
	url   string
	pool  *pgxpool.Pool
	table *catalog.Table
}

const inboxDDL = `
CREATE TABLE public.consumer_inbox (
    consumer text NOT NULL, message_id text NOT NULL, payload text,
    remember_until timestamptz, PRIMARY KEY (consumer, message_id));
CREATE INDEX ON public.consumer_inbox (remember_until);`

func newEnv(t *testing.T, url string, rows int, extraDDL string) env {
	t.Helper()
	pgtest.Migrate(t, url)
	pgtest.ExecOn(t, url, inboxDDL+extraDDL)
	pgtest.ExecOn(t, url, `INSERT INTO public.consumer_inbox
SELECT 'c', 'm' || i, repeat('x', 200), now() - interval '1 day' + i * interval '1 millisecond' FROM generate_series(1, $1) i`, rows)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tbl := pgtest.Resolve(t, pool, "tables:\n  - table: public.consumer_inbox\n    key: [consumer, message_id]\n    expires_at: remember_until\n")[0]
	return env{url: url, pool: pool, table: tbl}
}

// newStandbyEnv is newEnv on a cluster of its own (with settings) that has
// a standby streaming from it, for the tests of the replica signals.
func newStandbyEnv(t *testing.T, rows int, settings map[string]string) (env, *pgcluster.Cluster) {
	t.Helper()
	primary := pgtest.NewClusterWith(t, settings)
	standby := pgtest.NewStandby(t, primary, nil)
	return newEnv(t, primary.URL("postgres"), rows, ""), standby
}

func (e env) left(t *testing.T) int {
	t.Helper()
	return pgtest.Value[int](t, e.pool, "SELECT count(*) FROM public.consumer_inbox")
}

func startThrottle(t *testing.T, pool *pgxpool.Pool, cfg config.Config, signals ...throttle.TestSignals) *throttle.Throttler {
	t.Helper()
	th := throttle.New(pool, cfg, service.Base{}, nil)
	for _, s := range signals {
		th.TestSignals = s
	}
	th.Start(context.Background())
	t.Cleanup(th.Stop)
	return th
}

// inBackground runs f in a goroutine of its own and hands its error on.
func inBackground(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// receive is the error f of inBackground returned, failing the test when
// f has not returned within 30 s; what names what the test waits for.
func receive(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

// TestReplicaLagStopsTheDeleter pauses WAL replay on a real standby while the
// deleter runs: at most one batch may end after the heartbeat lag crossed the
// threshold, the deleter waits while replay is paused, and it finishes once
// replay resumes.
func TestReplicaLagStopsTheDeleter(t *testing.T) {
	t.Parallel()
	e, standby := newStandbyEnv(t, 20000, nil)
	const maxLag = time.Second
	const beat = 100 * time.Millisecond
	th := startThrottle(t, e.pool, config.Config{ReplicaURLs: []string{standby.URL("postgres")}, MaxReplicaLag: maxLag, HeartbeatInterval: beat})
	pgtest.WaitFor(t, 30*time.Second, "the standby to apply a heartbeat", func() bool { return !th.Check().Throttled })

	var stall pgtest.ReplayStall
	d := expiry.New(e.pool, []*catalog.Table{e.table}, expiry.Options{
		Settings: batchloop.Settings{
			Base:       service.Base{Throttle: th},
			BatchSize:  100,
			BatchPause: 20 * time.Millisecond,
		},
		Progress: func(expiry.Progress) { stall.BatchEnded() },
	})
	done := make(chan expiry.TableResult, 1)
	go func() {
		res, _ := d.RunPass(context.Background())
		done <- res[0]
	}()
	stall.Stall(t, standby.URL("postgres"), func() bool { return th.State().Throttled }, func() {
		if k := th.State().Kind; k != throttle.ReplicaLag {
			t.Errorf("throttled for %q, want %q (%s)", k, throttle.ReplicaLag, th.State().Reason)
		}
	})
	res := <-done
	if res.Err != nil || res.Deleted != 20000 {
		t.Fatalf("pass: %+v", res)
	}
	// The lag crossed the threshold no later than maxLag after the pause;
	// the collector sees it within one heartbeat read. One batch may be in
	// flight then.
	if late := stall.Late(maxLag + 3*beat); late > 1 {
		t.Errorf("%d batches ended after the lag crossed the threshold, want at most 1", late)
	}
	if e.left(t) != 0 {
		t.Error("rows left after the pass")
	}
}

func TestStoppedStandbyFailsClosedOrOpen(t *testing.T) {
	t.Parallel()
	e, standby := newStandbyEnv(t, 10, nil)
	cfg := config.Config{ReplicaURLs: []string{standby.URL("postgres")}, HeartbeatInterval: 50 * time.Millisecond}
	closed := startThrottle(t, e.pool, cfg)
	cfg.ReplicaFailOpen = true
	open := startThrottle(t, e.pool, cfg)
	pgtest.WaitFor(t, 30*time.Second, "a healthy standby", func() bool { return !closed.Check().Throttled && !open.Check().Throttled })

	if err := standby.StopServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 30*time.Second, "fail closed", func() bool { return closed.Check().Kind == throttle.ReplicaUnreachable })
	// The two throttles probe on their own clocks: the open one may see the
	// standby gone a probe later than the closed one.
	pgtest.WaitFor(t, 30*time.Second, "the open throttle to see the standby unreachable", func() bool {
		for _, r := range open.Readings() {
			if r.Kind == throttle.ReplicaUnreachable {
				return true
			}
		}
		return false
	})
	if s := open.Check(); s.Throttled {
		t.Errorf("fail open throttled anyway: %s", s.Reason)
	}
	var sawOpen bool
	for _, r := range open.Readings() {
		if r.Kind == throttle.ReplicaUnreachable && strings.Contains(r.Detail, "fail open") {
			sawOpen = true
		}
	}
	if !sawOpen {
		t.Errorf("fail open does not say so: %v", open.Readings())
	}
	if err := standby.StartServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 30*time.Second, "recovery after the standby is back", func() bool { return !closed.Check().Throttled })
}

func TestLogicalSlotLag(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	e := newEnv(t, c.URL("postgres"), 10, "")
	pgtest.ExecOn(t, e.url, "SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
	th := startThrottle(t, e.pool, config.Config{MaxSlotLagBytes: 1 << 20})
	if s := th.Check(); s.Throttled {
		t.Fatalf("throttled before any WAL: %s", s.Reason)
	}
	pgtest.ExecOn(t, e.url, "CREATE TABLE filler AS SELECT md5(i::text) AS f FROM generate_series(1, 50000) i") // ~5 MB of WAL
	pgtest.WaitFor(t, 30*time.Second, "slot lag to throttle", func() bool { return th.Check().Kind == throttle.SlotLag })
	if !strings.Contains(th.Check().Reason, "cdc") {
		t.Errorf("reason %q does not name the slot", th.Check().Reason)
	}
	// The CDC consumer reads (and confirms) everything, and keeps reading
	// what autovacuum writes meanwhile, as a real one would.
	pgtest.WaitFor(t, 30*time.Second, "the slot to catch up", func() bool {
		pgtest.ExecOn(t, e.url, "SELECT count(*) FROM pg_logical_slot_get_changes('cdc', NULL, NULL)")
		return !th.Check().Throttled
	})
}

// TestLockWaiterProceeds holds a batch open in slow triggers while another
// session waits on one of its rows: the throttle cancels the batch, the
// waiter proceeds, the pass stops and the next batch is smaller.
func TestLockWaiterProceeds(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	_ = pool
	e := newEnv(t, url, 200, `
CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.05); RETURN OLD; END $$;
CREATE TRIGGER slow BEFORE DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION slow();`)
	th := startThrottle(t, e.pool, config.Config{})
	d := expiry.New(e.pool, []*catalog.Table{e.table}, expiry.Options{
		Settings: batchloop.Settings{
			Base:      service.Base{Throttle: th, StatementTimeout: time.Minute},
			BatchSize: 100,
			Sizing:    &expiry.Sizing{Min: 10, Max: 1000, Target: time.Minute},
		},
	})
	done := make(chan expiry.TableResult, 1)
	go func() {
		res, _ := d.RunPass(context.Background())
		done <- res[0]
	}()
	ctx := context.Background()
	pgtest.WaitFor(t, 30*time.Second, "the batch to be in its triggers", func() bool {
		var n int
		_ = e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep' AND query NOT LIKE '%pg_sleep(60)%'").Scan(&n)
		return n > 0
	})
	start := time.Now()
	// The oldest row is in the first batch, locked FOR UPDATE by it.
	tag, err := e.pool.Exec(ctx, "UPDATE public.consumer_inbox SET payload = 'mine' WHERE message_id = 'm1'")
	waited := time.Since(start)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("waiter: %v (%d rows)", err, tag.RowsAffected())
	}
	// 100 rows x 50 ms = 5 s if the batch had run to the end.
	if waited > 3*time.Second {
		t.Errorf("the waiter waited %s: the batch was not cancelled", waited)
	}
	res := <-done
	if res.Err != nil || res.StoppedEarly.Kind != retry.KindLockWait || res.Deleted != 0 {
		t.Errorf("pass: %+v, want it stopped with nothing deleted", res)
	}
	if got := d.BatchSize(e.table); got != 50 {
		t.Errorf("next batch size %d, want 50 (halved)", got)
	}
	if s := th.Check(); s.Kind != throttle.LockWait {
		t.Logf("throttle state right after: %+v (the lock-wait cool-down may have ended)", s)
	}
}

// TestBatchSizeConverges deletes from a table whose delete trigger costs
// about 0.5 ms a row: with a 50 ms target the size must settle near 100 rows
// from a start of 1000.
func TestBatchSizeConverges(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewPool(t)
	e := newEnv(t, url, 4000, `
CREATE FUNCTION slowish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.0005); RETURN OLD; END $$;
CREATE TRIGGER slowish BEFORE DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION slowish();`)
	const target = 50 * time.Millisecond
	var mu sync.Mutex
	var durations []time.Duration
	// In expiry order: the sizer alone sizes the batches there (a sweep's
	// slice also ends at the pages that fit in the target).
	d := expiry.New(e.pool, []*catalog.Table{e.table}, expiry.Options{
		Settings: batchloop.Settings{
			BatchSize: 1000,
			Sizing:    &expiry.Sizing{Min: 10, Max: 5000, Target: target},
		},
		Strategy: expiry.StrategyExpiry,
		Progress: func(p expiry.Progress) {
			mu.Lock()
			durations = append(durations, p.BatchDuration)
			mu.Unlock()
		},
	})
	res, err := d.RunPass(context.Background())
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	// The first batch is a probe of a tenth of the starting size (the
	// trigger: batchloop.Sizer.Probe); a batch of the whole size would
	// have taken ten times as long.
	if 10*durations[0] < 4*target {
		t.Fatalf("the first batch took %s: the trigger is not slow enough for this test", durations[0])
	}
	// Judge the settled batches by the median of the second half (the last
	// batch, short, left out). Not the last few one by one: on a loaded
	// machine one batch stalled at 4x the target, the size shrank to match,
	// and growing back at most 1.2x a batch took the rest of the table
	// (the last five took 11 to 20 ms, the median of the half 45 ms).
	settled := slices.Clone(durations[len(durations)/2 : len(durations)-1])
	slices.Sort(settled)
	if median := settled[len(settled)/2]; median < target/3 || median > 3*target {
		t.Errorf("settled batches took %s (median of the second half), want near %s (all: %v)", median, target, durations)
	}
	// The size the durations settled at depends on how long the trigger's
	// sleep really takes on a loaded machine (about 100 rows unloaded, 12
	// seen under a parallel suite): judge only that it shrank well below
	// the first batch's, which took four targets or more.
	if s := d.BatchSize(e.table); s > 1000/3 {
		t.Errorf("settled size %d, want well below the first batch's 1000", s)
	}
}

func TestManualPauseAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := pgtest.NewPool(t)
	e := newEnv(t, url, 10, "")
	a := startThrottle(t, e.pool, config.Config{})
	other, err := pgxpool.New(ctx, url) // a second instance, its own pool
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	b := startThrottle(t, other, config.Config{})

	if _, err := throttle.SetPause(ctx, e.pool, "vacuum running", "dba", 0); err != nil {
		t.Fatal(err)
	}
	for name, th := range map[string]*throttle.Throttler{"a": a, "b": b} {
		pgtest.WaitFor(t, 10*time.Second, "instance "+name+" to pause", func() bool { return th.Check().Kind == throttle.ManualPause })
		if !strings.Contains(th.Check().Reason, "vacuum running") {
			t.Errorf("instance %s: reason %q lacks the pause reason", name, th.Check().Reason)
		}
	}
	if was, err := throttle.ClearPause(ctx, other); err != nil || !was {
		t.Fatalf("resume: %v %v", was, err)
	}
	for name, th := range map[string]*throttle.Throttler{"a": a, "b": b} {
		pgtest.WaitFor(t, 10*time.Second, "instance "+name+" to resume", func() bool { return !th.Check().Throttled })
	}
	// A pause with a duration ends by itself.
	if _, err := throttle.SetPause(ctx, e.pool, "short", "dba", time.Microsecond); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 5*time.Second, "a timed pause to have passed", func() bool {
		p, err := throttle.ActivePause(ctx, e.pool)
		return err == nil && p == nil
	})
}

// Start reads every signal once in the background, beside what a pass reads
// before its first batch; Check and Wait wait for that reading, so the
// first batch is checked against every signal: a pause made before Start
// holds the very first admission, and Stop right after Start returns.
func TestFirstReadingBeforeFirstCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := pgtest.NewPool(t)
	e := newEnv(t, url, 10, "")
	if _, err := throttle.SetPause(ctx, e.pool, "before start", "dba", 0); err != nil {
		t.Fatal(err)
	}
	th := startThrottle(t, e.pool, config.Config{})
	if s := th.Check(); s.Kind != throttle.ManualPause {
		t.Errorf("the first Check after Start: %+v, want the manual pause", s)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if s, err := th.Wait(wctx); err == nil || s.Kind != throttle.ManualPause {
		t.Errorf("the first Wait after Start: %+v, %v; want held by the manual pause until its context ends", s, err)
	}
	if _, err := throttle.ClearPause(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	other := throttle.New(e.pool, config.Config{}, service.Base{}, nil)
	other.Start(ctx)
	done := make(chan struct{})
	go func() { other.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop right after Start did not return")
	}
}

func TestCustomQuery(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewPool(t)
	e := newEnv(t, url, 10, "CREATE TABLE busy (n int); INSERT INTO busy VALUES (0);")
	th := startThrottle(t, e.pool, config.Config{ThrottleQuery: "SELECT n FROM busy"})
	if th.Check().Throttled {
		t.Fatal("throttled at 0")
	}
	pgtest.ExecOn(t, url, "UPDATE busy SET n = 3")
	pgtest.WaitFor(t, 10*time.Second, "the query to throttle", func() bool { return th.Check().Kind == throttle.CustomQuery })
	pgtest.ExecOn(t, url, "UPDATE busy SET n = 0")
	pgtest.WaitFor(t, 10*time.Second, "the query to release", func() bool { return !th.Check().Throttled })

	broken := startThrottle(t, e.pool, config.Config{ThrottleQuery: "SELECT nope FROM busy"})
	if s := broken.Check(); s.Kind != throttle.CustomQuery || !strings.Contains(s.Reason, "query failed") {
		t.Errorf("a failing query must throttle and say why: %+v", s)
	}
}

// A standby that is not listed in REPLICA_URLS is still watched, through
// pg_stat_replication on the primary: bytes it has not replayed.
func TestUnlistedStandbyBytesBehind(t *testing.T) {
	t.Parallel()
	e, standby := newStandbyEnv(t, 10, nil)
	th := startThrottle(t, e.pool, config.Config{MaxReplicaLagBytes: 1 << 20, MaxReplicaLag: time.Hour})
	pgtest.WaitFor(t, 30*time.Second, "the standby to appear in pg_stat_replication", func() bool {
		for _, r := range th.Readings() {
			if r.Kind == throttle.ReplicaLagBytes {
				return true
			}
		}
		return false
	})
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_pause()")
	pgtest.ExecOn(t, e.url, "CREATE TABLE filler AS SELECT md5(i::text) AS f FROM generate_series(1, 50000) i") // ~5 MB of WAL
	pgtest.WaitFor(t, 30*time.Second, "the bytes behind to throttle", func() bool { return th.Check().Kind == throttle.ReplicaLagBytes })
	if !strings.Contains(th.Check().Reason, "walsender") {
		t.Errorf("reason %q does not name the walsender", th.Check().Reason)
	}
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_resume()")
	pgtest.WaitFor(t, 30*time.Second, "the standby to catch up", func() bool { return !th.Check().Throttled })
}

// TestWindowHoldsBatches runs the deleter against a real standby whose replay
// is paused part-way (an unlisted one: pg_stat_replication feeds the pacer):
// every batch the pacer admits fits in the WAL window with the bytes the
// standby has not replayed, the pacer holds the next batch once the window
// is full, and the pass finishes once replay resumes.
func TestWindowHoldsBatches(t *testing.T) {
	t.Parallel()
	// No autovacuum at all: its WAL is not the batches', and would blur
	// the check of their predictions below. Off on the table only, the
	// stress run failed twice with the standby 571,520 bytes behind (the
	// same figure both times): autovacuum and autoanalyze of the catalogs
	// the migration had just churned, identical in every fresh cluster,
	// landed in the window when the machine's load stretched the test to
	// 17 to 27 s (a VACUUM ANALYZE of those tables writes about 300 kB).
	e, standby := newStandbyEnv(t, 40000, map[string]string{"autovacuum": "off"})

	var mu sync.Mutex
	var admitted []throttle.Admission
	held := make(chan throttle.Admission, 1)
	signals := throttle.TestSignals{
		Admitted: func(a throttle.Admission) { mu.Lock(); admitted = append(admitted, a); mu.Unlock() },
		Held: func(a throttle.Admission) {
			select {
			case held <- a:
			default:
			}
		},
	}
	// The lag signals out of reach: only the window holds batches here.
	th := startThrottle(t, e.pool, config.Config{MaxReplicaLag: time.Hour, MaxReplicaLagBytes: 1 << 40}, signals)
	// The fill committed asynchronously: megabytes of its WAL may not be
	// written yet (two CI runs paused replay with about 1 MB of it still
	// to come, which the window then rightly held batches behind). Wait on
	// the standby itself until it replayed all of it, up to the insert
	// position; then for the throttle to see it caught up.
	fillEnd := walInsertLSN(t, e.pool)
	standbyPool := pgtest.Connect(t, standby.URL("postgres"))
	pgtest.WaitFor(t, 60*time.Second, "the standby to replay the fill", func() bool {
		var done bool
		err := standbyPool.QueryRow(context.Background(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", fillEnd).Scan(&done)
		return err == nil && done
	})
	pgtest.WaitFor(t, 60*time.Second, "the throttle to see the standby caught up", func() bool {
		p := th.Paces()
		return len(p) == 1 && p[0].Reported && p[0].Behind < 64<<10
	})
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_pause()")

	d := expiry.New(e.pool, []*catalog.Table{e.table}, expiry.Options{
		Settings: batchloop.Settings{Base: service.Base{Throttle: th}, BatchSize: 200, Sizing: &expiry.Sizing{Min: 50, Max: 2000, Target: time.Second}},
	})
	done := make(chan expiry.TableResult, 1)
	go func() {
		res, _ := d.RunPass(context.Background())
		done <- res[0]
	}()
	var h throttle.Admission
	select {
	case h = <-held:
	case res := <-done:
		t.Fatalf("the pass ended without the window ever holding a batch: %+v", res)
	case <-time.After(60 * time.Second):
		t.Fatal("timed out waiting for the window to hold a batch")
	}
	if h.Standby == "" || !strings.Contains(h.Hold, "WAL window") {
		t.Errorf("hold %+v does not name the standby and the window", h)
	}
	// What the standby really has not replayed, while the batch is held:
	// the admitted batches' predictions were close enough to their WAL.
	var behind float64
	if err := e.pool.QueryRow(context.Background(),
		"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::float8 FROM pg_stat_replication").Scan(&behind); err != nil {
		t.Fatal(err)
	}
	if behind > 2*h.Window {
		t.Errorf("the standby is %.0f bytes behind, more than twice the window %.0f", behind, h.Window)
	}
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_resume()")
	res := <-done
	if res.Err != nil || res.Deleted != 40000 {
		t.Fatalf("pass: %+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(admitted) < 3 {
		t.Fatalf("only %d admissions", len(admitted))
	}
	for i, a := range admitted {
		if a.Rows <= 0 || a.Behind+a.Predicted > a.Window {
			t.Errorf("admission %d: %d rows, %.0f behind + %.0f predicted > window %.0f", i, a.Rows, a.Behind, a.Predicted, a.Window)
		}
	}
}

func walInsertLSN(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var lsn string
	if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestPaceCountsWALNotYetWritten: WAL committed asynchronously sits in the
// WAL buffers until the WAL writer writes it. It is WAL the standby will
// have to apply, so the bytes behind count it from the moment it is
// inserted. The WAL writer is frozen so that the WAL stays unwritten while
// the throttle reads; measured from pg_current_wal_lsn() (as before), the
// reading said the standby was caught up, and a batch would have been
// admitted on top of it.
func TestPaceCountsWALNotYetWritten(t *testing.T) {
	t.Parallel()
	e, _ := newStandbyEnv(t, 0, nil)
	th := startThrottle(t, e.pool, config.Config{MaxReplicaLag: time.Hour, MaxReplicaLagBytes: 1 << 40})
	pgtest.WaitFor(t, 60*time.Second, "the throttle to see the standby caught up", func() bool {
		p := th.Paces()
		return len(p) == 1 && p[0].Reported && p[0].Behind < 64<<10
	})
	var walwriter int
	if err := e.pool.QueryRow(context.Background(), "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").Scan(&walwriter); err != nil {
		t.Fatal(err)
	}
	thaw := pgtest.Freeze(t, walwriter)
	defer thaw()
	// About 600 kB of WAL, well inside wal_buffers (4 MB), so no backend
	// has to write it either.
	writer := pgtest.Connect(t, e.url)
	pgtest.Exec(t, writer, `SET synchronous_commit = off;
INSERT INTO public.consumer_inbox SELECT 'c', 'w' || i, repeat('x', 200), now() FROM generate_series(1, 2000) i`)
	var unwritten float64
	if err := writer.QueryRow(context.Background(), "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), pg_current_wal_lsn())::float8").Scan(&unwritten); err != nil {
		t.Fatal(err)
	}
	if unwritten < 256<<10 {
		t.Fatalf("only %.0f bytes of WAL unwritten with the WAL writer frozen: the test cannot tell the positions apart", unwritten)
	}
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("the throttle to count the %.0f bytes inserted, not written, as behind", unwritten), func() bool {
		p := th.Paces()
		return len(p) == 1 && p[0].Behind >= unwritten
	})
}

// TestLockWatchCancelsOnlyTheWatchedTransaction watches a backend with the
// start of a transaction that has ended (as when a pooler hands the server
// connection on): a session waiting on the backend's new transaction must
// not get that transaction cancelled. Watched with the right start, it is.
func TestLockWatchCancelsOnlyTheWatchedTransaction(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewPool(t)
	e := newEnv(t, url, 10, "")
	ctx := context.Background()
	th := throttle.New(e.pool, config.Config{}, service.Base{}, nil)

	holder := pgtest.Connect(t, url)
	var pid uint32
	var stale time.Time
	if err := holder.QueryRow(ctx, "SELECT pg_backend_pid(), now()").Scan(&pid, &stale); err != nil {
		t.Fatal(err)
	}
	tx := pgtest.Begin(t, holder)
	var start time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	if start.Equal(stale) {
		t.Fatal("the two transactions share a start time")
	}
	pgtest.Exec(t, tx, "UPDATE public.consumer_inbox SET payload = 'held' WHERE message_id = 'm1'")
	sleeping := inBackground(func() error { _, err := tx.Exec(ctx, "SELECT pg_sleep(60)"); return err })
	waiter := inBackground(func() error {
		_, err := e.pool.Exec(ctx, "UPDATE public.consumer_inbox SET payload = 'mine' WHERE message_id = 'm1'")
		return err
	})
	pgtest.WaitFor(t, 30*time.Second, "the waiter to wait on the holder's lock", func() bool {
		var n int
		_ = e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", int32(pid)).Scan(&n)
		return n > 0
	})

	done, blocked := th.Watch(pid, stale)
	th.CheckLocksNow(ctx, false)
	if blocked() {
		t.Error("a watch on an ended transaction reported the new one as blocking")
	}
	select {
	case err := <-sleeping:
		t.Fatalf("the new transaction was cancelled: %v", err)
	default:
	}
	var state string
	if err := e.pool.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&state); err != nil || state != "active" {
		t.Fatalf("holder state %q (%v), want still active", state, err)
	}
	done()

	done, blocked = th.Watch(pid, start)
	defer done()
	th.CheckLocksNow(ctx, false)
	if !blocked() {
		t.Error("the watched transaction was not reported as blocking")
	}
	if err := receive(t, sleeping, "the watched transaction to be cancelled"); err == nil || !strings.Contains(err.Error(), "57014") {
		t.Errorf("holder's statement ended with %v, want a cancel (57014)", err)
	}
	_ = tx.Rollback(ctx)
	if err := receive(t, waiter, "the waiter to get its lock"); err != nil {
		t.Errorf("waiter: %v", err)
	}
}

// status reads the signals with MeasureOnce, which writes nothing: no
// heartbeat, even with standbys listed (status may run against a standby,
// or as a role that only reads). Start, by contrast, writes one.
func TestMeasureOnceWritesNoHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewMigratedPool(t)
	beats := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM inboxkeeper.heartbeat").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cfg := config.Config{ReplicaURLs: []string{url}, MaxReplicaLag: time.Minute, HeartbeatInterval: 100 * time.Millisecond}
	throttle.New(pool, cfg, service.Base{}, nil).MeasureOnce(ctx)
	if n := beats(); n != 0 {
		t.Fatalf("MeasureOnce wrote %d heartbeat rows", n)
	}
	startThrottle(t, pool, cfg)
	pgtest.WaitFor(t, 30*time.Second, "a running throttle to write its heartbeat", func() bool { return beats() == 1 })
}

// Between passes (Idle) no heartbeat is written at HEARTBEAT_INTERVAL, so
// the newest one a healthy standby applied grows old. When the next pass
// wakes the throttle, the standby gets a fresh heartbeat and is read once
// it has applied it: the pause is not counted as lag, and the first batch
// is not held back by it.
func TestWakeAfterIdleDoesNotCountThePause(t *testing.T) {
	t.Parallel()
	e, standby := newStandbyEnv(t, 10, nil)
	// The fresh heartbeat's way to the standby and back is real lag: 251 ms
	// once with a core kept busy, when this was 200 ms, and the throttle
	// was right to hold the batch. A second is far above that way and far
	// below the 5 s pause the test makes.
	const maxLag = time.Second
	th := startThrottle(t, e.pool, config.Config{ReplicaURLs: []string{standby.URL("postgres")}, MaxReplicaLag: maxLag, HeartbeatInterval: 50 * time.Millisecond})
	pgtest.WaitFor(t, 30*time.Second, "the standby to apply a heartbeat", func() bool { return !th.Check().Throttled })

	th.Idle()
	// Wait on the heartbeat's own age: once it is five times MAX_REPLICA_LAG,
	// the old reading (the standby's clock minus the newest heartbeat it
	// applied) would throttle.
	pgtest.WaitFor(t, 30*time.Second, "the newest heartbeat to be 5 x MAX_REPLICA_LAG old", func() bool {
		var old bool
		err := e.pool.QueryRow(context.Background(), `SELECT clock_timestamp() - beat > $1::interval FROM inboxkeeper.heartbeat`, (5 * maxLag).String()).Scan(&old)
		return err == nil && old
	})
	if th.Awake() {
		t.Fatal("awake after Idle")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := th.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.Throttled {
		t.Errorf("the first admission after the pause waited: %s", first.Reason)
	}
	if !th.Awake() {
		t.Error("not awake after an admission")
	}
	for _, r := range th.Readings() {
		if r.Kind == throttle.ReplicaLag && r.Value > maxLag.Seconds() {
			t.Errorf("lag read after the pause: %s", r)
		}
	}

	// A standby that stopped applying while the daemon was idle: the
	// fresh heartbeat is not applied within MAX_REPLICA_LAG, so the first
	// admission after the pause waits, before any batch.
	th.Idle()
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_pause()")
	defer pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_resume()")
	pgtest.WaitFor(t, 30*time.Second, "the newest heartbeat to be 5 x MAX_REPLICA_LAG old again", func() bool {
		var old bool
		err := e.pool.QueryRow(context.Background(), `SELECT clock_timestamp() - beat > $1::interval FROM inboxkeeper.heartbeat`, (5 * maxLag).String()).Scan(&old)
		return err == nil && old
	})
	waited := make(chan throttle.State, 1)
	go func() {
		st, _ := th.Wait(ctx)
		waited <- st
	}()
	pgtest.WaitFor(t, 30*time.Second, "the first admission after the pause to wait for the standby", func() bool { return th.State().Throttled })
	if k := th.State().Kind; k != throttle.ReplicaLag {
		t.Errorf("throttled for %q, want %q (%s)", k, throttle.ReplicaLag, th.State().Reason)
	}
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_resume()")
	if st := <-waited; !st.Throttled {
		t.Errorf("the admission did not wait: %+v", st)
	}
}
