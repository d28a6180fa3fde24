package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
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
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	standby := pgtest.NewStandby(t, pgtest.Citus(t).Workers[0], nil)
	standbyURL := standby.URL(cfg.Database)
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
