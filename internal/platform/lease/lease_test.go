package lease

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/syncbuf"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// instances are two daemons' handles on the lease of a migrated database
// of the test's own, each with its own ttl.
func instances(t *testing.T, ttlA, ttlB time.Duration) (a, b *Lease, db DB) {
	t.Helper()
	pool, _ := pgtest.NewMigratedPool(t)
	return New(pool, ttlA, nil), New(pool, ttlB, nil), pool
}

// One instance holds the lease at a time; the others see who, take it once
// it is released or has run out, and the holder knows when it may no
// longer be sure it holds it.
func TestLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// The holder's environment travels with the lease, and goes with it:
	// the next holder's replaces it, and one that publishes none leaves
	// none.
	t.Run("Publish", func(t *testing.T) {
		t.Parallel()
		a, b, pool := instances(t, time.Minute, time.Minute)
		a.Publish([]byte(`{"INBOXKEEPER_BATCH_SIZE": "1000"}`))
		if held, _, err := a.TryAcquire(ctx); err != nil || !held {
			t.Fatalf("held %v, %v", held, err)
		}
		cur, err := Current(ctx, pool)
		if err != nil || cur == nil || string(cur.Environment) != `{"INBOXKEEPER_BATCH_SIZE": "1000"}` {
			t.Fatalf("status reads %+v (%s), %v", cur, cur.Environment, err)
		}
		a.Release(ctx)
		if held, _, err := b.TryAcquire(ctx); err != nil || !held {
			t.Fatalf("held %v, %v", held, err)
		}
		if cur, err := Current(ctx, pool); err != nil || cur == nil || cur.Environment != nil {
			t.Errorf("an instance that publishes nothing: status reads %+v (%s), %v", cur, cur.Environment, err)
		}
	})

	t.Run("OneHolder", func(t *testing.T) {
		t.Parallel()
		a, b, pool := instances(t, time.Minute, time.Minute)
		if a.Name() == b.Name() {
			t.Fatalf("two handles in one process share the holder name %s", a.Name())
		}
		if held, _, err := a.TryAcquire(ctx); err != nil || !held || !a.Held() || a.Check() != nil {
			t.Fatalf("the first instance: held %v, %v, check %v", held, err, a.Check())
		}
		held, h, err := b.TryAcquire(ctx)
		if err != nil || held || h.Name != a.Name() || b.Held() || b.Check() == nil {
			t.Fatalf("the second instance: held %v, holder %+v, %v", held, h, err)
		}
		if cur, err := Current(ctx, pool); err != nil || cur == nil || cur.Name != a.Name() || time.Until(cur.ExpiresAt) < 50*time.Second {
			t.Errorf("status reads the holder %+v, %v", cur, err)
		}
		// Renewing keeps it; a release hands it over at once.
		if held, _, _ := a.TryAcquire(ctx); !held {
			t.Error("the holder could not renew")
		}
		a.Release(ctx)
		if a.Held() {
			t.Error("still held after the release")
		}
		if cur, _ := Current(ctx, pool); cur != nil {
			t.Errorf("a holder after the release: %+v", cur)
		}
		if held, _, _ := b.TryAcquire(ctx); !held {
			t.Error("the second instance could not take the released lease")
		}
	})

	// A lease row that runs out further ahead than any instance renewing
	// it writes (a forged row, or one written by hand) is not honoured:
	// before, a lease written to run out in ten years made once wait for
	// ever, and run never delete.
	t.Run("TooFarAheadIsTakenOver", func(t *testing.T) {
		t.Parallel()
		a, _, pool := instances(t, time.Minute, time.Minute)
		q := pool.(interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		})
		if _, err := q.Exec(ctx, `INSERT INTO inboxkeeper.lease (holder, acquired_at, renewed_at, expires_at)
VALUES ('forged', now(), now(), now() + interval '10 years')`); err != nil {
			t.Fatal(err)
		}
		if held, _, err := a.TryAcquire(ctx); err != nil || !held {
			t.Errorf("a lease that runs out in ten years: held %v, %v; want it taken over", held, err)
		}
		// One that runs out within MaxTTL is honoured.
		if _, err := q.Exec(ctx, `UPDATE inboxkeeper.lease SET holder = 'other', expires_at = now() + $1 * interval '1 second'`,
			(MaxTTL - time.Minute).Seconds()); err != nil {
			t.Fatal(err)
		}
		if held, h, err := a.TryAcquire(ctx); err != nil || held || h.Name != "other" {
			t.Errorf("a lease that runs out within %s: held %v by %q, %v; want it honoured", MaxTTL, held, h.Name, err)
		}
	})

	t.Run("RunsOut", func(t *testing.T) {
		t.Parallel()
		a, b, _ := instances(t, 300*time.Millisecond, time.Minute)
		if held, _, _ := a.TryAcquire(ctx); !held {
			t.Fatal("the first instance did not get the lease")
		}
		// The holder stops being sure before the database lets anyone else
		// in: it keeps a fifth of the ttl as slack.
		pgtest.WaitFor(t, 10*time.Second, "the holder to stop being sure it holds the lease", func() bool { return !a.Held() })
		pgtest.WaitFor(t, 10*time.Second, "the lease to run out for another instance", func() bool {
			held, _, err := b.TryAcquire(ctx)
			return err == nil && held
		})
		if held, h, _ := a.TryAcquire(ctx); held || h.Name != b.Name() {
			t.Errorf("the first instance took it back from %s: held %v", h.Name, held)
		}
	})

	t.Run("Wait", func(t *testing.T) {
		t.Parallel()
		a, b, _ := instances(t, 3*time.Second, 3*time.Second)
		if held, _, _ := a.TryAcquire(ctx); !held {
			t.Fatal("the first instance did not get the lease")
		}
		stop := a.Start(ctx) // keeps it, and releases it when stopped
		var held ErrHeld
		if err := b.Wait(ctx, 200*time.Millisecond); !errors.As(err, &held) || held.Holder.Name != a.Name() || held.For != 200*time.Millisecond {
			t.Fatalf("waiting while another keeps the lease: %v, want ErrHeld naming it", err)
		}
		waited := make(chan error, 1)
		go func() { waited <- b.Wait(ctx, time.Minute) }()
		stop() // releases it
		select {
		case err := <-waited:
			if err != nil || !b.Held() {
				t.Errorf("waiting for a released lease: %v, held %v", err, b.Held())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("still waiting 30 s after the holder released the lease")
		}
		if a.Held() {
			t.Error("the stopped keeper still holds the lease")
		}
	})

	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		a, b, _ := instances(t, time.Minute, time.Minute)
		if held, _, _ := a.TryAcquire(ctx); !held {
			t.Fatal("the first instance did not get the lease")
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		var held ErrHeld
		if err := b.Wait(cctx, 0); err == nil || errors.As(err, &held) {
			t.Errorf("waiting with a cancelled context: %v, want its error", err)
		}
	})
}

