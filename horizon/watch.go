package horizon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// WarnAfter is how long a holder may hold the horizon before a pass that
// deleted rows says so at warn: a minute of churn kept as dead tuples is
// what autovacuum's default naptime would keep anyway.
const WarnAfter = time.Minute

// Metrics are the horizon's metric: the age of its oldest holder of each
// kind, 0 when none holds it.
type Metrics struct {
	Age *prometheus.GaugeVec
}

// NewMetrics registers the metric on reg, every kind at 0.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Age: daemonmetrics.GaugeVec(reg, "inboxkeeper_xmin_horizon_age_seconds",
		"How long the oldest holder of each kind (backend, replication_slot, prepared_transaction, standby_feedback) has held the database's xmin horizon: "+
			"rows deleted since stay on disk until it lets go. A slot's or a standby's age counts from the first of the daemon's readings that its xmin predates. 0 when none holds it.", "kind")}
	for _, k := range Kinds {
		m.Age.WithLabelValues(k).Set(0)
	}
	return m
}

// Watch reads the holders for the daemon: it dates the transaction ids it
// sees handed out, exports the ages, and warns once per holder that holds
// the horizon longer than WarnAfter while the daemon deletes.
type Watch struct {
	q       Querier
	metrics *Metrics // may be nil
	log     *slog.Logger

	mu     sync.Mutex
	clock  xidClock
	warned map[string]bool // holders warned about, by identity
}

// NewWatch reads on q and exports to m (nil: nothing).
func NewWatch(q Querier, m *Metrics, log *slog.Logger) *Watch {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watch{q: q, metrics: m, log: log, warned: map[string]bool{}}
}

// Update reads the holders and exports their ages. With deleted (a pass
// deleted rows), a holder older than WarnAfter is named at warn, once.
func (w *Watch) Update(ctx context.Context, deleted bool) (Reading, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, err := read(ctx, w.q, &w.clock)
	if err != nil {
		return r, err
	}
	if w.metrics != nil {
		for _, k := range Kinds {
			v := 0.0
			if b, ok := r.Oldest(k); ok {
				v = b.Age.Seconds()
			}
			w.metrics.Age.WithLabelValues(k).Set(v)
		}
	}
	held := map[string]bool{}
	for _, b := range r.Blockers {
		id := identity(b)
		held[id] = true
		if deleted && b.Age > WarnAfter && !w.warned[id] {
			w.warned[id] = true
			w.log.Warn("inboxkeeper: the rows deleted cannot be reclaimed while this holds the xmin horizon: the table grows until it lets go",
				"kind", b.Kind, "holder", b.String(), "held_for", b.Age.Round(time.Second))
		}
	}
	for id := range w.warned {
		if !held[id] {
			delete(w.warned, id)
		}
	}
	return r, nil
}

// identity tells one holding apart from the next one of the same holder:
// a backend's transaction, a slot, a prepared transaction, a standby.
func identity(b Blocker) string {
	switch b.Kind {
	case Backend:
		return fmt.Sprintf("%s/%d/%s", b.Kind, b.PID, b.Since)
	case ReplicationSlot, PreparedTransaction:
		return b.Kind + "/" + b.Name
	}
	return b.Kind + "/" + b.Application + "/" + b.Client
}

// xidClock dates transaction ids: it keeps, from the readings, when the
// database's next transaction id was what. An xmin was handed out before
// the first reading whose next id is past it.
type xidClock struct {
	samples []xidSample
}

type xidSample struct {
	at   time.Time
	next int64
}

// xidSamples bounds the samples kept: when full, every other one goes, so
// the clock spans ever longer at coarser steps (at a reading every 5 s,
// 512 samples are 42 minutes before the first thinning).
const xidSamples = 512

func (c *xidClock) add(at time.Time, next int64) {
	if n := len(c.samples); n > 0 && c.samples[n-1].next >= next {
		return // nothing handed out since: the older sample dates it best
	}
	if len(c.samples) == xidSamples {
		kept := c.samples[:0]
		for i, s := range c.samples {
			if i%2 == 0 { // the first stays: the clock's span
				kept = append(kept, s)
			}
		}
		c.samples = kept
	}
	c.samples = append(c.samples, xidSample{at, next})
}

// since dates xid: it was handed out before the first sample whose next
// id is past it, so its holder has held it since before then (a lower
// bound of its age, by at most the time between two readings, or by all
// the time before the first one). Zero when no sample is past it: it was
// handed out after the last reading, and holds nothing back yet.
func (c *xidClock) since(xid int64) time.Time {
	for _, s := range c.samples {
		if s.next > xid {
			return s.at
		}
	}
	return time.Time{}
}
