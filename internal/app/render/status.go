package render

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/horizon"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// Status prints status: every table (with how its due count moves over
// rates, for status --watch), the database's role and the active instance, and
// the throttle's verdict from th's fresh measurement.
func Status(w io.Writer, r pass.Status, tables []*catalog.Table, rates Rates, th *throttle.Throttler) {
	WriteEnvironment(w, r.Env)
	StatusTables(w, r, tables, rates)
	switch {
	case r.InRecovery:
		fmt.Fprintln(w, "database: a standby (in recovery): the daemon does nothing here")
	case r.Lease != nil:
		fmt.Fprintf(w, "active instance: %s (lease until %s)\n", r.Lease.Name, r.Lease.ExpiresAt.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintln(w, "active instance: none holds the lease")
	}
	if r.Fence != "" {
		fmt.Fprintf(w, "hold fence: held against the cleanup by %s; batches wait at most their lock timeout, then fail (errors_total{kind=\"fence\"})\n", r.Fence)
	}
	writeThrottle(w, th)
	if slices.Contains(r.Env.Unknown, "INBOXKEEPER_REPLICA_URLS") {
		fmt.Fprintln(w, "  not measured: the active instance's standbys (INBOXKEEPER_REPLICA_URLS, not known here); its inboxkeeper_throttled metric says whether they hold its batches")
	}
	writeVacuumPace(w, r, th)
	writeHorizon(w, r.Horizon)
	if len(r.Powers) > 0 {
		fmt.Fprintf(w, "this role may also: %s. Fine for an operator; the daemon's own login must not (deploy/sql/role.sql, docs/operations/least-privilege.md)\n",
			strings.Join(r.Powers, "; "))
	}
}

// StatusTables prints the per-table part of status. Each table is named
// once, in policy order, with every part that applies.
func StatusTables(w io.Writer, r pass.Status, tables []*catalog.Table, rates Rates) {
	global := describeTuning(scope(r.Scopes, settings.ScopeName(settings.Global)))
	if global != "" {
		fmt.Fprintf(w, "settings (all tables):      %s\n", global)
	}
	for _, t := range tables {
		if t.Partitioned() {
			fmt.Fprintf(w, "%s (managed by partition)\n", t.Name)
		} else {
			fmt.Fprintf(w, "%s\n", t.Name)
		}
		if s := describeTuning(scope(r.Scopes, t.Name)); s != "" && s != global {
			fmt.Fprintf(w, "  settings:                 %s\n", s)
		}
		if d := t.Citus; d != nil {
			fmt.Fprintf(w, "  distributed (Citus):      %s: %s\n", d, strings.Join(d.Workers, ", "))
		}
		for _, st := range r.Tables {
			if st.Table == t.Name {
				writeStatus(w, st)
				writeVacuum(w, r, st)
				writeSpace(w, t, r.Space[t.Name])
				if trend := rates.trend(st.Table, st.Due); trend != "" {
					fmt.Fprintf(w, "  due rows (last minute):   %s\n", trend)
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

// scope is the settings of the scope named name (a table, or "global").
func scope(scopes []settings.Scope, name string) []settings.Value {
	for _, s := range scopes {
		if s.Table == name {
			return s.Settings
		}
	}
	return nil
}

// writeStatus writes a table managed row by row, its backlog in the words
// of the metrics: due (deletable now: inboxkeeper_rows_due), protected by
// holds and by replays (inboxkeeper_rows_protected), the replays beyond the
// window (inboxkeeper_replays_beyond_window).
func writeStatus(w io.Writer, st expiry.TableStatus) {
	due := fmt.Sprintf("%d", st.Due)
	if st.DueCapped {
		due = fmt.Sprintf("more than %d (count capped)", st.Due)
	}
	fmt.Fprintf(w, "  due (deletable now):      %s\n", due)
	fmt.Fprintf(w, "  protected by holds:       %d\n", st.ProtectedByHolds)
	fmt.Fprintf(w, "  protected by replays:     %d\n", st.ProtectedByReplays)
	fmt.Fprintf(w, "  protected by references:  %d\n", st.ProtectedByReferences)
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
	fmt.Fprintf(w, "  replays beyond the window: %d\n", st.ReplaysBeyondWindow)
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
	fmt.Fprintf(w, "  tiers:                    hot for %s, payload %s\n", humantime.Format(st.HotFor), st.Layout)
	unread := ""
	if len(st.Unreadable) > 0 {
		unread = fmt.Sprintf("unknown (this role may not read %s)", strings.Join(st.Unreadable, ", "))
		due = unread
	}
	fmt.Fprintf(w, "    due for demotion:       %s (held ones included; holds blocking demotion: %d)\n", due, st.Blocking)
	est := func(tier string) string {
		v, ok := st.Rows[tier]
		if !ok && unread != "" && tier != tiering.Permanent {
			return unread
		}
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

// vacuumPlan is how the daemon's VACUUM after a pass would go now, with
// th's measurement: nil and "" when it does not vacuum or no standby
// streams (unpaced); the pace; or why it is passed over for the standby.
// A daemon that has run VACUUMs paces them by the WAL a cost unit it
// measured, status by what it assumes before.
func vacuumPlan(r pass.Status, th *throttle.Throttler) (*vacuum.Pace, string) {
	if r.VacuumDeadRatio <= 0 {
		return nil, ""
	}
	return vacuum.Plan(th.WriterRate(), r.Pooled, 0, vacuum.MaxBoost)
}

// writeVacuumPace says, under the throttle, how the daemon's VACUUM after
// a pass is paced for the standby, or why it is passed over.
func writeVacuumPace(w io.Writer, r pass.Status, th *throttle.Throttler) {
	switch p, passedOver := vacuumPlan(r, th); {
	case p != nil:
		fmt.Fprintf(w, "  vacuum after a pass: paced %s\n", p)
	case passedOver != "":
		fmt.Fprintf(w, "  vacuum after a pass: %s\n", passedOver)
	}
}

// daemonVacuums says whether the daemon vacuums the table after its
// passes: its ratio is on, and the role status runs as may (the daemon's
// may differ: the daemon says so in its log).
func daemonVacuums(r pass.Status, vs *vacuum.State) bool {
	return r.VacuumDeadRatio > 0 && vs.MayVacuum
}

// writeVacuum shows, for status, how a table's space is kept reclaimed:
// its dead tuples, its last vacuums, autovacuum's settings for it, and a
// warning when nothing keeps up with the rows falling due.
func writeVacuum(w io.Writer, r pass.Status, st expiry.TableStatus) {
	vs := r.Vacuum[st.Table]
	if vs == nil {
		return
	}
	pct := 0.0
	if vs.Live+vs.Dead > 0 {
		pct = 100 * float64(vs.Dead) / float64(vs.Live+vs.Dead)
	}
	fmt.Fprintf(w, "  dead tuples:              %d (%.0f%% of its tuples); last vacuum %s, last autovacuum %s\n",
		vs.Dead, pct, ago(st.Now, vs.LastVacuum), ago(st.Now, vs.LastAutovacuum))
	a := vacuum.Advise(*vs, st.FallingDue)
	if daemonVacuums(r, vs) {
		fmt.Fprintf(w, "  vacuum:                   by the daemon after a pass that leaves %.0f%% of the tuples dead (INBOXKEEPER_VACUUM_DEAD_RATIO); autovacuum takes it at %d dead tuples\n",
			100*r.VacuumDeadRatio, a.Trigger)
		return
	}
	if a.KeepsUp {
		fmt.Fprintf(w, "  vacuum:                   by autovacuum, which keeps up: %s\n", a)
		return
	}
	fmt.Fprintf(w, "  WARNING vacuum:           autovacuum cannot keep up: %s\n", a)
	if sql := a.AlterSQL(st.Table); sql != "" {
		// plan --apply sets it only on the tables a retention record
		// names: a policy without a retention section is refused.
		fmt.Fprintf(w, "    as the table's owner:   %s (or inboxkeeper plan --apply, once a retention record names the table)\n", sql)
	}
}

func ago(now time.Time, at *time.Time) string {
	if at == nil {
		return "never"
	}
	return humantime.Duration(now.Sub(*at)) + " ago"
}

// vacuumJSON is a table's vacuum in status --json; nil for a table whose
// vacuum is not read (managed by partition, or distributed by Citus).
func vacuumJSON(r pass.Status, st expiry.TableStatus) *VacuumJSON {
	vs := r.Vacuum[st.Table]
	if vs == nil {
		return nil
	}
	a := vacuum.Advise(*vs, st.FallingDue)
	return &VacuumJSON{LiveTuples: vs.Live, DeadTuples: vs.Dead, LastVacuum: vs.LastVacuum, LastAutovacuum: vs.LastAutovacuum,
		Autovacuum: AutovacuumJSON{Enabled: vs.Autovacuum, NaptimeSeconds: vs.Naptime.Seconds(), Threshold: vs.Threshold,
			ScaleFactor: vs.ScaleFactor, Truncate: vs.Truncate, TakesItAtDeadTuples: a.Trigger},
		FallingDuePerSecond: st.FallingDue, DaemonVacuums: daemonVacuums(r, vs),
		AutovacuumKeepsUp: a.KeepsUp, AutovacuumCarriesDeadTuples: a.Carried, Recommended: List(a.Set)}
}

// horizonHeldAfter is when status marks a holder of the xmin horizon: a
// transaction open this long keeps every row deleted since on disk.
const horizonHeldAfter = time.Minute

// writeHorizon names, for status, the oldest holder of the database's xmin
// horizon of each kind: rows deleted after it began stay on disk until it
// lets go, however often VACUUM runs.
func writeHorizon(w io.Writer, r horizon.Reading) {
	if len(r.Blockers) == 0 {
		fmt.Fprintln(w, "xmin horizon: nothing holds it back (deleted rows can be reclaimed)")
		return
	}
	fmt.Fprintln(w, "xmin horizon: held by (rows deleted since stay on disk until it ends)")
	for _, b := range r.Blockers {
		mark := "    "
		if b.Age >= horizonHeldAfter {
			mark = "HELD"
		}
		age := "age unknown"
		switch {
		case b.Since.IsZero():
		case b.AtLeast:
			age = "for more than " + humantime.Duration(b.Age)
		default:
			age = "for " + humantime.Duration(b.Age)
		}
		fmt.Fprintf(w, "  %s %s: %s, %s\n", mark, b.Kind, age, b)
	}
}

// horizonJSON is the xmin horizon in status --json.
func horizonJSON(r horizon.Reading) HorizonJSON {
	out := HorizonJSON{Blockers: []BlockerJSON{}}
	for _, b := range r.Blockers {
		j := BlockerJSON{Kind: b.Kind, Xids: b.Xids, SinceAtLeast: b.AtLeast, Application: b.Application, Client: b.Client,
			State: b.State, Name: b.Name, Owner: b.Owner}
		if !b.Since.IsZero() {
			since, age := b.Since, b.Age.Seconds()
			j.Since, j.AgeSeconds = &since, &age
		}
		if b.PID != 0 {
			pid := b.PID
			j.PID = &pid
		}
		out.Blockers = append(out.Blockers, j)
	}
	return out
}

// backlogTrend says how the due count moved over the last minute (fall:
// rows a second, negative where it rose), and when it would reach 0 at
// that pace. It is the net fall (rows deleted less
// rows falling due), not the deletion rate: a daemon that keeps up deletes
// as fast as rows fall due, and the count stays where it is.
func backlogTrend(fall float64, due int64) string {
	switch {
	case due == 0:
		return "none due"
	case fall >= 0.5:
		return fmt.Sprintf("falling by %.0f/s, gone in about %s at that pace", fall,
			humantime.Duration(time.Duration(float64(due)/fall*float64(time.Second))))
	case fall > -0.5:
		return "not falling: rows fall due as fast as they go, or nothing deletes them"
	default:
		return fmt.Sprintf("rising by %.0f/s: rows fall due faster than they go", -fall)
	}
}
