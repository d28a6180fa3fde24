// Package daemonmetrics holds the metrics of the daemon as a whole (which
// build, whether this instance works, how passes end) and the per-table
// facts a pass measures besides deleting (protected rows, retained range,
// bytes per key by tier, the configured horizons), and the constructors
// every package's Metrics struct registers its metrics with; and what a
// build knows about where it came from (Build: the version label, and the
// line `inboxkeeper version` prints).
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
	RowsProtected  *Fact
	OldestExpiry   *Fact
	ScopeExpiry    *Fact // {table, scope, end}
	FirstSeen      *Fact // {table, end}
	ScopeFirstSeen *Fact // {table, scope, end}
	NewestExpiry   *Fact
	BytesPerKey    *Fact
	ReplayHorizon  *Fact
	PostReceipt    *Fact
	Margin         *Fact
	ReplaysBeyond  *Fact
	PassesInFlight prometheus.Gauge
	// ReloadOK and ReloadTime follow Prometheus's own convention for a
	// configuration reload.
	ReloadOK   prometheus.Gauge
	ReloadTime prometheus.Gauge
}

// New creates the metrics and registers them on reg; the per-table facts
// belong to facts.
func New(reg prometheus.Registerer, facts *Facts, version string) *Metrics {
	m := &Metrics{
		BuildInfo:      GaugeVec(reg, "inboxkeeper_build_info", "Always 1; the labels say which build runs.", "version", "goversion"),
		Active:         Gauge(reg, "inboxkeeper_active", "1 while this instance holds the lease and may delete; 0 while another instance works or the database is a standby."),
		InRecovery:     Gauge(reg, "inboxkeeper_in_recovery", "1 when the database is a standby (pg_is_in_recovery): the daemon does nothing there."),
		PolicyMismatch: Gauge(reg, "inboxkeeper_policy_mismatch", "1 while run waits because the policy names a table, column or index the database lacks, or a permanent key table it may not create: nothing is touched until it matches."),
		Passes:         CounterVec(reg, "inboxkeeper_passes_total", "Passes by outcome: ok, partial, failed, skipped.", "outcome"),
		LastPass:       Gauge(reg, "inboxkeeper_last_pass_timestamp_seconds", "Unix time at which the last pass ended, whatever its outcome."),
		PassesInFlight: Gauge(reg, "inboxkeeper_pass_running", "1 while a pass runs."),
		RowsProtected:  facts.Gauge(reg, "inboxkeeper_rows_protected", "Expired rows kept at the end of the last pass, by what kept them: hold, replay (only a replay), or reference (another table's foreign key points at them; no hold or replay covers them).", "table", "by"),
		OldestExpiry:   facts.Gauge(reg, "inboxkeeper_oldest_retained_expiry_timestamp_seconds", "Unix time of the oldest expiry still present (protected rows included).", "table"),
		NewestExpiry:   facts.Gauge(reg, "inboxkeeper_newest_retained_expiry_timestamp_seconds", "Unix time of the newest expiry present: how far ahead identities are promised.", "table"),
		BytesPerKey:    facts.Gauge(reg, "inboxkeeper_bytes_per_key", "Storage one key costs, indexes and TOAST included, by tier: all (the table's size divided by the planner's row estimate), and for tables with tiers hot (a row with its payload), warm (a row without) and permanent (one key in the permanent key table).", "table", "tier"),
		ReplayHorizon:  facts.Gauge(reg, "inboxkeeper_replay_horizon_seconds", "Installed rule: how long after its event time an identity is remembered (before the margin).", "table", "scope"),
		PostReceipt:    facts.Gauge(reg, "inboxkeeper_post_receipt_horizon_seconds", "Installed rule: how long after first receipt an identity is remembered (before the margin); covers redrives.", "table", "scope"),
		Margin:         facts.Gauge(reg, "inboxkeeper_retention_margin_seconds", "Installed rule: the safety margin added to every horizon.", "table", "scope"),
		FirstSeen:      facts.Gauge(reg, "inboxkeeper_retained_first_seen_timestamp_seconds", "The first receipt of the oldest (end=oldest) and newest (end=newest) identity the table retains. Exported when an index leads with the first_seen column.", "table", "end"),
		ScopeExpiry:    facts.Gauge(reg, "inboxkeeper_scope_retained_expiry_timestamp_seconds", "Per scope with an installed retention rule: the oldest (end=oldest) and newest (end=newest) expiry present. Exported when an index leads with (scope, expiry column).", "table", "scope", "end"),
		ScopeFirstSeen: facts.Gauge(reg, "inboxkeeper_scope_first_seen_timestamp_seconds", "Per scope with an installed retention rule: the first receipt of the oldest (end=oldest) and newest (end=newest) identity retained. Exported when an index leads with (scope, first_seen column).", "table", "scope", "end"),
		ReloadOK:       Gauge(reg, "inboxkeeper_config_last_reload_successful", "1 when the policy file in force is the one on disk; 0 when the last change of it (SIGHUP, or its content) failed its checks and the previous policy stays in force."),
		ReloadTime:     Gauge(reg, "inboxkeeper_config_last_reload_success_timestamp_seconds", "Unix time at which the policy in force was loaded."),
		ReplaysBeyond:  facts.Gauge(reg, "inboxkeeper_replays_beyond_window", "Active replays started with --force although their range reaches past what is remembered.", "table"),
	}
	m.BuildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	for _, o := range []string{PassOK, PassPartial, PassFailed, PassSkipped} {
		m.Passes.WithLabelValues(o).Add(0)
	}
	return m
}
