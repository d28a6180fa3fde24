package partitions

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// Metrics are the partition manager's own metrics, and
// inboxkeeper_errors_total (daemonmetrics.Errors, one series per table with
// every other step's). CleanupLag and LastSuccess are shared with the row
// deleter (inboxkeeper_cleanup_lag_seconds,
// inboxkeeper_last_success_timestamp_seconds) and may be left nil.
type Metrics struct {
	Coverage  *daemonmetrics.Fact
	MaxExpiry *daemonmetrics.Fact
	Blocked   *daemonmetrics.Fact
	Count     *daemonmetrics.Fact
	Created   *prometheus.CounterVec
	Detached  *prometheus.CounterVec
	Dropped   *prometheus.CounterVec

	Errors      *prometheus.CounterVec // {table, kind}; may be nil
	CleanupLag  *daemonmetrics.Fact    // {table}
	LastSuccess *prometheus.GaugeVec   // {table}
}

// BlockedReasons are the values of the reason label of
// inboxkeeper_partitions_blocked.
var BlockedReasons = []string{"hold", "replay", "lock_timeout", "error", ReasonUntrusted}

// ReasonUntrusted is a record of inboxkeeper.partitions that the relation
// it names does not bear out (trust.go): never acted on.
const ReasonUntrusted = "untrusted_record"

// NewMetrics creates the metrics and registers them on reg; the per-table
// gauges measured belong to facts (nil: owners of their own).
func NewMetrics(reg prometheus.Registerer, facts *daemonmetrics.Facts) *Metrics {
	m := &Metrics{
		Coverage:  facts.Gauge(reg, "inboxkeeper_partition_coverage_seconds", "How far ahead of now the partitions reach without a gap: a row whose expiry column lies beyond now + this fails its insert (+Inf with a MAXVALUE partition).", "table"),
		MaxExpiry: facts.Gauge(reg, "inboxkeeper_partition_max_expiry_seconds", "partitions.max_expiry from the policy: the furthest ahead of now a new row's expiry column may be; coverage below it means inserts can fail.", "table"),
		Blocked:   facts.Gauge(reg, "inboxkeeper_partitions_blocked", "Partitions due for retirement that wait, by reason: hold, replay, lock_timeout (DDL gave up after its retries this pass), error, untrusted_record (a record of inboxkeeper.partitions that the relation it names does not bear out: never acted on).", "table", "reason"),
		Count:     facts.Gauge(reg, "inboxkeeper_partitions", "Partitions by state: attached, detach_pending (an interrupted DETACH CONCURRENTLY; never on a Citus table, whose plain DETACH commits or not at all), detached (waiting out detached_retention).", "table", "state"),
		Created:   daemonmetrics.CounterVec(reg, "inboxkeeper_partitions_created_total", "Partitions created ahead of time.", "table"),
		Detached:  daemonmetrics.CounterVec(reg, "inboxkeeper_partitions_detached_total", "Expired partitions detached (DETACH CONCURRENTLY, FINALIZE of an interrupted one, or a plain DETACH on a Citus table).", "table"),
		Dropped:   daemonmetrics.CounterVec(reg, "inboxkeeper_partitions_dropped_total", "Detached partitions dropped after detached_retention.", "table"),
		Errors:    daemonmetrics.Errors(reg),
	}
	return m
}
