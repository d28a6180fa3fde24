package vacuum

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/gatetest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The cost settings a pace sets: a cost unit a second for every walPerUnit
// bytes of paceShare of the standby's rate, in sleeps of 10 ms; stretched
// sleeps for a slow standby and shorter ones for a fast one; a boost only
// while the rate is a lower bound; and none at all for a standby too slow
// for the slowest pace PostgreSQL allows.
func TestPaceFor(t *testing.T) {
	measured := func(rate float64) service.WriterPace {
		return service.WriterPace{Rate: rate, Standby: "s", Measured: true}
	}
	for _, c := range []struct {
		name       string
		wp         service.WriterPace
		perUnit    float64
		boost      float64
		delay      time.Duration
		limit      int
		rate       float64
		notPacable bool
	}{
		{name: "4 MiB/s", wp: measured(4 << 20), delay: 10 * time.Millisecond, limit: 139, rate: 0.8 * (4 << 20)},
		{name: "learned", wp: measured(4 << 20), perUnit: 120, delay: 10 * time.Millisecond, limit: 279, rate: 0.8 * (4 << 20)},
		{name: "boosted while not measured", wp: service.WriterPace{Rate: 1 << 20, Standby: "s"}, boost: 4, delay: 10 * time.Millisecond, limit: 139, rate: 0.8 * (4 << 20)},
		{name: "no boost once measured", wp: measured(1 << 20), boost: 4, delay: 10 * time.Millisecond, limit: 34, rate: 0.8 * (1 << 20)},
		{name: "slow: longer sleeps", wp: measured(256 << 10), delay: 25200 * time.Microsecond, limit: 22, rate: 0.8 * (256 << 10)},
		{name: "fast: shorter sleeps", wp: measured(1 << 30), delay: 2790 * time.Microsecond, limit: maxCostLimit, rate: 0.8 * (1 << 30)},
		{name: "too slow to pace", wp: measured(2 << 10), notPacable: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ok := PaceFor(c.wp, c.perUnit, c.boost)
			if ok == c.notPacable {
				t.Fatalf("PaceFor: ok %v, want %v (%+v)", ok, !c.notPacable, p)
			}
			if c.notPacable {
				return
			}
			if p.Delay != c.delay || p.Limit != c.limit || math.Abs(p.Rate-c.rate) > 1 {
				t.Errorf("pace %+v, want vacuum_cost_delay %s, vacuum_cost_limit %d, %.0f B/s", p, c.delay, c.limit, c.rate)
			}
			// What the settings let through is the rate asked for, within
			// the rounding of the limit down and of the delay.
			if got := p.UnitsPerSecond() * p.PerUnit; got > 1.01*p.Rate || got < 0.9*p.Rate {
				t.Errorf("the settings let %.0f B/s through, want about %.0f", got, p.Rate)
			}
		})
	}
}

// pacing is a throttle with a standby that applies rate: PaceWriter says
// so (and counts its calls), Overrun says why to stop once stop is set.
type pacing struct {
	gatetest.Held
	wp    service.WriterPace
	calls atomic.Int32
	mu    sync.Mutex
	stop  string
}

func (p *pacing) Admit(context.Context, service.Sizer) (int, error) { return 0, nil }
func (p *pacing) PaceWriter(context.Context) (service.WriterPace, error) {
	p.calls.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wp, nil
}
func (p *pacing) Overrun() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stop
}

