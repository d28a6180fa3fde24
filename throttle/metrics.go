package throttle

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
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
		Throttled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_throttled",
			Help: "1 while the deleter waits because of this reason (the first signal over its threshold), else 0.",
		}, []string{"reason"}),
		ThrottledSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_throttled_seconds_total",
			Help: "Seconds the deleter spent waiting, by reason.",
		}, []string{"reason"}),
		ReplicaLagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_replica_lag_seconds",
			Help: "Apply lag of a standby: from the heartbeat for listed standbys (host:port), replay_lag for the others (walsender NAME). +Inf when unknown.",
		}, []string{"replica"}),
		ReplicaLagBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_replica_lag_bytes",
			Help: "WAL bytes between the primary's current position and a standby's replay position (pg_stat_replication).",
		}, []string{"replica"}),
		SlotLagBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_slot_lag_bytes",
			Help: "WAL bytes between the primary's current position and a logical slot's confirmed_flush_lsn.",
		}, []string{"slot"}),
		LockWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inboxkeeper_lock_waits_total",
			Help: "Batches cancelled because another session waited on a lock they held.",
		}),
		WALWindow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_wal_window_bytes",
			Help: "The WAL window of the tightest streaming standby at the last batch: a batch starts only when the bytes it has not replayed plus the batch's predicted WAL fit in it. 0 when no standby streams.",
		}),
		ApplyRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_replica_apply_rate_bytes_per_second",
			Help: "A streaming standby's apply rate (walsender NAME), measured from replay_lsn progress while it has a backlog; a lower bound from its recent progress until then.",
		}, []string{"replica"}),
	}
	reg.MustRegister(m.Throttled, m.ThrottledSeconds, m.ReplicaLagSeconds, m.ReplicaLagBytes, m.SlotLagBytes, m.LockWaits, m.WALWindow, m.ApplyRate)
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
