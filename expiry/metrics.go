package expiry

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the deleter's Prometheus metrics. Labels are table names from
// the policy file and fixed error kinds, so their number is bounded.
type Metrics struct {
	RowsDeleted   *prometheus.CounterVec
	Batches       *prometheus.CounterVec
	BatchDuration *prometheus.HistogramVec
	LastSuccess   *prometheus.GaugeVec
	CleanupLag    *prometheus.GaugeVec
	Errors        *prometheus.CounterVec
	BatchSize     *prometheus.GaugeVec
	RowsDue       *prometheus.GaugeVec
	RowsDueCapped *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		RowsDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_rows_deleted_total",
			Help: "Expired inbox rows deleted.",
		}, []string{"table"}),
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_batches_total",
			Help: "Delete batches committed.",
		}, []string{"table"}),
		BatchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inboxkeeper_batch_duration_seconds",
			Help:    "Wall time of one delete batch transaction, from BEGIN to COMMIT.",
			Buckets: []float64{.005, .01, .025, .05, .1, .2, .5, 1, 2.5, 5, 10, 30},
		}, []string{"table"}),
		LastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_last_success_timestamp_seconds",
			Help: "Unix time at which a pass last finished this table without error and without stopping early.",
		}, []string{"table"}),
		CleanupLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_cleanup_lag_seconds",
			Help: "Database now minus the oldest expiry still present among rows no hold or replay protects (0 when none is due).",
		}, []string{"table"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_errors_total",
			Help: "Errors by kind: lock_timeout, deadlock, statement_timeout, serialization, connection, lock_wait, other.",
		}, []string{"table", "kind"}),
	}
	m.BatchSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inboxkeeper_batch_size",
		Help: "Rows the next delete batch may take (adapted toward INBOXKEEPER_BATCH_TARGET).",
	}, []string{"table"})
	m.RowsDue = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inboxkeeper_rows_due",
		Help: "Rows whose expiry has passed and that no hold or replay covers, counted exactly through the expiry index up to 1,000,000 (see inboxkeeper_rows_due_capped); refreshed after each pass, during long passes and between passes.",
	}, []string{"table"})
	m.RowsDueCapped = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inboxkeeper_rows_due_capped",
		Help: "1 when inboxkeeper_rows_due stopped counting at its cap: more rows are due.",
	}, []string{"table"})
	reg.MustRegister(m.RowsDeleted, m.Batches, m.BatchDuration, m.LastSuccess, m.CleanupLag, m.Errors, m.BatchSize, m.RowsDue, m.RowsDueCapped)
	return m
}
