package throttle_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// On a Citus coordinator a batch's row locks are held on the workers by
// its connections there, and an application session waits there, not on
// the coordinator: the coordinator's own lock view sees nothing, and the
// watch must read every node's (citus_lock_waits) to cancel the batch.
func TestCitusLockWatchSeesWaitsOnWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewCitusPool(t)
	pgtest.Exec(t, pool, `CREATE TABLE public.consumer_inbox (consumer text, message_id text, payload text, PRIMARY KEY (consumer, message_id));`+
		pgtest.Distribute("consumer", "public.consumer_inbox")+`
INSERT INTO public.consumer_inbox VALUES ('c', 'm1', 'x')`)
	th := throttle.New(pool, config.Config{}, service.Base{}, nil)

	tx := pgtest.Begin(t, pgtest.Connect(t, url))
	var pid uint32
	var start time.Time
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), now()").Scan(&pid, &start); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, tx, "DELETE FROM public.consumer_inbox WHERE consumer = 'c' AND message_id = 'm1'")
	sleeping := inBackground(func() error { _, err := tx.Exec(ctx, "SELECT pg_sleep(60)"); return err })
	waiter := inBackground(func() error {
		_, err := pool.Exec(ctx, "UPDATE public.consumer_inbox SET payload = 'mine' WHERE consumer = 'c' AND message_id = 'm1'")
		return err
	})
	pgtest.WaitFor(t, 30*time.Second, "the waiter to wait on the holder's lock on a worker", func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM citus_lock_waits").Scan(&n)
		return n > 0
	})
	done, blocked := th.Watch(pid, start)
	defer done()
	th.CheckLocksNow(ctx, false)
	if blocked() {
		t.Fatal("the coordinator's own lock view reported a wait that is on a worker")
	}
	th.CheckLocksNow(ctx, true)
	if !blocked() {
		t.Fatal("the wait on the worker was not seen")
	}
	if err := receive(t, sleeping, "the blocking transaction to be cancelled"); err == nil {
		t.Error("the blocking transaction was not cancelled")
	}
	_ = tx.Rollback(ctx)
	if err := receive(t, waiter, "the application's update"); err != nil {
		t.Errorf("the application's update: %v", err)
	}
}

// A standby of a worker, listed in INBOXKEEPER_REPLICA_URLS, is read like
// any standby: migrate made the heartbeat a reference table, so the beats
// the coordinator writes reach the worker and its standby; a paused replay
// there throttles the daemon.
func TestCitusWorkerStandby(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewCitusPool(t)
	pgtest.Migrate(t, url)
	standby := pgtest.NewStandby(t, pgtest.Citus(t).Workers[0], nil)
	standbyURL := standby.URL(pgtest.ConnConfig(t, url).Database)
	th := startThrottle(t, pool, config.Config{ReplicaURLs: []string{standbyURL}, MaxReplicaLag: time.Second, HeartbeatInterval: 100 * time.Millisecond})
	pgtest.WaitFor(t, 30*time.Second, "the worker's standby to apply a heartbeat", func() bool { return !th.Check().Throttled })
	pgtest.ExecOn(t, standbyURL, "SELECT pg_wal_replay_pause()")
	pgtest.WaitFor(t, 30*time.Second, "the throttle to see the worker's standby lag", func() bool { return th.Check().Throttled })
	if k := th.Check().Kind; k != throttle.ReplicaLag {
		t.Errorf("throttled for %q, want %q (%s)", k, throttle.ReplicaLag, th.Check().Reason)
	}
	pgtest.ExecOn(t, standbyURL, "SELECT pg_wal_replay_resume()")
	pgtest.WaitFor(t, 30*time.Second, "the throttle to resume", func() bool { return !th.Check().Throttled })
}

