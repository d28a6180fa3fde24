package render

import (
	"encoding/json"
	"io"
	"math"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Every JSON output is one of the types below: snake_case, typed (numbers
// as numbers, durations as seconds under a name ending in _seconds,
// instants as RFC 3339 strings), every list [] when empty, never null, and
// what may be unknown null. Each is documented field by field in
// docs/reference/commands.md; a test decodes each output strictly against
// that table, and another compares the table with these types.

// WriteJSON writes v as one JSON document.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// StatusJSON is `status --json`.
type StatusJSON struct {
	InRecovery     bool        `json:"in_recovery"`
	ActiveInstance *LeaseJSON  `json:"active_instance"` // null: no instance holds the lease
	Tables         []TableJSON `json:"tables"`
	// Environment is whose environment the settings and the throttle are
	// read with.
	Environment EnvironmentJSON `json:"environment"`
	Settings    []ScopeJSON     `json:"settings"`
	Throttle    ThrottleJSON    `json:"throttle"`
	XminHorizon HorizonJSON     `json:"xmin_horizon"`
	// HoldFence names who holds the hold fence against the cleanup ("":
	// nobody); RolePowers is what the connected role may do that the
	// daemon's must not.
	HoldFence  string   `json:"hold_fence"`
	RolePowers []string `json:"role_powers"`
}

// HorizonJSON is who holds the database's xmin horizon.
type HorizonJSON struct {
	Blockers []BlockerJSON `json:"blockers"`
}

// BlockerJSON is the oldest holder of the xmin horizon of one kind.
type BlockerJSON struct {
	Kind         string     `json:"kind"`
	Xids         int64      `json:"xids"`
	Since        *time.Time `json:"since"` // null: no reading dates it
	SinceAtLeast bool       `json:"since_at_least"`
	AgeSeconds   *float64   `json:"age_seconds"` // null with since
	PID          *int       `json:"pid"`         // null: no process (a prepared transaction, an inactive slot)
	Application  string     `json:"application_name"`
	Client       string     `json:"client"`
	State        string     `json:"state"`
	Name         string     `json:"name"`  // the slot's name, the prepared transaction's gid
	Owner        string     `json:"owner"` // the prepared transaction's owner
}

// LeaseJSON is the instance that holds the lease.
type LeaseJSON struct {
	Holder         string    `json:"holder"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
}

// TableJSON is one table of the policy in `status --json`.
type TableJSON struct {
	Table             string          `json:"table"`
	ManagedBy         string          `json:"managed_by"` // "rows" or "partition"
	Now               time.Time       `json:"now"`
	CleanupLagSeconds float64         `json:"cleanup_lag_seconds"`
	Rows              *RowsJSON       `json:"rows"`       // null for a table managed by partition
	Partitions        *PartitionsJSON `json:"partitions"` // null for a table managed row by row
	Tiers             *TiersJSON      `json:"tiers"`      // null without tiers
	Citus             *CitusJSON      `json:"citus"`      // null unless Citus distributes it
	Vacuum            *VacuumJSON     `json:"vacuum"`     // null unless managed by rows and outside Citus's metadata
	Space             *SpaceJSON      `json:"space"`      // null unless managed by rows and outside Citus's metadata
}

// VacuumJSON is how a table's space is kept reclaimed.
type VacuumJSON struct {
	LiveTuples                  int64          `json:"live_tuples"`
	DeadTuples                  int64          `json:"dead_tuples"`
	LastVacuum                  *time.Time     `json:"last_vacuum"`
	LastAutovacuum              *time.Time     `json:"last_autovacuum"`
	Autovacuum                  AutovacuumJSON `json:"autovacuum"`
	FallingDuePerSecond         float64        `json:"falling_due_per_second"`
	DaemonVacuums               bool           `json:"daemon_vacuums"`
	AutovacuumKeepsUp           bool           `json:"autovacuum_keeps_up"`
	AutovacuumCarriesDeadTuples int64          `json:"autovacuum_carries_dead_tuples"`
	Recommended                 []string       `json:"recommended"`
}

// AutovacuumJSON is autovacuum's settings for a table.
type AutovacuumJSON struct {
	Enabled             bool    `json:"enabled"`
	NaptimeSeconds      float64 `json:"naptime_seconds"`
	Threshold           int64   `json:"threshold"`
	ScaleFactor         float64 `json:"scale_factor"`
	Truncate            bool    `json:"truncate"`
	TakesItAtDeadTuples int64   `json:"takes_it_at_dead_tuples"`
}

// RowsJSON is the backlog of a table managed row by row, in the words of
// the metrics.
type RowsJSON struct {
	Due                int64 `json:"due"`
	DueCapped          bool  `json:"due_capped"`
	ProtectedByHolds   int64 `json:"protected_by_holds"`
	ProtectedByReplays int64 `json:"protected_by_replays"`
	// ProtectedByReferences: expired rows another table's foreign key
	// points at (no hold or replay covers them).
	ProtectedByReferences int64        `json:"protected_by_references"`
	ReplaysBeyondWindow   int          `json:"replays_beyond_window"`
	OldestExpiry          *time.Time   `json:"oldest_expiry"`
	NewestExpiry          *time.Time   `json:"newest_expiry"`
	Holds                 []HoldJSON   `json:"holds"`
	Replays               []ReplayJSON `json:"replays"`
}

// HoldJSON is an active hold.
type HoldJSON struct {
	ID        int64      `json:"id"`
	Scope     *string    `json:"scope"`
	From      *time.Time `json:"from"`
	To        *time.Time `json:"to"`
	Reason    string     `json:"reason"`
	Owner     string     `json:"owner"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"`
	Blocks    string     `json:"blocks"`
}

// ReplayJSON is an active replay marker.
type ReplayJSON struct {
	ID           int64     `json:"id"`
	Scope        string    `json:"scope"`
	From         time.Time `json:"from"`
	To           time.Time `json:"to"`
	Owner        string    `json:"owner"`
	StartedAt    time.Time `json:"started_at"`
	BeyondWindow bool      `json:"beyond_window"`
}

// PartitionsJSON is a table managed by partition: what a dry-run pass
// finds.
type PartitionsJSON struct {
	CoverageSeconds *float64       `json:"coverage_seconds"` // null: unbounded (a MAXVALUE partition)
	CoveredUntil    *time.Time     `json:"covered_until"`
	Attached        []AttachedJSON `json:"attached"`
	Missing         []string       `json:"missing"`
	Due             []string       `json:"due"`
	Blocked         []BlockedJSON  `json:"blocked"`
	Detached        []DetachedJSON `json:"detached"`
	ToDrop          []string       `json:"to_drop"`
	Error           *string        `json:"error"`
}

// AttachedJSON is an attached partition.
type AttachedJSON struct {
	Name          string     `json:"name"`
	From          *time.Time `json:"from"`
	To            *time.Time `json:"to"`
	DetachPending bool       `json:"detach_pending"`
}

// BlockedJSON is a due partition that waits, and why.
type BlockedJSON struct {
	Partition string `json:"partition"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
	Detached  bool   `json:"detached"`
}

// DetachedJSON is a detached partition waiting out detached_retention.
type DetachedJSON struct {
	Partition  string     `json:"partition"`
	DetachedAt *time.Time `json:"detached_at"`
	DropAt     *time.Time `json:"drop_at"`
}

// TiersJSON is a table's tiers.
type TiersJSON struct {
	HotForSeconds           float64         `json:"hot_for_seconds"`
	Layout                  string          `json:"layout"`
	Due                     int64           `json:"due"`
	DueCapped               bool            `json:"due_capped"`
	BlockingHolds           int             `json:"blocking_holds"`
	Rows                    TierFiguresJSON `json:"rows"`
	BytesPerKey             TierFiguresJSON `json:"bytes_per_key"`
	PermanentKeyTable       *string         `json:"permanent_key_table"`
	PermanentKeyTableExists bool            `json:"permanent_key_table_exists"`
	UnreadableColumns       []string        `json:"unreadable_columns"`
}

// TierFiguresJSON is an estimate per tier; null: unknown (not analyzed
// yet, or no such tier).
type TierFiguresJSON struct {
	Hot       *float64 `json:"hot"`
	Warm      *float64 `json:"warm"`
	Permanent *float64 `json:"permanent"`
}

// CitusJSON is how Citus distributes a table.
type CitusJSON struct {
	DistributionColumn string   `json:"distribution_column"`
	Shards             int      `json:"shards"`
	Workers            []string `json:"workers"`
}

// ThrottleJSON is the throttle's verdict from one fresh measurement.
type ThrottleJSON struct {
	Throttled bool            `json:"throttled"`
	Kind      string          `json:"kind"`
	Reason    string          `json:"reason"`
	Signals   []SignalJSON    `json:"signals"`
	Standbys  []StandbyJSON   `json:"standbys"`
	Vacuum    *VacuumPaceJSON `json:"vacuum"` // null: no VACUUM after a pass, or no standby streams
}

// VacuumPaceJSON is how the daemon's VACUUM after a pass goes for the
// standbys.
type VacuumPaceJSON struct {
	Paced                   bool    `json:"paced"`
	PassedOver              string  `json:"passed_over"` // why not, when not paced
	Standby                 string  `json:"standby"`
	WALBytesPerSecond       float64 `json:"wal_bytes_per_second"`
	ApplyRateBytesPerSecond float64 `json:"apply_rate_bytes_per_second"`
	CostDelaySeconds        float64 `json:"cost_delay_seconds"`
	CostLimit               int     `json:"cost_limit"`
}

// SignalJSON is one throttle signal against its threshold.
type SignalJSON struct {
	Kind      string   `json:"kind"`
	Subject   string   `json:"subject"`
	Value     *float64 `json:"value"` // null: unknown
	Threshold float64  `json:"threshold"`
	Unit      string   `json:"unit"` // seconds, bytes or ""
	Over      bool     `json:"over"`
	Detail    string   `json:"detail"`
}

// StandbyJSON is a streaming standby's pacing.
type StandbyJSON struct {
	Standby                 string  `json:"standby"`
	Reported                bool    `json:"reported"`
	BytesBehind             float64 `json:"bytes_behind"`
	ApplyRateBytesPerSecond float64 `json:"apply_rate_bytes_per_second"`
	ApplyRateMeasured       bool    `json:"apply_rate_measured"`
	WindowBytes             float64 `json:"window_bytes"`
}

// SettingsJSON is `settings --json`.
type SettingsJSON struct {
	Environment EnvironmentJSON `json:"environment"`
	Scopes      []ScopeJSON     `json:"scopes"`
}

// EnvironmentJSON says whose environment the values from the environment
// and the defaults are: the active instance's, as it published it with
// its lease, or, when none did, the shell's that ran the command.
type EnvironmentJSON struct {
	Of       string   `json:"of"`       // active_instance or this_shell
	Instance *string  `json:"instance"` // the active instance; null with this_shell
	Why      *string  `json:"why"`      // why this shell's; null with active_instance
	Unknown  []string `json:"unknown"`  // the instance's variables this shell cannot know
}

// Environment is env as JSON.
func Environment(env settings.Env) EnvironmentJSON {
	out := EnvironmentJSON{Of: "this_shell", Unknown: List(env.Unknown)}
	if env.Instance != "" {
		out.Of, out.Instance = "active_instance", &env.Instance
	} else {
		out.Why = &env.Why
	}
	return out
}

// ScopeJSON is every tunable in force in one scope.
type ScopeJSON struct {
	Table    string        `json:"table"` // "global" for the global scope
	Settings []SettingJSON `json:"settings"`
	Error    *string       `json:"error"` // why the values do not hold together
}

// SettingJSON is one tunable in force.
type SettingJSON struct {
	Key string `json:"key"`
	// Value is typed: a number of rows, seconds or bytes (Unit), or a
	// string (active_hours, active_tz).
	Value         any     `json:"value"`
	Unit          string  `json:"unit"` // rows, seconds, bytes or ""
	Text          string  `json:"text"` // as the environment and set write it
	Source        string  `json:"source"`
	FromThisShell bool    `json:"from_this_shell"` // the environment or default of the shell that ran the command: no active instance published its own
	Given         any     `json:"given"`           // what Source gave, when a higher layer bounded it; else null
	BoundedBy     *string `json:"bounded_by"`      // the key that bounded it; else null
	BoundedByFrom *string `json:"bounded_by_from"` // where that key's value comes from; else null
}

// HistoryJSON is `settings --history --json`.
type HistoryJSON struct {
	History []ChangeJSON `json:"history"`
}

// ChangeJSON is one change of a runtime setting.
type ChangeJSON struct {
	ID        int64     `json:"id"`
	Table     string    `json:"table"` // "global" for the global scope
	Key       string    `json:"key"`
	Old       any       `json:"old"` // typed as value is; null: was not set
	New       any       `json:"new"` // null: unset
	Unit      string    `json:"unit"`
	ChangedAt time.Time `json:"changed_at"`
	ChangedBy string    `json:"changed_by"`
	Reason    string    `json:"reason"`
}

// typed is a tunable's text value as JSON carries it, and its unit.
func typed(key, text string) (any, string) {
	t, ok := config.TunableByKey(key)
	if !ok {
		return text, ""
	}
	c, err := config.Config{}.Set(t.Env, text)
	if err != nil {
		return text, ""
	}
	switch v := c.Value(t.Env).(type) {
	case time.Duration:
		return v.Seconds(), "seconds"
	case config.ByteSize:
		return int64(v), "bytes"
	case int:
		return v, "rows"
	default:
		return v, ""
	}
}

// settingJSON is one tunable in force.
func settingJSON(v settings.Value) SettingJSON {
	val, unit := typed(v.Key, v.Value)
	s := SettingJSON{Key: v.Key, Value: val, Unit: unit, Text: v.Value, Source: v.Source, FromThisShell: shellValue(v)}
	if v.BoundBy != "" {
		s.Given, _ = typed(v.Key, v.Given)
		s.BoundedBy, s.BoundedByFrom = &v.BoundBy, &v.BoundBySource
	}
	return s
}

// Scopes is the settings in force, by scope, as JSON.
func Scopes(scopes []settings.Scope) []ScopeJSON {
	out := []ScopeJSON{}
	for _, s := range scopes {
		sj := ScopeJSON{Table: s.Table, Settings: []SettingJSON{}}
		for _, v := range s.Settings {
			sj.Settings = append(sj.Settings, settingJSON(v))
		}
		if s.Error != "" {
			sj.Error = &s.Error
		}
		out = append(out, sj)
	}
	return out
}

// History is `settings --history --json`.
func History(changes []settings.Change) HistoryJSON {
	out := HistoryJSON{History: []ChangeJSON{}}
	for _, c := range changes {
		cj := ChangeJSON{ID: c.ID, Table: settings.ScopeName(c.Table), Key: c.Key, ChangedAt: c.ChangedAt, ChangedBy: c.ChangedBy, Reason: c.Reason}
		if c.Old != nil {
			cj.Old, cj.Unit = typed(c.Key, *c.Old)
		}
		if c.New != nil {
			cj.New, cj.Unit = typed(c.Key, *c.New)
		}
		if cj.Unit == "" {
			_, cj.Unit = typed(c.Key, config.Default(tunableEnv(c.Key)))
		}
		out.History = append(out.History, cj)
	}
	return out
}

func tunableEnv(key string) string {
	t, _ := config.TunableByKey(key)
	return t.Env
}

// StatusOf is `status --json`: the tables in policy order, the settings in
// force by scope, and the throttle from th's fresh measurement.
func StatusOf(st pass.Status, tables []*catalog.Table, th *throttle.Throttler) StatusJSON {
	out := StatusJSON{InRecovery: st.InRecovery, Tables: []TableJSON{}, Environment: Environment(st.Env), Settings: Scopes(st.Scopes)}
	if st.Lease != nil {
		out.ActiveInstance = &LeaseJSON{Holder: st.Lease.Name, LeaseExpiresAt: st.Lease.ExpiresAt}
	}
	for _, t := range tables {
		tj := TableJSON{Table: t.Name, ManagedBy: "rows"}
		for _, ts := range st.Tables {
			if ts.Table == t.Name {
				tj.Now, tj.CleanupLagSeconds, tj.Rows = ts.Now, ts.CleanupLag.Seconds(), rowsJSON(ts)
				tj.Vacuum, tj.Space = vacuumJSON(st, ts), spaceJSON(t, st.Space[t.Name])
			}
		}
		for _, p := range st.Partitions {
			if p.Table == t.Name {
				tj.ManagedBy, tj.Now, tj.CleanupLagSeconds, tj.Partitions = "partition", p.Now, p.CleanupLag.Seconds(), partitionsJSON(p)
			}
		}
		if ti := st.Tiers[t.Name]; ti != nil {
			tj.Tiers = tiersJSON(ti)
		}
		if d := t.Citus; d != nil {
			tj.Citus = &CitusJSON{DistributionColumn: d.Column.Name, Shards: d.Shards, Workers: List(d.Workers)}
		}
		out.Tables = append(out.Tables, tj)
	}
	out.Throttle = throttleJSON(th)
	switch p, passedOver := vacuumPlan(st, th); {
	case p != nil:
		out.Throttle.Vacuum = &VacuumPaceJSON{Paced: true, Standby: p.Standby, WALBytesPerSecond: p.Rate, ApplyRateBytesPerSecond: p.StandbyRate,
			CostDelaySeconds: p.Delay.Seconds(), CostLimit: p.Limit}
	case passedOver != "":
		out.Throttle.Vacuum = &VacuumPaceJSON{PassedOver: passedOver}
	}
	out.XminHorizon = horizonJSON(st.Horizon)
	out.HoldFence, out.RolePowers = st.Fence, List(st.Powers)
	return out
}

func rowsJSON(st expiry.TableStatus) *RowsJSON {
	r := &RowsJSON{Due: st.Due, DueCapped: st.DueCapped, ProtectedByHolds: st.ProtectedByHolds, ProtectedByReplays: st.ProtectedByReplays, ProtectedByReferences: st.ProtectedByReferences,
		ReplaysBeyondWindow: st.ReplaysBeyondWindow, OldestExpiry: st.Oldest, NewestExpiry: st.Newest, Holds: []HoldJSON{}, Replays: []ReplayJSON{}}
	for _, h := range st.Holds {
		r.Holds = append(r.Holds, holdJSON(h))
	}
	for _, p := range st.Replays {
		r.Replays = append(r.Replays, ReplayJSON{ID: p.ID, Scope: p.Scope, From: p.From, To: p.To, Owner: p.Owner, StartedAt: p.StartedAt, BeyondWindow: p.BeyondWindow})
	}
	return r
}

func holdJSON(h holds.Hold) HoldJSON {
	return HoldJSON{ID: h.ID, Scope: h.Scope, From: h.From, To: h.To, Reason: h.Reason, Owner: h.Owner, CreatedAt: h.CreatedAt, ExpiresAt: h.ExpiresAt, Blocks: h.Blocks}
}

func partitionsJSON(r partitions.TableResult) *PartitionsJSON {
	p := &PartitionsJSON{CoveredUntil: r.CoveredUntil, Attached: []AttachedJSON{}, Missing: List(r.Created), Due: List(r.Detached),
		Blocked: []BlockedJSON{}, Detached: []DetachedJSON{}, ToDrop: List(r.Dropped)}
	if r.CoveredUntil != nil { // else unbounded: JSON has no infinity
		cov := r.Coverage.Seconds()
		p.CoverageSeconds = &cov
	}
	for _, a := range r.Partitions {
		p.Attached = append(p.Attached, AttachedJSON{Name: a.String(), From: a.Lower, To: a.Upper, DetachPending: a.DetachPending})
	}
	for _, b := range r.Blocked {
		p.Blocked = append(p.Blocked, BlockedJSON{Partition: b.Partition, Reason: b.Reason, Detail: b.Detail, Detached: b.Detached})
	}
	for _, d := range r.Waiting {
		p.Detached = append(p.Detached, DetachedJSON{Partition: policyName(d), DetachedAt: d.DetachedAt, DropAt: d.DropAt})
	}
	if r.Err != nil {
		e := r.Err.Error()
		p.Error = &e
	}
	return p
}

func tiersJSON(st *tiering.Status) *TiersJSON {
	figures := func(m map[string]float64) TierFiguresJSON {
		get := func(tier string) *float64 {
			if v, ok := m[tier]; ok {
				return &v
			}
			return nil
		}
		return TierFiguresJSON{Hot: get(tiering.Hot), Warm: get(tiering.Warm), Permanent: get(tiering.Permanent)}
	}
	tj := &TiersJSON{HotForSeconds: st.HotFor.Seconds(), Layout: st.Layout, Due: st.Due, DueCapped: st.DueCapped, BlockingHolds: st.Blocking,
		Rows: figures(st.Rows), BytesPerKey: figures(st.BytesPerKey), UnreadableColumns: append([]string{}, st.Unreadable...)}
	if st.KeyTable != "" {
		tj.PermanentKeyTable, tj.PermanentKeyTableExists = &st.KeyTable, !st.KeyMissing
	}
	return tj
}

func throttleJSON(th *throttle.Throttler) ThrottleJSON {
	state := th.Check()
	out := ThrottleJSON{Throttled: state.Throttled, Kind: state.Kind, Reason: state.Reason, Signals: []SignalJSON{}, Standbys: []StandbyJSON{}}
	for _, s := range th.Readings() {
		sj := SignalJSON{Kind: s.Kind, Subject: s.Subject, Threshold: s.Threshold, Unit: s.Unit, Over: s.Over, Detail: s.Detail}
		if sj.Unit == "s" {
			sj.Unit = "seconds"
		}
		if !math.IsInf(s.Value, 0) { // unknown: JSON has no infinity
			v := s.Value
			sj.Value = &v
		}
		out.Signals = append(out.Signals, sj)
	}
	for _, p := range th.Paces() {
		out.Standbys = append(out.Standbys, StandbyJSON{Standby: p.Standby, Reported: p.Reported, BytesBehind: p.Behind, ApplyRateBytesPerSecond: p.ApplyRate,
			ApplyRateMeasured: p.Measured, WindowBytes: p.Window})
	}
	return out
}
