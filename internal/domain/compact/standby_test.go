package compact_test

import (
	"context"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// TestStandbyLagHoldsTheCompaction pauses replay on a real standby while a
// compaction runs: its batches and VACUUMs go through the throttle, so at
// most one batch ends after the heartbeat lag crossed MAX_REPLICA_LAG, it
// waits while replay is paused, and it finishes, every row intact, once
// replay resumes.
func TestStandbyLagHoldsTheCompaction(t *testing.T) {
	t.Parallel()
	primary := pgtest.NewCluster(t)
	standby := pgtest.NewStandby(t, primary, nil)
	e := newEnvAt(t, primary.URL("postgres"), 40000, oldest)
	before := e.audit(t)
	ctx := context.Background()
	const maxLag, beat = time.Second, 100 * time.Millisecond
	th := throttle.New(e.pool, config.Config{ReplicaURLs: []string{standby.URL("postgres")}, MaxReplicaLag: maxLag, HeartbeatInterval: beat}, service.Base{}, nil)
	th.Start(ctx)
	t.Cleanup(th.Stop)
	pgtest.WaitFor(t, 30*time.Second, "the standby to apply a heartbeat", func() bool { return !th.Check().Throttled })

	var stall pgtest.ReplayStall
	c := e.compactor(compact.Options{
		Settings: batchloop.Settings{Base: service.Base{Throttle: th}, BatchSize: 50, BatchPause: 20 * time.Millisecond},
		Progress: func(compact.Progress) { stall.BatchEnded() },
	})
	done := make(chan compact.Result, 1)
	go func() { done <- run(t, c) }()
	stall.Stall(t, standby.URL("postgres"), func() bool { return th.State().Throttled }, func() {
		if k := th.State().Kind; k != throttle.ReplicaLag {
			t.Errorf("throttled for %q, want %q (%s)", k, throttle.ReplicaLag, th.State().Reason)
		}
	})
	res := <-done
	if res.Err != nil || res.Moved == 0 || res.Truncated == 0 {
		t.Fatalf("moved %d, gave back %d bytes: %v", res.Moved, res.Truncated, res.Err)
	}
	if after := e.audit(t); after != before {
		t.Errorf("audit after %+v, before %+v", after, before)
	}
	if !stall.Outlived() {
		t.Error("the compaction ended before the lag held it back: the test proves nothing")
	}
	// The lag crossed the threshold no later than maxLag after the pause;
	// the throttle sees it within one heartbeat read. One batch may be in
	// flight then.
	late := stall.Late(maxLag + 3*beat)
	if late > 1 {
		t.Errorf("%d batches ended after the lag crossed the threshold, want at most 1", late)
	}
}
