// Package daemonmetrics holds the metrics of the daemon as a whole (which
// build, whether this instance works, how passes end) and the per-table
// facts a pass measures besides deleting (protected rows, retained range,
// bytes per key by tier, the configured horizons).
package daemonmetrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Pass outcomes: a fixed set.
const (
	PassOK      = "ok"      // every table finished
	PassPartial = "partial" // some tables failed or stopped early
	PassFailed  = "failed"  // every table failed
	PassSkipped = "skipped" // not the active instance, or the database is a standby
)

// Metrics are the daemon's own metrics.
type Metrics struct {
	BuildInfo      *prometheus.GaugeVec
	Active         prometheus.Gauge
	InRecovery     prometheus.Gauge
	PolicyMismatch prometheus.Gauge
	Passes         *prometheus.CounterVec
	LastPass       prometheus.Gauge
	RowsProtected  *prometheus.GaugeVec
	OldestExpiry   *prometheus.GaugeVec
	ScopeExpiry    *prometheus.GaugeVec // {table, scope, end}
	FirstSeen      *prometheus.GaugeVec // {table, end}
	ScopeFirstSeen *prometheus.GaugeVec // {table, scope, end}
	NewestExpiry   *prometheus.GaugeVec
	BytesPerKey    *prometheus.GaugeVec
	ReplayHorizon  *prometheus.GaugeVec
	PostReceipt    *prometheus.GaugeVec
	Margin         *prometheus.GaugeVec
	ReplaysBeyond  *prometheus.GaugeVec
	PassesInFlight prometheus.Gauge
	// ReloadOK and ReloadTime follow Prometheus's own convention for a
	// configuration reload.
	ReloadOK   prometheus.Gauge
	ReloadTime prometheus.Gauge
}

// New creates the metrics and registers them on reg.
func New(reg prometheus.Registerer, version string) *Metrics {
	m := &Metrics{
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_build_info",
			Help: "Always 1; the labels say which build runs.",
		}, []string{"version", "goversion"}),
		Active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_active",
			Help: "1 while this instance holds the lease and may delete; 0 while another instance works or the database is a standby.",
		}),
		InRecovery: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_in_recovery",
			Help: "1 when the database is a standby (pg_is_in_recovery): the daemon does nothing there.",
		}),
		PolicyMismatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_policy_mismatch",
			Help: "1 while run waits because the policy names a table, column or index the database lacks, or a permanent key table it may not create: nothing is touched until it matches.",
		}),
		Passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_passes_total",
			Help: "Passes by outcome: ok, partial, failed, skipped.",
		}, []string{"outcome"}),
		LastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_last_pass_timestamp_seconds",
			Help: "Unix time at which the last pass ended, whatever its outcome.",
		}),
		PassesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_pass_running",
			Help: "1 while a pass runs.",
		}),
		RowsProtected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_rows_protected",
			Help: "Expired rows kept at the end of the last pass, by what kept them: hold, or replay (only a replay).",
		}, []string{"table", "by"}),
		OldestExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_oldest_retained_expiry_timestamp_seconds",
			Help: "Unix time of the oldest expiry still present (protected rows included).",
		}, []string{"table"}),
		NewestExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_newest_retained_expiry_timestamp_seconds",
			Help: "Unix time of the newest expiry present: how far ahead identities are promised.",
		}, []string{"table"}),
		BytesPerKey: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_bytes_per_key",
			Help: "Storage one key costs, indexes and TOAST included, by tier: all (the table's size divided by the planner's row estimate), and for tables with tiers hot (a row with its payload), warm (a row without) and permanent (one key in the permanent key table).",
		}, []string{"table", "tier"}),
		ReplayHorizon: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_replay_horizon_seconds",
			Help: "Installed rule: how long after its event time an identity is remembered (before the margin).",
		}, []string{"table", "scope"}),
		PostReceipt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_post_receipt_horizon_seconds",
			Help: "Installed rule: how long after first receipt an identity is remembered (before the margin); covers redrives.",
		}, []string{"table", "scope"}),
		Margin: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_retention_margin_seconds",
			Help: "Installed rule: the safety margin added to every horizon.",
		}, []string{"table", "scope"}),
		FirstSeen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_retained_first_seen_timestamp_seconds",
			Help: "The first receipt of the oldest (end=oldest) and newest (end=newest) identity the table retains. Exported when an index leads with the first_seen column.",
		}, []string{"table", "end"}),
		ScopeExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_scope_retained_expiry_timestamp_seconds",
			Help: "Per scope with an installed retention rule: the oldest (end=oldest) and newest (end=newest) expiry present. Exported when an index leads with (scope, expiry column).",
		}, []string{"table", "scope", "end"}),
		ScopeFirstSeen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_scope_first_seen_timestamp_seconds",
			Help: "Per scope with an installed retention rule: the first receipt of the oldest (end=oldest) and newest (end=newest) identity retained. Exported when an index leads with (scope, first_seen column).",
		}, []string{"table", "scope", "end"}),
		ReloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_config_last_reload_successful",
			Help: "1 when the policy file in force is the one on disk; 0 when the last change of it (SIGHUP, or its content) failed its checks and the previous policy stays in force.",
		}),
		ReloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inboxkeeper_config_last_reload_success_timestamp_seconds",
			Help: "Unix time at which the policy in force was loaded.",
		}),
		ReplaysBeyond: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inboxkeeper_replays_beyond_window",
			Help: "Active replays started with --force although their range reaches past what is remembered.",
		}, []string{"table"}),
	}
	reg.MustRegister(m.BuildInfo, m.Active, m.InRecovery, m.PolicyMismatch, m.Passes, m.LastPass, m.PassesInFlight, m.RowsProtected,
		m.OldestExpiry, m.NewestExpiry, m.ScopeExpiry, m.ScopeFirstSeen, m.FirstSeen, m.BytesPerKey, m.ReplayHorizon, m.PostReceipt, m.Margin, m.ReplaysBeyond,
		m.ReloadOK, m.ReloadTime)
	m.BuildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	for _, o := range []string{PassOK, PassPartial, PassFailed, PassSkipped} {
		m.Passes.WithLabelValues(o).Add(0)
	}
	return m
}
