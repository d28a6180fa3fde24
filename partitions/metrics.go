package partitions

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the partition manager's own metrics. Errors, CleanupLag and
// LastSuccess are shared with the row deleter (inboxkeeper_errors_total,
// inboxkeeper_cleanup_lag_seconds, inboxkeeper_last_success_timestamp_seconds)
// and may be left nil.
type Metrics struct {
	Coverage  *prometheus.GaugeVec
	MaxExpiry *prometheus.GaugeVec
	Blocked   *prometheus.GaugeVec
	Count     *prometheus.GaugeVec
	Created   *prometheus.CounterVec
	Detached  *prometheus.CounterVec
	Dropped   *prometheus.CounterVec

	Errors      *prometheus.CounterVec // {table, kind}
	CleanupLag  *prometheus.GaugeVec   // {table}
	LastSuccess *prometheus.GaugeVec   // {table}
}

// BlockedReasons are the values of the reason label of
// inboxkeeper_partitions_blocked.
var BlockedReasons = []string{"hold", "replay", "lock_timeout", "error"}

// States are the values of the state label of inboxkeeper_partitions.
var States = []string{"attached", "detach_pending", "detached"}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Coverage: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_partition_coverage_seconds",
			Help: "How far ahead of now the partitions reach without a gap: a row whose expiry column lies beyond now + this fails its insert (+Inf with a MAXVALUE partition).",
		}, []string{"table"}),
		MaxExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_partition_max_expiry_seconds",
			Help: "partitions.max_expiry from the policy: the furthest ahead of now a new row's expiry column may be; coverage below it means inserts can fail.",
		}, []string{"table"}),
		Blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_partitions_blocked",
			Help: "Partitions due for retirement that wait, by reason: hold, replay, lock_timeout (DDL gave up after its retries this pass), error.",
		}, []string{"table", "reason"}),
		Count: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_partitions",
			Help: "Partitions by state: attached, detach_pending (an interrupted DETACH CONCURRENTLY; never on a Citus table, whose plain DETACH commits or not at all), detached (waiting out detached_retention).",
		}, []string{"table", "state"}),
		Created: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_partitions_created_total",
			Help: "Partitions created ahead of time.",
		}, []string{"table"}),
		Detached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_partitions_detached_total",
			Help: "Expired partitions detached (DETACH CONCURRENTLY, FINALIZE of an interrupted one, or a plain DETACH on a Citus table).",
		}, []string{"table"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_partitions_dropped_total",
			Help: "Detached partitions dropped after detached_retention.",
		}, []string{"table"}),
	}
	reg.MustRegister(m.Coverage, m.MaxExpiry, m.Blocked, m.Count, m.Created, m.Detached, m.Dropped)
	return m
}
