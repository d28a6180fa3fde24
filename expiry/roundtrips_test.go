package expiry

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
)

// sends counts the writes to a connection: pgx writes what it sends before
// it waits for an answer at once, so a write is a round trip.
type sends struct {
	net.Conn
	n *atomic.Int32
}

func (s sends) Write(b []byte) (int, error) {
	s.n.Add(1)
	return s.Conn.Write(b)
}

// watchGate is a throttle that only registers the backends it is told of.
type watchGate struct{ watched []uint32 }

func (g *watchGate) Admit(context.Context, service.Sizer) (int, error) { return 0, nil }
func (g *watchGate) Wrote(float64)                                     {}
func (g *watchGate) Watch(pid uint32, _ time.Time) (func(), func() bool) {
	g.watched = append(g.watched, pid)
	return func() {}, func() bool { return false }
}

// orderWatch is a settings watch that reads enable_seqscan where the watch
// is read.
type orderWatch struct{ seqscan string }

func (w *orderWatch) QueueCheck(b *pgx.Batch, _ *error) {
	b.Queue("SELECT current_setting('enable_seqscan')").QueryRow(func(row pgx.Row) error { return row.Scan(&w.seqscan) })
}

// A batch transaction costs two round trips besides its statement: BEGIN,
// its settings, the fence, its now, the holds and replays, the caller's
// settings and the settings watch together; the COMMIT with the WAL
// reading. It took eight with the watch's read before it, and nine with a
// sweep's settings: a few milliseconds a slice on a short pass, more on a
// network (docs/design/expiry.md, "Round trips of a batch, and the
// connections a process opens"). What it reads is what it read before,
// and a change of the runtime settings stops the batch before its
// statement, as the watch read before the batch did.
func TestBatchRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "held", 5, t0.Add(-time.Hour), time.Minute)
	f.insert(t, "free", 5, t0.Add(-time.Hour), time.Minute)
	held := "held"
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &held, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int32
	pc := f.pool.Config().Copy()
	pc.MaxConns = 1
	dial := pc.ConnConfig.DialFunc
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return sends{c, &writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	gate := &watchGate{}
	version, err := settings.Version(ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	watch := settings.NewWatch(f.pool, version)
	batch := func(consumer string) (tx *batchloop.Tx, trips int32, wal float64) {
		t.Helper()
		before := writes.Load()
		tx, err := batchloop.Begin(ctx, pool, f.tables[0].Name, batchloop.TxOptions{LockTimeout: 50 * time.Millisecond, Throttle: gate,
			Clock: service.At(t0), Settings: sweepSettingsSQL, Watch: watch})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Close(ctx, &err)
		if _, err = tx.Exec(ctx, "DELETE FROM public.consumer_inbox WHERE consumer = $1 AND remember_until <= $2", consumer, tx.Now); err != nil {
			t.Fatal(err)
		}
		if wal, err = tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return tx, writes.Load() - before, wal
	}
	batch("none") // the statements prepared: a pass prepares them once
	tx, trips, wal := batch("free")
	if trips != 3 {
		t.Errorf("a batch of one DELETE took %d round trips, want 3", trips)
	}
	if !tx.Now.Equal(t0) || len(tx.Coverage.Holds) != 1 || *tx.Coverage.Holds[0].Scope != held || wal <= 0 || len(gate.watched) != 2 || gate.watched[1] == 0 {
		t.Errorf("now %v, holds %+v, WAL %v, watched %v; want the pinned now, the hold, the DELETE's WAL, the backend watched", tx.Now, tx.Coverage.Holds, wal, gate.watched)
	}
	if n := f.count(t, "consumer = 'free'"); n != 0 {
		t.Errorf("%d rows of the batch left: it did not commit", n)
	}
	// Its settings were the transaction's own: none is left on the
	// connection.
	var seqscan string
	if err := pool.QueryRow(ctx, "SELECT current_setting('enable_seqscan')").Scan(&seqscan); err != nil || seqscan != "on" {
		t.Errorf("enable_seqscan %q after the batch (%v), want on", seqscan, err)
	}
	// A transaction that failed does not commit: its COMMIT is a ROLLBACK.
	ptx, err := batchloop.Begin(ctx, pool, f.tables[0].Name, batchloop.TxOptions{Clock: service.At(t0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = ptx.Exec(ctx, "DELETE FROM public.consumer_inbox WHERE consumer = 'held'"); err != nil {
		t.Fatal(err)
	}
	if _, err := ptx.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 did not fail")
	}
	if _, err = ptx.Commit(ctx); err == nil {
		t.Error("the commit of a failed transaction succeeded")
	}
	ptx.Close(ctx, &err)
	if n := f.count(t, "consumer = 'held'"); n != 5 {
		t.Errorf("%d held rows left after a failed transaction, want 5", n)
	}
	// The watch is read before the caller's settings, which are for its
	// statement alone: under a sweep's, a seq scan costs 1e10 and is
	// compiled by JIT (25 to 300 ms a batch).
	order := &orderWatch{}
	otx, err := batchloop.Begin(ctx, pool, f.tables[0].Name, batchloop.TxOptions{Clock: service.At(t0), Settings: sweepSettingsSQL, Watch: order})
	if err != nil {
		t.Fatal(err)
	}
	otx.Close(ctx, &err)
	if order.seqscan != "on" {
		t.Errorf("the watch read enable_seqscan %q, want on: it ran after the caller's settings", order.seqscan)
	}
	// The runtime settings change: the next batch stops before its
	// statement, and its transaction is not left open.
	if _, err := settings.Write(ctx, f.pool, settings.Global, map[string]*string{"batch_size": new("1000")}, "test", func([]settings.Setting) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := batchloop.Begin(ctx, pool, f.tables[0].Name, batchloop.TxOptions{Clock: service.At(t0), Watch: watch}); !errors.Is(err, retry.ErrSettingsChanged) || !watch.Changed() {
		t.Errorf("Begin after a settings change: %v (changed %v), want %v", err, watch.Changed(), retry.ErrSettingsChanged)
	}
	var open int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'").Scan(&open); err != nil || open != 0 {
		t.Errorf("%d transactions left open (%v), want none", open, err)
	}
	if st := pool.Stat(); st.AcquiredConns() != 0 {
		t.Errorf("%d connections still taken after the batches", st.AcquiredConns())
	}
}
