package throttle

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
)

// Metrics are the throttle's Prometheus metrics.
type Metrics struct {
	Throttled         *prometheus.GaugeVec
	ThrottledSeconds  *prometheus.CounterVec
	ReplicaLagSeconds *prometheus.GaugeVec
	ReplicaLagBytes   *prometheus.GaugeVec
	SlotLagBytes      *prometheus.GaugeVec
	LockWaits         prometheus.Counter
	WALWindow         prometheus.Gauge
	ApplyRate         *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Throttled:         daemonmetrics.GaugeVec(reg, "inboxkeeper_throttled", "1 while the deleter waits because of this reason (the first signal over its threshold), else 0.", "reason"),
		ThrottledSeconds:  daemonmetrics.CounterVec(reg, "inboxkeeper_throttled_seconds_total", "Seconds the deleter spent waiting, by reason.", "reason"),
		ReplicaLagSeconds: daemonmetrics.GaugeVec(reg, "inboxkeeper_replica_lag_seconds", "Apply lag of a standby: from the heartbeat for listed standbys (host:port), replay_lag for the others (walsender NAME). +Inf when unknown.", "replica"),
		ReplicaLagBytes:   daemonmetrics.GaugeVec(reg, "inboxkeeper_replica_lag_bytes", "WAL bytes between the primary's current position and a standby's replay position (pg_stat_replication).", "replica"),
		SlotLagBytes:      daemonmetrics.GaugeVec(reg, "inboxkeeper_slot_lag_bytes", "WAL bytes between the primary's current position and a logical slot's confirmed_flush_lsn.", "slot"),
		LockWaits:         daemonmetrics.Counter(reg, "inboxkeeper_lock_waits_total", "Batches cancelled because another session waited on a lock they held."),
		WALWindow:         daemonmetrics.Gauge(reg, "inboxkeeper_wal_window_bytes", "The WAL window of the tightest streaming standby at the last batch: a batch starts only when the bytes it has not replayed plus the batch's predicted WAL fit in it. 0 when no standby streams."),
		ApplyRate:         daemonmetrics.GaugeVec(reg, "inboxkeeper_replica_apply_rate_bytes_per_second", "A streaming standby's apply rate (walsender NAME), measured from replay_lsn progress while it has a backlog; a lower bound from its recent progress until then.", "replica"),
	}
	for _, k := range Kinds {
		m.Throttled.WithLabelValues(k).Set(0)
		m.ThrottledSeconds.WithLabelValues(k).Add(0)
	}
	return m
}

func (m *Metrics) observe(r Reading) {
	switch r.Kind {
	case ReplicaLag:
		m.ReplicaLagSeconds.WithLabelValues(r.Subject).Set(r.Value)
	case ReplicaLagBytes:
		m.ReplicaLagBytes.WithLabelValues(r.Subject).Set(r.Value)
	case SlotLag:
		m.SlotLagBytes.WithLabelValues(r.Subject).Set(r.Value)
	case ReplicaUnreachable:
		if r.Value > 0 && r.Subject != readStatReplication {
			m.ReplicaLagSeconds.WithLabelValues(r.Subject).Set(math.Inf(1))
		}
	}
}

func (m *Metrics) forget(r Reading) {
	switch r.Kind {
	case ReplicaLag:
		m.ReplicaLagSeconds.DeleteLabelValues(r.Subject)
	case ReplicaLagBytes:
		m.ReplicaLagBytes.DeleteLabelValues(r.Subject)
	case SlotLag:
		m.SlotLagBytes.DeleteLabelValues(r.Subject)
	}
}

// paces exports the apply rates of the streaming standbys, and only theirs.
func (m *Metrics) paces(ps []Pace) {
	m.ApplyRate.Reset()
	for _, p := range ps {
		m.ApplyRate.WithLabelValues("walsender " + p.Standby).Set(p.ApplyRate)
	}
}