// Keep first renews a lease taken a moment ago (once's Wait) a third of its
// ttl later, not at once: that renewal was a round trip, and often a
// connection, for nothing. A lease not held it tries to take at once (the
// daemon's start).
func TestKeepAfterWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, db := instances(t, 3*time.Second, time.Minute)
	if err := a.Wait(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	renewed := func() time.Time {
		var r time.Time
		if err := db.QueryRow(ctx, "SELECT renewed_at FROM inboxkeeper.lease").Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	took := renewed()
	stop := a.Start(ctx)
	time.Sleep(300 * time.Millisecond)
	if r := renewed(); !r.Equal(took) {
		t.Errorf("renewed %s after it was taken; want a third of the ttl (1 s) later", r.Sub(took))
	}
	pgtest.WaitFor(t, 10*time.Second, "the first renewal", func() bool { return renewed().After(took) })
	stop() // releases it
	stopB := b.Start(ctx)
	defer stopB()
	pgtest.WaitFor(t, 10*time.Second, "the lease to be taken at once (a third of this ttl is 20 s)", b.Held)
}

// As the daemon starts, its keeper and its first pass both try to take the
// lease: the second takes what the first found (Acquire) rather than
// asking the database again; TryAcquire always asks.
func TestAcquireAfterAnAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewMigratedPool(t)
	db := &countingDB{DB: pool}
	a, b := New(db, time.Minute, nil), New(db, time.Minute, nil)
	stop := a.Start(ctx) // the keeper tries at once
	defer stop()
	pgtest.WaitFor(t, 10*time.Second, "the keeper to take the lease", a.Held)
	if held, _, err := a.Acquire(ctx); err != nil || !held {
		t.Fatalf("Acquire after the keeper took the lease: held %v, %v", held, err)
	}
	if n := db.attempts.Load(); n != 1 {
		t.Errorf("%d statements took the lease, want 1 (the keeper's)", n)
	}
	if held, _, err := a.TryAcquire(ctx); err != nil || !held || db.attempts.Load() != 2 {
		t.Errorf("TryAcquire: held %v, %v, %d statements in all; want it held and 2", held, err, db.attempts.Load())
	}
	// Another instance: what its attempt found (a holds it) stands for a
	// second, without a statement.
	if held, h, err := b.TryAcquire(ctx); err != nil || held || h.Name != a.Name() {
		t.Fatalf("b.TryAcquire: held %v by %q, %v; want held by %q", held, h.Name, err, a.Name())
	}
	if held, h, err := b.Acquire(ctx); err != nil || held || h.Name != a.Name() || db.attempts.Load() != 3 {
		t.Errorf("b.Acquire right after: held %v by %q, %v, %d statements; want held by %q and 3", held, h.Name, err, db.attempts.Load(), a.Name())
	}
}

// countingDB counts the attempts to take or renew the lease.
type countingDB struct {
	DB
	attempts atomic.Int64
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "INSERT INTO inboxkeeper.lease") {
		c.attempts.Add(1)
	}
	return c.DB.QueryRow(ctx, sql, args...)
}

// A lease that cannot be renewed is said once however many attempts fail,
// once more when it is lost, and once when it is renewed again, with how
// long and how many attempts failed. On e58e20f every attempt whose
// error's text changed was a line (the connection terminated, then
// refused), and nothing said when it worked again.
func TestKeeperSaysAnOutageOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, pool := pgtest.NewMigratedCluster(t)
	var out syncbuf.Buffer
	l := New(pool, 3*time.Second, slog.New(slog.NewTextHandler(&out, nil)))
	stop := l.Start(ctx)
	defer stop()
	pgtest.WaitFor(t, 30*time.Second, "the lease taken", l.Held)
	if err := c.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	// Lost: the keeper failed for more than 4/5 of the ttl, an attempt a
	// second.
	pgtest.WaitFor(t, 30*time.Second, "the lease lost", func() bool { return strings.Contains(out.String(), "no longer active") })
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 30*time.Second, "the lease taken again", func() bool { return strings.Contains(out.String(), "taken or renewed again") })
	log := out.String()
	if n := strings.Count(log, "cannot take or renew the lease"); n != 1 {
		t.Errorf("%d lines for the failing attempts, want 1:\n%s", n, log)
	}
	if !regexp.MustCompile(`taken or renewed again" failed_for=\S+ attempts_failed=([3-9]|\d\d)`).MatchString(log) {
		t.Errorf("the end does not count the attempts that failed (at least 3):\n%s", log)
	}
}
