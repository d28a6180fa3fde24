package throttle

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// The signal registry. A signal is one file of this package that
// registers, from init, every reason kind its readings carry (kind): what
// it measures and how often (collectors, or a verdict read at Check time),
// whether a pause for it means a backlog of WAL, its metric and how its
// readings read in status. Adding a signal is that file, its setting in
// internal/platform/config (a threshold runtime settings change goes in
// config.Limits), and its row in docs/guides/throttle.md. Kinds register
// in file name order: the order of Kinds, and of the readings Check adds
// from the clock.

// kind is one reason kind: a value of the reason label of
// inboxkeeper_throttled.
type kind struct {
	name string
	// backlog: a pause for it means WAL piles up somewhere, and halves the
	// next batch (the signals see WAL only after it was written).
	backlog bool
	// poll, when set, measures it every interval on a ticker of its own
	// while the throttle is awake (cadence.go), while on (nil: always) says
	// t's settings ask for it.
	poll     func(t *Throttler, ctx context.Context)
	interval time.Duration
	on       func(t *Throttler) bool
	// idle, when set, says whether the poll goes on between passes too
	// (every idleEvery): for the gauges of a subject that exists.
	idle func(t *Throttler) bool
	// sparse, when set, says the last reading found nothing to measure (no
	// standby streams, no slot): the poll then only looks for one, every
	// discoverEvery, while awake.
	sparse func(t *Throttler) bool
	// collectors, when set, are what measures it instead: one per subject
	// configured (the listed standbys).
	collectors func(t *Throttler) []*collector
	// verdict, when set, is a reading taken at Check time from the clock
	// or the throttle's state (no I/O): ok when it throttles.
	verdict func(t *Throttler, now time.Time) (r Reading, ok bool)
	// gauge, when set, exports every reading of this kind by subject.
	gauge *gauge
	// export, when set, exports a reading (gone: no longer measured) some
	// other way.
	export func(m *Metrics, r Reading, gone bool)
	// counter, when set, is a counter of events of this kind.
	counter *counter
	// format, when set, is how a reading without a unit reads after the
	// kind and subject in status and logs.
	format func(r Reading) string
}

type gauge struct{ name, help, label string }

type counter struct{ name, help string }

var registry []*kind

// register adds a kind; a file registers its kinds from init.
func register(k kind) {
	if kindNamed(k.name) != nil {
		panic("throttle: kind " + k.name + " registered twice")
	}
	registry = append(registry, &k)
}

func kindNamed(name string) *kind {
	for _, k := range registry {
		if k.name == name {
			return k
		}
	}
	return nil
}

// Kinds lists every signal kind, for metrics that must show zeros too.
func Kinds() []string {
	out := make([]string, len(registry))
	for i, k := range registry {
		out[i] = k.name
	}
	return out
}

func (t *Throttler) collectors() []*collector {
	var cs []*collector
	for _, k := range registry {
		switch {
		case k.collectors != nil:
			cs = append(cs, k.collectors(t)...)
		case k.poll != nil && (k.on == nil || k.on(t)):
			c := &collector{interval: k.interval, run: func(ctx context.Context) { k.poll(t, ctx) }}
			if k.idle != nil {
				c.idle = func() bool { return k.idle(t) }
			}
			if k.sparse != nil {
				c.sparse = func() bool { return k.sparse(t) }
			}
			cs = append(cs, c)
		}
	}
	return cs
}

// Start measures every signal once, then keeps measuring in the background
// until Stop: awake, as for a pass, until the first Idle. The first
// reading runs in the background too, beside what a pass reads before its
// first batch (the count, the sample): Check and Wait wait for it, so the
// first batch is still checked against every signal (a `once` waited for
// its seven round trips before it even counted).
func (t *Throttler) Start(ctx context.Context) {
	ctx, t.cancel = context.WithCancel(ctx)
	cs := append(t.collectors(), &collector{interval: keepAliveEvery, run: t.keepAlive})
	first := make(chan struct{})
	t.mu.Lock()
	t.cs, t.awake, t.first = cs, true, first
	t.mu.Unlock()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if len(t.cfg.ReplicaURLs) > 0 {
			// A first heartbeat before the first reading, so a healthy
			// standby is not reported as lagging for lack of one.
			t.writeHeartbeat(ctx)
		}
		for _, c := range cs {
			c.measure(ctx)
		}
		citus := t.citusLockWaits(ctx)
		defer close(first)
		// Stopped during the first reading (a `once` with nothing due):
		// nothing more to start, and nothing for Stop to cancel mid-query.
		t.mu.Lock()
		stopping := t.stopping
		t.mu.Unlock()
		if stopping {
			for _, c := range cs {
				if c.close != nil {
					c.close()
				}
			}
			return
		}
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.watchLocks(ctx, citus) }()
		for _, c := range cs {
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				if c.close != nil {
					defer c.close()
				}
				t.poll(ctx, c)
			}()
		}
	}()
}

// firstReading is closed when Start's first reading of every signal is
// done; nil before Start (status: MeasureOnce).
func (t *Throttler) firstReading() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.first
}

// Stop ends the collectors and waits for them. It lets the first reading
// finish rather than cancel it, and the collectors that would start after
// it do not: a statement stopped by its context costs a cancel request
// and pgx's 100 ms wait after it, more than the reading.
func (t *Throttler) Stop() {
	t.mu.Lock()
	t.stopping = true
	first := t.first
	t.mu.Unlock()
	if first != nil {
		<-first
	}
	if t.cancel != nil {
		t.cancel()
	}
	t.wg.Wait()
}

