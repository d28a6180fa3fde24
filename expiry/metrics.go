package expiry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// Metrics are the deleter's Prometheus metrics. Labels are table names from
// the policy file and fixed error kinds, so their number is bounded.
type Metrics struct {
	RowsDeleted   *prometheus.CounterVec
	Batches       *prometheus.CounterVec
	BatchDuration *prometheus.HistogramVec
	LastSuccess   *prometheus.GaugeVec
	CleanupLag    *daemonmetrics.Fact
	Errors        *prometheus.CounterVec
	BatchSize     *daemonmetrics.Fact
	RowsDue       *daemonmetrics.Fact
	RowsDueCapped *daemonmetrics.Fact
}

// NewMetrics creates the metrics and registers them on reg; the per-table
// gauges measured belong to facts (nil: owners of their own).
func NewMetrics(reg prometheus.Registerer, facts *daemonmetrics.Facts) *Metrics {
	m := &Metrics{
		RowsDeleted:   daemonmetrics.CounterVec(reg, "inboxkeeper_rows_deleted_total", "Expired inbox rows deleted.", "table"),
		Batches:       daemonmetrics.CounterVec(reg, "inboxkeeper_batches_total", "Delete batches committed that deleted at least one row.", "table"),
		BatchDuration: daemonmetrics.HistogramVec(reg, "inboxkeeper_batch_duration_seconds", "Wall time of one delete batch transaction, from BEGIN to COMMIT.", []float64{.005, .01, .025, .05, .1, .2, .5, 1, 2.5, 5, 10, 30}, "table"),
		LastSuccess:   daemonmetrics.GaugeVec(reg, "inboxkeeper_last_success_timestamp_seconds", "Unix time at which a pass last finished this table without error and without stopping early.", "table"),
		CleanupLag:    facts.Gauge(reg, "inboxkeeper_cleanup_lag_seconds", "Database now minus the oldest expiry still present among rows no hold or replay protects (0 when none is due).", "table"),
		Errors:        daemonmetrics.Errors(reg),
		BatchSize:     facts.Gauge(reg, "inboxkeeper_batch_size", "Rows the next delete batch may take (adapted toward INBOXKEEPER_BATCH_TARGET).", "table"),
		RowsDue:       facts.Gauge(reg, "inboxkeeper_rows_due", "Rows whose expiry has passed and that no hold or replay covers, counted exactly through the expiry index up to 1,000,000 (see inboxkeeper_rows_due_capped); refreshed after each pass, during long passes and between passes.", "table"),
		RowsDueCapped: facts.Gauge(reg, "inboxkeeper_rows_due_capped", "1 when inboxkeeper_rows_due stopped counting at its cap: more rows are due.", "table"),
	}
	return m
}
