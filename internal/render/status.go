package render

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Status prints status: every table (with its rate and an ETA over rates,
// for status --watch), the database's role and the active instance, and
// the throttle's verdict from th's fresh measurement.
func Status(w io.Writer, r pass.Status, tables []*catalog.Table, rates Rates, th *throttle.Throttler) {
	StatusTables(w, r, tables, rates)
	switch {
	case r.InRecovery:
		fmt.Fprintln(w, "database: a standby (in recovery): the daemon does nothing here")
	case r.Lease != nil:
		fmt.Fprintf(w, "active instance: %s (lease until %s)\n", r.Lease.Name, r.Lease.ExpiresAt.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintln(w, "active instance: none holds the lease")
	}
	writeThrottle(w, th)
}

// StatusTables prints the per-table part of status. Each table is named
// once, in policy order, with every part that applies.
func StatusTables(w io.Writer, r pass.Status, tables []*catalog.Table, rates Rates) {
	if s := describeTuning(r.Tuning[settings.Global]); s != "" {
		fmt.Fprintf(w, "settings (all tables):      %s\n", s)
	}
	for _, t := range tables {
		if t.Partitioned() {
			fmt.Fprintf(w, "%s (managed by partition)\n", t.Name)
		} else {
			fmt.Fprintf(w, "%s\n", t.Name)
		}
		if s := describeTuning(r.Tuning[t.Name]); s != "" && s != describeTuning(r.Tuning[settings.Global]) {
			fmt.Fprintf(w, "  settings:                 %s\n", s)
		}
		if d := t.Citus; d != nil {
			fmt.Fprintf(w, "  distributed (Citus):      %s: %s\n", d, strings.Join(d.Workers, ", "))
		}
		for _, st := range r.Tables {
			if st.Table == t.Name {
				writeStatus(w, st)
				if rate, ok := rates.rate(st.Table); ok {
					eta := "none: nothing goes"
					if rate > 0 {
						eta = humantime.Duration(time.Duration(float64(st.Due) / rate * float64(time.Second)))
					}
					fmt.Fprintf(w, "  rate (last minute):       %.0f rows/s, ETA %s\n", rate, eta)
				}
			}
		}
		for _, p := range r.Partitions {
			if p.Table == t.Name {
				writePartitionStatus(w, p)
			}
		}
		writeTierStatus(w, r.Tiers[t.Name])
	}
}

// StatusJSON is the shape of `status --json`: snake_case, durations in
// seconds, instants in RFC 3339.
func StatusJSON(r pass.Status, th *throttle.Throttler) map[string]any {
	tables := []map[string]any{}
	for _, st := range r.Tables {
		holds, replays := []map[string]any{}, []map[string]any{}
		for _, h := range st.Holds {
			holds = append(holds, map[string]any{"id": h.ID, "scope": h.Scope, "from": h.From, "to": h.To,
				"reason": h.Reason, "owner": h.Owner, "created_at": h.CreatedAt, "expires_at": h.ExpiresAt, "blocks": h.Blocks})
		}
		for _, p := range st.Replays {
			replays = append(replays, map[string]any{"id": p.ID, "scope": p.Scope, "from": p.From, "to": p.To,
				"owner": p.Owner, "started_at": p.StartedAt, "beyond_window": p.BeyondWindow})
		}
		tables = append(tables, map[string]any{
			"table": st.Table, "now": st.Now, "due": st.Due, "due_capped": st.DueCapped,
			"cleanup_lag_seconds": st.CleanupLag.Seconds(), "oldest_expiry": st.Oldest, "newest_expiry": st.Newest,
			"holds": holds, "replays": replays, "citus": citusJSON(r.Citus[st.Table]),
		})
	}
	for _, p := range r.Partitions {
		pj := partitionJSON(p)
		pj["citus"] = citusJSON(r.Citus[p.Table])
		tables = append(tables, pj)
	}
	state := th.Check()
	signals := []map[string]any{}
	for _, s := range th.Readings() {
		v := any(s.Value)
		if math.IsInf(s.Value, 0) {
			v = nil // unknown: JSON has no infinity
		}
		signals = append(signals, map[string]any{"kind": s.Kind, "subject": s.Subject, "value": v, "threshold": s.Threshold,
			"unit": s.Unit, "over": s.Over, "detail": s.Detail})
	}
	standbys := []map[string]any{}
	for _, p := range th.Paces() {
		standbys = append(standbys, map[string]any{"standby": p.Standby, "bytes_behind": p.Behind,
			"apply_rate_bytes_per_second": p.ApplyRate, "apply_rate_measured": p.Measured, "window_bytes": p.Window})
	}
	out := map[string]any{
		"in_recovery": r.InRecovery,
		"tables":      tables,
		"throttle": map[string]any{"throttled": state.Throttled, "kind": state.Kind, "reason": state.Reason, "signals": signals,
			"standbys": standbys},
		"active_instance": nil,
	}
	if len(r.Tiers) > 0 {
		tiers := map[string]any{}
		for name, st := range r.Tiers {
			tiers[name] = tierJSON(st)
		}
		out["tiers"] = tiers
	}
	if r.Lease != nil {
		out["active_instance"] = map[string]any{"holder": r.Lease.Name, "lease_expires_at": r.Lease.ExpiresAt}
	}
	return out
}

// citusJSON is a distributed table's distribution in status --json; null
// for an ordinary table.
func citusJSON(d *catalog.Distribution) any {
	if d == nil {
		return nil
	}
	return map[string]any{"distribution_column": d.Column.Name, "shards": d.Shards, "workers": d.Workers}
}

func writeStatus(w io.Writer, st expiry.TableStatus) {
	due := fmt.Sprintf("%d", st.Due)
	if st.DueCapped {
		due = fmt.Sprintf("more than %d (count capped)", st.Due)
	}
	fmt.Fprintf(w, "  expired, not yet deleted: %s (protected rows included)\n", due)
	fmt.Fprintf(w, "  cleanup lag:              %s\n", humantime.Duration(st.CleanupLag))
	if st.Oldest != nil {
		fmt.Fprintf(w, "  oldest retained expiry:   %s\n", st.Oldest.UTC().Format(time.RFC3339))
		fmt.Fprintf(w, "  newest retained expiry:   %s\n", st.Newest.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "  oldest retained expiry:   (no rows with an expiry)\n")
	}
	fmt.Fprintf(w, "  active holds:             %d\n", len(st.Holds))
	for _, h := range st.Holds {
		fmt.Fprintf(w, "    %s\n", DescribeHold(h))
	}
	fmt.Fprintf(w, "  active replays:           %d\n", len(st.Replays))
	for _, r := range st.Replays {
		fmt.Fprintf(w, "    %s\n", DescribeReplay(r))
	}
}

// writePartitionStatus describes a partitioned table for `status`, from a
// dry-run pass: what exists, what is due and why it waits.
func writePartitionStatus(w io.Writer, r partitions.TableResult) {
	if r.Err != nil {
		fmt.Fprintf(w, "  ERROR: %v\n", r.Err)
	}
	fmt.Fprintf(w, "  coverage:                 %s\n", coverage(r))
	fmt.Fprintf(w, "  cleanup lag:              %s\n", humantime.Duration(r.CleanupLag))
	if len(r.Created) > 0 {
		fmt.Fprintf(w, "  missing (next pass makes): %s\n", strings.Join(r.Created, ", "))
	}
	fmt.Fprintf(w, "  attached partitions:      %d\n", len(r.Partitions))
	for _, p := range r.Partitions {
		state := ""
		switch {
		case p.DetachPending:
			state = " detach pending (the next pass finishes it)"
		case p.Upper != nil && !p.Upper.After(r.Now):
			state = " due"
		}
		fmt.Fprintf(w, "    %s [%s, %s)%s\n", p, bound(p.Lower), bound(p.Upper), state)
	}
	for _, d := range r.Detached {
		fmt.Fprintf(w, "  next pass detaches:       %s\n", d)
	}
	for _, b := range r.Blocked {
		fmt.Fprintf(w, "  waits:                    %s (%s: %s)\n", b.Partition, b.Reason, b.Detail)
	}
	for _, d := range r.Waiting {
		fmt.Fprintf(w, "  detached, dropped after:  %s at %s\n", policyName(d), d.DropAt.Format(time.RFC3339))
	}
	for _, d := range r.Dropped {
		fmt.Fprintf(w, "  next pass drops:          %s\n", d)
	}
}

func policyName(d partitions.Detached) string {
	return partitions.Partition{Schema: d.Schema, Name: d.Name}.String()
}

func bound(x *time.Time) string {
	if x == nil {
		return "unbounded"
	}
	return x.UTC().Format(time.RFC3339)
}

// partitionJSON is one partitioned table in `status --json`.
func partitionJSON(r partitions.TableResult) map[string]any {
	cov := any(r.Coverage.Seconds())
	if r.CoveredUntil == nil {
		cov = nil // unbounded: JSON has no infinity
	}
	attached := []map[string]any{}
	for _, p := range r.Partitions {
		attached = append(attached, map[string]any{"name": p.String(), "from": p.Lower, "to": p.Upper, "detach_pending": p.DetachPending})
	}
	blocked := []map[string]any{}
	for _, b := range r.Blocked {
		blocked = append(blocked, map[string]any{"partition": b.Partition, "reason": b.Reason, "detail": b.Detail, "detached": b.Detached})
	}
	waiting := []map[string]any{}
	for _, d := range r.Waiting {
		waiting = append(waiting, map[string]any{"partition": policyName(d), "detached_at": d.DetachedAt, "drop_at": d.DropAt})
	}
	out := map[string]any{
		"table": r.Table, "now": r.Now, "managed_by": "partition",
		"coverage_seconds": cov, "covered_until": r.CoveredUntil, "cleanup_lag_seconds": r.CleanupLag.Seconds(),
		"partitions": attached, "missing": List(r.Created), "due": List(r.Detached), "blocked": blocked, "detached": waiting,
	}
	if r.Err != nil {
		out["error"] = r.Err.Error()
	}
	return out
}

// List is s, or an empty list: status --json writes [] for none, never null.
func List[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func writeTierStatus(w io.Writer, st *tiering.Status) {
	if st == nil {
		return
	}
	due := fmt.Sprintf("%d", st.Due)
	if st.DueCapped {
		due = fmt.Sprintf("more than %d (count capped)", st.Due)
	}
	fmt.Fprintf(w, "  tiers:                    hot for %s, payload %s\n", policy.Duration(st.HotFor), st.Layout)
	fmt.Fprintf(w, "    due for demotion:       %s (held ones included; holds blocking demotion: %d)\n", due, st.Blocking)
	est := func(tier string) string {
		v, ok := st.Rows[tier]
		if !ok {
			return "unknown (not analyzed yet)"
		}
		s := fmt.Sprintf("~%.0f rows", v)
		if b, ok := st.BytesPerKey[tier]; ok {
			s += fmt.Sprintf(", ~%.0f bytes per key", b)
		}
		return s
	}
	fmt.Fprintf(w, "    hot:                    %s\n", est(tiering.Hot))
	fmt.Fprintf(w, "    warm:                   %s\n", est(tiering.Warm))
	if st.KeyTable != "" {
		if st.KeyMissing {
			fmt.Fprintf(w, "    permanent:              %s does not exist yet (migrate, once or run creates it)\n", st.KeyTable)
		} else {
			fmt.Fprintf(w, "    permanent:              %s in %s\n", est(tiering.Permanent), st.KeyTable)
		}
	}
}

// tierJSON is the "tiers" object of a table in `status --json`.
func tierJSON(st *tiering.Status) map[string]any {
	if st == nil {
		return nil
	}
	out := map[string]any{
		"hot_for_seconds": st.HotFor.Seconds(), "layout": st.Layout, "due": st.Due, "due_capped": st.DueCapped,
		"blocking_holds": st.Blocking, "rows": st.Rows, "bytes_per_key": st.BytesPerKey,
	}
	if st.KeyTable != "" {
		out["permanent_key_table"] = st.KeyTable
		out["permanent_key_table_exists"] = !st.KeyMissing
	}
	return out
}

// describeTuning lists, for status, the values in force that are not the
// defaults, with their source.
func describeTuning(vals []settings.Value) string {
	var out string
	for _, v := range vals {
		if v.Source == settings.SourceDefault && v.BoundBy == "" {
			continue
		}
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%s=%s (%s)", v.Key, v.Value, origin(v))
	}
	return out
}

// writeThrottle prints the throttle's verdict and every signal against its
// threshold, from one fresh measurement.
func writeThrottle(w io.Writer, t *throttle.Throttler) {
	s := t.Check()
	if s.Throttled {
		fmt.Fprintf(w, "throttle: PAUSED (%s): %s\n", s.Kind, s.Reason)
	} else {
		fmt.Fprintln(w, "throttle: running (no signal over its threshold)")
	}
	for _, r := range t.Readings() {
		mark := "ok  "
		if r.Over {
			mark = "OVER"
		}
		fmt.Fprintf(w, "  %s %s\n", mark, r)
	}
	for _, p := range t.Paces() {
		fmt.Fprintf(w, "  pace %s\n", p)
	}
}