// pacedTable is a table of 100,000 rows of which half are deleted, in a
// cluster of the test's own with full-page writes on, as in production:
// the WAL it measures is the VACUUM's alone.
func pacedTable(t *testing.T) (*pgxpool.Pool, *catalog.Table) {
	t.Helper()
	c := pgtest.NewClusterWith(t, map[string]string{"full_page_writes": "on", "autovacuum": "off"})
	cfg, err := pgxpool.ParseConfig(c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // the settings' reset is seen on the VACUUM's own session
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pgtest.Exec(t, pool, pgtest.ShortInboxDDL)
	pgtest.Exec(t, pool, `INSERT INTO public.consumer_inbox SELECT 'c', md5(i::text), now(), now() + i * interval '1 second' FROM generate_series(1, 100000) i`)
	pgtest.Exec(t, pool, "CHECKPOINT")
	pgtest.Exec(t, pool, "DELETE FROM public.consumer_inbox WHERE remember_until < now() + interval '50000 seconds'")
	return pool, pgtest.Resolve(t, pool, pgtest.ShortInboxPolicy)[0]
}

func insertLSN(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var lsn string
	if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

func walSince(t *testing.T, pool *pgxpool.Pool, lsn string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::int8", lsn).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPacedVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newMetrics := func() *Metrics { return NewMetrics(prometheus.NewRegistry(), daemonmetrics.NewFacts()) }

	// A standby that applies 2 MiB/s: the VACUUM writes its WAL no faster
	// (unpaced, the same VACUUM writes it in a few hundred milliseconds,
	// tens of MiB/s), and leaves its session's settings as it found them.
	t.Run("keeps to the standby's rate", func(t *testing.T) {
		t.Parallel()
		pool, tbl := pacedTable(t)
		const rate = 2 << 20
		m := newMetrics()
		v := New(pool, Options{Base: service.Base{Throttle: &pacing{wp: service.WriterPace{Rate: rate, Window: rate * 0.4, Standby: "s", Measured: true}}}, DeadRatio: 0.1, Metrics: m})
		lsn := insertLSN(t, pool)
		start := time.Now()
		out := v.AfterPass(ctx, tbl, 50000, 50000, 0)
		took := time.Since(start)
		wal := walSince(t, pool, lsn)
		if !out.Ran || out.Pace == nil || out.Err != nil {
			t.Fatalf("outcome %+v, want a paced VACUUM", out)
		}
		t.Logf("%d bytes of WAL in %s, paced %s", wal, took.Round(time.Millisecond), out.Pace)
		if got := float64(wal) / took.Seconds(); got > rate || wal < 1<<20 {
			t.Errorf("the VACUUM wrote %d bytes of WAL in %s: %.0f B/s, want at least 1 MiB and at most the standby's %d B/s", wal, took, got, rate)
		}
		if got := testutil.ToFloat64(m.Pacing.WithLabelValues(tbl.Name, "paced")); got != 1 {
			t.Errorf("inboxkeeper_vacuum_pacing_total{outcome=\"paced\"} %v, want 1", got)
		}
		var delay, limit, dirty string
		if err := pool.QueryRow(ctx, "SELECT current_setting('vacuum_cost_delay'), current_setting('vacuum_cost_limit'), current_setting('vacuum_cost_page_dirty')").Scan(&delay, &limit, &dirty); err != nil {
			t.Fatal(err)
		}
		if delay != "0" || limit != "200" || dirty != "20" {
			t.Errorf("after the VACUUM its session has vacuum_cost_delay %s, vacuum_cost_limit %s, vacuum_cost_page_dirty %s; want the defaults 0, 200, 20", delay, limit, dirty)
		}
		if v.perUnit[tbl.Name] <= 0 {
			t.Error("nothing learned from a VACUUM that wrote over 1 MiB")
		}
	})

	// A standby that falls behind anyway (Overrun says why): the VACUUM
	// is cancelled within moments, started again after the standby has
	// caught up (PaceWriter) at half the pace, twice, and then left to
	// the next pass, saying why.
	t.Run("stopped when the standby falls behind", func(t *testing.T) {
		t.Parallel()
		pool, tbl := pacedTable(t)
		th := &pacing{wp: service.WriterPace{Rate: 64 << 10, Window: 256 << 10, Standby: "s"}, stop: "standby s is far behind"}
		m := newMetrics()
		v := New(pool, Options{Base: service.Base{Throttle: th}, DeadRatio: 0.1, Metrics: m})
		start := time.Now()
		out := v.AfterPass(ctx, tbl, 50000, 50000, 0)
		if out.Ran || out.Stopped != maxStops+1 || !strings.Contains(out.NotRun, "standby s is far behind") {
			t.Fatalf("outcome %+v, want %d VACUUMs stopped and none run", out, maxStops+1)
		}
		// Unmeasured, the standby's rate was boosted 4x, then 2x, then 1x.
		if out.Pace == nil || out.Pace.Boost != 1 || th.calls.Load() != maxStops+1 {
			t.Errorf("last pace %+v after %d paces asked, want the boost halved down to 1", out.Pace, th.calls.Load())
		}
		// Stopped at its first check, not at the end of a VACUUM paced at
		// 64 KiB/s.
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("three stopped VACUUMs took %s", took)
		}
		if got := testutil.ToFloat64(m.Pacing.WithLabelValues(tbl.Name, "stopped")); got != maxStops+1 {
			t.Errorf("inboxkeeper_vacuum_pacing_total{outcome=\"stopped\"} %v, want %d", got, maxStops+1)
		}
		// Measured, the next pass's first attempt goes at half the pace
		// of its last (twice the WAL a cost unit).
		th.mu.Lock()
		th.stop, th.wp = "", service.WriterPace{Rate: 64 << 20, Window: 16 << 20, Standby: "s", Measured: true}
		th.mu.Unlock()
		if out := v.AfterPass(ctx, tbl, 0, 50000, 50000); out.Pace == nil || out.Pace.PerUnit != 2*walPerUnit {
			t.Errorf("next pass's pace %+v, want %d bytes a unit", out.Pace, 2*walPerUnit)
		}
	})

	// A session that queues behind the VACUUM's lock gets it cancelled,
	// as it gets a batch cancelled (the throttle's lock watch, here a
	// stand-in that cancels it once it runs), and it is not started again
	// in the pass: the session would queue again.
	t.Run("a session queued behind it", func(t *testing.T) {
		t.Parallel()
		pool, tbl := pacedTable(t)
		other, err := pgxpool.New(ctx, pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		th := &queuedBehind{pacing: pacing{wp: service.WriterPace{Rate: 64 << 10, Window: 256 << 10, Standby: "s", Measured: true}}, pool: other, t: t}
		out := New(pool, Options{Base: service.Base{Throttle: th}, DeadRatio: 0.1}).AfterPass(ctx, tbl, 50000, 50000, 0)
		if out.Ran || out.Stopped != 1 || !strings.Contains(out.NotRun, "queued behind") || th.calls.Load() != 1 {
			t.Errorf("outcome %+v after %d paces asked, want one VACUUM stopped for the session queued behind it, not started again", out, th.calls.Load())
		}
	})

	// Behind a transaction pooler a session's cost settings may reach
	// another server connection than the VACUUM's: while a standby
	// streams, the VACUUM is passed over, and autovacuum keeps the table.
	t.Run("passed over behind a pooler", func(t *testing.T) {
		t.Parallel()
		_, tbl, url := setupURL(t, 5000)
		bouncer, err := pgxpool.New(ctx, pgtest.BouncerURL(t, pgtest.NewBouncer(t), url))
		if err != nil {
			t.Fatal(err)
		}
		defer bouncer.Close()
		m := newMetrics()
		v := New(bouncer, Options{Base: service.Base{Throttle: &pacing{wp: service.WriterPace{Rate: 1 << 20, Window: 1 << 20, Standby: "s", Measured: true}}}, DeadRatio: 0.1, Metrics: m})
		out := v.AfterPass(ctx, tbl, 5000, 5000, 0)
		if out.Ran || !strings.Contains(out.NotRun, "passed over for the standby") || !strings.Contains(out.NotRun, "pooler") {
			t.Errorf("outcome %+v, want passed over for the standby behind a pooler", out)
		}
		if got := testutil.ToFloat64(m.Pacing.WithLabelValues(tbl.Name, "passed_over")); got != 1 {
			t.Errorf("inboxkeeper_vacuum_pacing_total{outcome=\"passed_over\"} %v, want 1", got)
		}
		// Without a standby it runs, unpaced, as before; and a session
		// queued behind it gets it cancelled, as without a pooler. The
		// watch must find the VACUUM's server process: the process id the
		// connection was told is the pooler's own (before, the watch was
		// given that one, and never saw the VACUUM).
		other, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		db := pgx.Identifier{other.Config().ConnConfig.Database}.Sanitize()
		pgtest.Exec(t, other, "ALTER DATABASE "+db+" SET vacuum_cost_delay = '50ms'; ALTER DATABASE "+db+" SET vacuum_cost_limit = 1")
		// A pooler of its own: server connections that start with the slow
		// VACUUM settings.
		slow, err := pgxpool.New(ctx, pgtest.BouncerURL(t, pgtest.NewBouncer(t), url))
		if err != nil {
			t.Fatal(err)
		}
		defer slow.Close()
		th := &queuedBehind{pacing: pacing{wp: service.WriterPace{Rate: math.Inf(1), Window: math.Inf(1)}}, pool: other, t: t}
		if out := New(slow, Options{Base: service.Base{Throttle: th}, DeadRatio: 0.1}).AfterPass(ctx, tbl, 5000, 5000, 0); out.Ran || out.Stopped != 1 || !strings.Contains(out.NotRun, "queued behind") {
			t.Errorf("outcome %+v through a pooler, want the VACUUM stopped for the session queued behind it", out)
		}
		pgtest.Exec(t, other, "ALTER DATABASE "+db+" RESET vacuum_cost_delay; ALTER DATABASE "+db+" RESET vacuum_cost_limit")
		// Without a standby it runs, unpaced, as before.
		v = New(bouncer, Options{Base: service.Base{Throttle: &pacing{wp: service.WriterPace{Rate: math.Inf(1), Window: math.Inf(1)}}}, DeadRatio: 0.1})
		if out := v.AfterPass(ctx, tbl, 5000, 5000, 0); !out.Ran || out.Pace != nil {
			t.Errorf("outcome %+v with no standby, want an unpaced VACUUM", out)
		}
	})
}

// queuedBehind is a throttle whose lock watch finds a session queued
// behind the VACUUM it watches: it cancels the VACUUM once it runs.
type queuedBehind struct {
	pacing
	pool    *pgxpool.Pool
	t       *testing.T
	blocked atomic.Bool
}

func (q *queuedBehind) Watch(pid uint32, _ time.Time) (func(), func() bool) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var cancelled bool
			if err := q.pool.QueryRow(context.Background(), `SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'VACUUM%' AND state = 'active'`, int32(pid)).Scan(&cancelled); err == nil && cancelled {
				q.blocked.Store(true)
				return
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		q.t.Errorf("the VACUUM of backend %d never ran", pid)
	}()
	// done waits for the watcher, as the throttle's blocked is set before
	// it cancels: a cancel it sent is then always counted.
	return func() { close(done); <-finished }, q.blocked.Load
}
