package tiering

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// Metrics are the tiering metrics. Labels are table names from the policy
// file and the fixed tier names, so their number is bounded.
type Metrics struct {
	// RowsDemoted counts rows by the tier they went to: warm (payload
	// demoted) and permanent (a permanent key written as the row was
	// deleted).
	RowsDemoted *prometheus.CounterVec
	// TierRows estimates the rows in each tier: hot, warm and permanent.
	TierRows *daemonmetrics.Fact
	// Errors is inboxkeeper_errors_total{table,kind}, one series per table
	// with every other step's (daemonmetrics.Errors).
	Errors *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg; the per-table
// gauges measured belong to facts (nil: owners of their own).
func NewMetrics(reg prometheus.Registerer, facts *daemonmetrics.Facts) *Metrics {
	m := &Metrics{
		RowsDemoted: daemonmetrics.CounterVec(reg, "inboxkeeper_rows_demoted_total", "Rows demoted, by the tier they went to: warm (payload emptied or its side-table row deleted), permanent (a permanent key written as the row was deleted).", "table", "tier"),
		TierRows:    facts.Gauge(reg, "inboxkeeper_tier_rows", "Estimated rows per tier (hot, warm, permanent), from the planner's statistics.", "table", "tier"),
		Errors:      daemonmetrics.Errors(reg),
	}
	return m
}
