package holds

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// A hold, a replay marker and their ends, a pause and a runtime setting are
// on disk when the call that wrote them returns, whatever synchronous_commit the session inherits. The
// server here runs with synchronous_commit = off, and its WAL writer flushes
// at most every 10 s: a commit that does not ask for a flush itself is lost
// in a crash. Before the writers made their commits durable, the hold and
// the replay were gone after the crash in every run (4 of 4 with the
// server's default wal_writer_delay too), and the next pass deleted the rows
// the hold covered.
func TestDurableUnderAsynchronousCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.NewClusterWith(t, map[string]string{
		"synchronous_commit": "off", "wal_writer_delay": "10000ms", "wal_writer_flush_after": "1GB", "checkpoint_timeout": "1h"})
	url := c.URL("postgres")
	pool := pgtest.MigratedPoolOn(t, url, pgtest.ShortInboxDDL)
	table := pgtest.Resolve(t, pool, pgtest.ShortInboxPolicy)[0]

	crash := func() *pgxpool.Pool {
		t.Helper()
		pool.Close()
		if err := c.Crash(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.StartServer(ctx); err != nil {
			t.Fatal(err)
		}
		p, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}

	hold, err := AddHold(ctx, pool, table, HoldSpec{Scope: str("payments"), Reason: "dispute 4711", Owner: "legal"})
	if err != nil {
		t.Fatal(err)
	}
	replay, err := StartReplay(ctx, pool, table, ReplaySpec{Scope: "payments", From: time.Now().Add(-time.Hour), To: time.Now(), Owner: "ops", Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := throttle.SetPause(ctx, pool, "incident 12", "ops@host", 0); err != nil {
		t.Fatal(err)
	}
	batch := "1000"
	if _, err := settings.Write(ctx, pool, settings.Global, map[string]*string{"batch_size": &batch}, "incident 12", func([]settings.Setting) error { return nil }); err != nil {
		t.Fatal(err)
	}
	pool = crash()
	if p, err := throttle.ActivePause(ctx, pool); err != nil || p == nil {
		t.Errorf("after a crash, the pause: %+v (%v); want the one reported written", p, err)
	}
	if ss, err := settings.Load(ctx, pool); err != nil || len(ss) != 1 || ss[0].Value != batch {
		t.Errorf("after a crash, the settings: %+v (%v); want batch_size %s", ss, err, batch)
	}
	hs, err := ListHolds(ctx, pool, false)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ListReplays(ctx, pool, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].ID != hold || len(rs) != 1 || rs[0].ID != replay {
		t.Fatalf("after a crash: holds %+v, replays %+v; want hold %d and replay %d, which were reported written", hs, rs, hold, replay)
	}

	// Their ends too: a release that comes back after a crash would leave
	// an operator believing a hold is gone that still blocks the cleanup,
	// and the reverse for a finished replay.
	if err := ReleaseHold(ctx, pool, hold); err != nil {
		t.Fatal(err)
	}
	if err := FinishReplay(ctx, pool, replay); err != nil {
		t.Fatal(err)
	}
	pool = crash()
	if hs, err = ListHolds(ctx, pool, false); err != nil || len(hs) != 0 {
		t.Errorf("after a crash, active holds %+v (%v); want none: hold %d was released", hs, err, hold)
	}
	if rs, err = ListReplays(ctx, pool, false); err != nil || len(rs) != 0 {
		t.Errorf("after a crash, active replays %+v (%v); want none: replay %d was finished", rs, err, replay)
	}
}