// A standby of a worker, listed nowhere: the coordinator finds it through
// its metadata (run_command_on_workers) and paces against it like one of
// its own. With its replay paused, a deleter whose batches write their WAL
// on that worker fills the standby's WAL window and is held there, the
// hold naming the standby; once replay resumes, the pass finishes. Not
// parallel: the paused standby would hold the throttle of every other
// Citus test of this binary, which all read the shared workers' standbys.
func TestCitusWorkerStandbyPaces(t *testing.T) {
	ctx := context.Background()
	_, url := pgtest.NewCitusPool(t)
	// Every row has consumer c: one shard, on one worker.
	const rows = 40000
	e := newEnv(t, url, rows, ";"+pgtest.Distribute("consumer", "public.consumer_inbox"))
	if !e.table.Distributed() {
		t.Fatal("the inbox is not distributed")
	}
	var port int
	if err := e.pool.QueryRow(ctx, `SELECT nodeport FROM citus_shards
WHERE shardid = get_shard_id_for_distribution_column('public.consumer_inbox', 'c')`).Scan(&port); err != nil {
		t.Fatal(err)
	}
	var worker *pgcluster.Cluster
	for _, w := range pgtest.Citus(t).Workers {
		if w.Port == port {
			worker = w
		}
	}
	standby := pgtest.NewStandby(t, worker, nil)
	name := fmt.Sprintf("127.0.0.1:%d/", port)

	held := make(chan throttle.Admission, 1)
	th := startThrottle(t, e.pool, config.Config{MaxReplicaLag: time.Hour, MaxReplicaLagBytes: 1 << 40}, throttle.TestSignals{
		Held: func(a throttle.Admission) {
			select {
			case held <- a:
			default:
			}
		}})
	// The fill's WAL replayed there first.
	pgtest.WaitFor(t, 60*time.Second, "the throttle to pace against the worker's standby, caught up", func() bool {
		for _, p := range th.Paces() {
			// Reported: a walsender that has just connected has no
			// replay position yet, and Behind 0 would pass for caught up
			// (the first hold was then "has not reported", 3 runs of 5).
			if strings.HasPrefix(p.Standby, name) && p.Reported && p.Behind < 64<<10 {
				return true
			}
		}
		return false
	})
	if !th.PacesWorkers() {
		t.Fatal("PacesWorkers is false with a worker's standby paced")
	}
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_pause()")

	d := expiry.New(e.pool, []*catalog.Table{e.table}, expiry.Options{
		Settings: batchloop.Settings{Base: service.Base{Throttle: th}, BatchSize: 200, Sizing: &expiry.Sizing{Min: 50, Max: 2000, Target: time.Second}},
	})
	done := make(chan expiry.TableResult, 1)
	go func() {
		res, _ := d.RunPass(ctx)
		done <- res[0]
	}()
	select {
	case h := <-held:
		t.Logf("held: %+v", h)
		if !strings.HasPrefix(h.Standby, name) || !strings.Contains(h.Hold, "WAL window") {
			t.Errorf("hold %+v does not name the worker's standby and the window", h)
		}
	case res := <-done:
		t.Fatalf("the pass ended without the worker's standby's window ever holding a batch: %+v", res)
	case <-time.After(60 * time.Second):
		t.Fatal("timed out waiting for the window to hold a batch")
	}
	pgtest.ExecOn(t, standby.URL("postgres"), "SELECT pg_wal_replay_resume()")
	select {
	case res := <-done:
		if res.Err != nil || res.Deleted != rows {
			t.Fatalf("pass: %+v", res)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("the pass did not finish once replay resumed")
	}
}

// Between passes the workers' standbys are read as the coordinator's are,
// every 10 s while one exists, not every CitusStandbyPollInterval: each
// reading is a run_command_on_workers, a connection and a transaction on
// every worker, and a daemon with nothing to do must be quiet there too.
// While a pass asks for batches they are read at their cadence again.
func TestCitusWorkerStandbyQuietBetweenPasses(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewCitusPool(t)
	worker := pgtest.Citus(t).Workers[0]
	pgtest.NewStandby(t, worker, nil)
	name := fmt.Sprintf("127.0.0.1:%d/", worker.Port)

	var mu sync.Mutex
	var reads []time.Time
	readsSince := func(from time.Time) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		var out []time.Time
		for _, r := range reads {
			if !r.Before(from) {
				out = append(out, r)
			}
		}
		return out
	}
	th := startThrottle(t, pool, config.Config{MaxReplicaLag: time.Hour, MaxReplicaLagBytes: 1 << 40}, throttle.TestSignals{
		WorkersRead: func() {
			mu.Lock()
			reads = append(reads, time.Now())
			mu.Unlock()
		}})
	pgtest.WaitFor(t, 60*time.Second, "the throttle to see the worker's standby", func() bool {
		for _, p := range th.Paces() {
			if strings.HasPrefix(p.Standby, name) {
				return true
			}
		}
		return false
	})

	// Awake (as a pass asking for batches): every 500 ms.
	awake := time.Now()
	pgtest.WaitFor(t, 30*time.Second, "5 readings of the workers while awake", func() bool { return len(readsSince(awake)) >= 5 })
	got := readsSince(awake)
	if span := got[4].Sub(got[0]); span > 4*time.Second {
		t.Errorf("awake, 5 readings of the workers took %s, want about 4 x %s", span, throttle.CitusStandbyPollInterval)
	}

	// Idle: a standby exists, so they are read, every 10 s.
	th.Idle()
	idle := time.Now()
	pgtest.WaitFor(t, 60*time.Second, "2 readings of the workers between passes", func() bool { return len(readsSince(idle)) >= 2 })
	got = readsSince(idle)
	if gap := got[1].Sub(got[0]); gap < 9*time.Second {
		t.Errorf("between passes the workers were read %s apart, want 10 s", gap)
	}

	// The next pass wakes the throttle: their cadence again.
	if _, err := th.Admit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	woken := time.Now()
	pgtest.WaitFor(t, 30*time.Second, "3 readings of the workers once awake again", func() bool { return len(readsSince(woken)) >= 3 })
	if got := readsSince(woken); got[2].Sub(got[0]) > 3*time.Second {
		t.Errorf("awake again, 3 readings of the workers took %s", got[2].Sub(got[0]))
	}
}
