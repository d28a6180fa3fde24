package compact

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// Metrics are the compaction's metrics, and each ordinary table's space
// as facts (measured at scrape time by Collector, and by every
// compaction).
type Metrics struct {
	HeapBytes *daemonmetrics.Fact
	LiveBytes *daemonmetrics.Fact
	RowsMoved *prometheus.CounterVec
	Truncated *prometheus.CounterVec
	// Errors is inboxkeeper_errors_total{table,kind}, one series per table
	// with every other step's (daemonmetrics.Errors); may be nil.
	Errors *prometheus.CounterVec
}

// NewMetrics registers them on reg; the sizes are facts of facts.
func NewMetrics(reg prometheus.Registerer, facts *daemonmetrics.Facts) *Metrics {
	return &Metrics{
		HeapBytes: facts.Gauge(reg, "inboxkeeper_table_heap_bytes",
			"Size of an ordinary table's heap (its main fork, pg_relation_size), as last measured.", "table"),
		LiveBytes: facts.Gauge(reg, "inboxkeeper_table_live_bytes",
			"Heap size the table's live rows would fill packed at its fillfactor (estimated from its statistics); the heap beyond it is what compaction would give back.", "table"),
		RowsMoved: daemonmetrics.CounterVec(reg, "inboxkeeper_compaction_rows_moved_total",
			"Rows compaction moved from the end of the table's heap into free space before it (each an UPDATE that changes no value).", "table"),
		Truncated: daemonmetrics.CounterVec(reg, "inboxkeeper_compaction_truncated_bytes_total",
			"Bytes compaction's VACUUMs cut off the end of the table's heap and gave back to the operating system.", "table"),
		Errors: daemonmetrics.Errors(reg),
	}
}

// Observe exports table's space.
func (m *Metrics) Observe(table string, sp Space) {
	m.HeapBytes.Set(float64(sp.HeapBytes()), table)
	m.LiveBytes.Set(float64(sp.LiveBytes()), table)
}

// Collector measures the space of every ordinary table.
type Collector struct {
	daemonmetrics.TableCollector
	q catalog.Querier
	m *Metrics
}

// NewCollector measures on q into m.
func NewCollector(q catalog.Querier, m *Metrics, log *slog.Logger) *Collector {
	return &Collector{TableCollector: daemonmetrics.TableCollector{What: "compact: measure the space of the table", Log: log}, q: q, m: m}
}

// Update measures every table of tables that is neither partitioned nor
// distributed. A table that cannot be measured is logged and keeps what it
// had; the error is ctx's.
func (c *Collector) Update(ctx context.Context, tables []*catalog.Table) error {
	return c.Each(ctx, tables, func(t *catalog.Table) error {
		if t.Partitioned() || t.ThroughCitus() {
			return nil
		}
		sp, err := Measure(ctx, c.q, t)
		if err == nil {
			c.m.Observe(t.Name, sp)
		}
		return err
	})
}