// MeasureOnce takes one reading of every signal without starting anything
// and without writing (no heartbeat: a listed standby's lag is as of the
// last beat a running daemon wrote): what `inboxkeeper status` shows. When a standby streams, it then reads
// pg_stat_replication for another trailSpan, so that its apply rate is
// measured (or at least its recent progress).
func (t *Throttler) MeasureOnce(ctx context.Context) {
	for _, c := range t.collectors() {
		if c.writes {
			continue
		}
		c.measure(ctx)
		if c.close != nil {
			c.close()
		}
	}
	if len(t.Paces()) == 0 {
		return
	}
	tick := time.NewTicker(statsInterval)
	defer tick.Stop()
	end := time.After(trailSpan)
	for {
		select {
		case <-ctx.Done():
			return
		case <-end:
			return
		case <-tick.C:
			t.measureWalsenders(ctx)
		}
	}
}

// keepAlive pings the primary while the deleter may be waiting (every
// keepAliveEvery while awake), so that a long pause does not end with a
// dead idle connection.
func (t *Throttler) keepAlive(ctx context.Context) { _ = t.pool.Ping(ctx) }

// queryRows runs sql on the pool and reads every row into a T with scan.
// The error is the query's or the first a row met (pgx.CollectRows checks
// rows.Err): a read that breaks off part-way is a failed read, never a
// short one.
func queryRows[T any](ctx context.Context, pool *pgxpool.Pool, sql string, scan func(row pgx.CollectableRow, v *T) error, args ...any) ([]T, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (T, error) {
		var v T
		err := scan(row, &v)
		return v, err
	})
}

// recorded notes in the failure log how a read or write of signal went,
// and says whether its caller goes on with the result: not when ctx ended
// meanwhile (shutting down is no failure), nor when it failed.
func (t *Throttler) recorded(ctx context.Context, signal string, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		t.fails.failed(signal, err)
		return false
	}
	t.fails.ok(signal)
	return true
}

// readFailed fails closed on a read of the primary's views: a reading of
// kind that throttles.
func (t *Throttler) readFailed(kind, signal string, err error) {
	t.fails.failed(signal, err)
	t.set(Reading{Kind: kind, Subject: signal, Value: unknown, Threshold: 0, Detail: "cannot read: " + err.Error()})
}

// Metrics are the throttle's Prometheus metrics: the verdict, the WAL
// window, and each signal's own.
type Metrics struct {
	Throttled        *prometheus.GaugeVec
	ThrottledSeconds *prometheus.CounterVec
	WALWindow        prometheus.Gauge
	ApplyRate        *prometheus.GaugeVec
	gauges           map[string]*prometheus.GaugeVec // by metric name
	counters         map[string]prometheus.Counter   // by kind
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Throttled:        daemonmetrics.GaugeVec(reg, "inboxkeeper_throttled", "1 while the deleter waits because of this reason (the first signal over its threshold), else 0.", "reason"),
		ThrottledSeconds: daemonmetrics.CounterVec(reg, "inboxkeeper_throttled_seconds_total", "Seconds the deleter spent waiting, by reason.", "reason"),
		WALWindow:        daemonmetrics.Gauge(reg, "inboxkeeper_wal_window_bytes", "The WAL window of the tightest streaming standby at the last batch: a batch starts only when the bytes it has not replayed plus the batch's predicted WAL fit in it. 0 when no standby streams."),
		ApplyRate:        daemonmetrics.GaugeVec(reg, "inboxkeeper_replica_apply_rate_bytes_per_second", "A streaming standby's apply rate (walsender NAME), measured from replay_lsn progress while it has a backlog; a lower bound from its recent progress until then.", "replica"),
		gauges:           map[string]*prometheus.GaugeVec{},
		counters:         map[string]prometheus.Counter{},
	}
	for _, k := range registry {
		m.Throttled.WithLabelValues(k.name).Set(0)
		m.ThrottledSeconds.WithLabelValues(k.name).Add(0)
		if g := k.gauge; g != nil {
			m.gauges[g.name] = daemonmetrics.GaugeVec(reg, g.name, g.help, g.label)
		}
		if c := k.counter; c != nil {
			m.counters[k.name] = daemonmetrics.Counter(reg, c.name, c.help)
		}
	}
	return m
}

// gauge is the gauge a kind's readings go to, by its metric name.
func (m *Metrics) gauge(name string) *prometheus.GaugeVec { return m.gauges[name] }

// count counts an event of kind.
func (m *Metrics) count(kind string) {
	if m != nil {
		m.counters[kind].Inc()
	}
}

// export exports a reading of a registered kind, or forgets it (gone).
func (m *Metrics) export(r Reading, gone bool) {
	k := kindNamed(r.Kind)
	switch {
	case k == nil:
	case k.export != nil:
		k.export(m, r, gone)
	case k.gauge != nil && gone:
		m.gauges[k.gauge.name].DeleteLabelValues(r.Subject)
	case k.gauge != nil:
		m.gauges[k.gauge.name].WithLabelValues(r.Subject).Set(r.Value)
	}
}

// paces exports the apply rates of the streaming standbys, and only theirs.
func (m *Metrics) paces(ps []Pace) {
	m.ApplyRate.Reset()
	for _, p := range ps {
		m.ApplyRate.WithLabelValues("walsender " + p.Standby).Set(p.ApplyRate)
	}
}
