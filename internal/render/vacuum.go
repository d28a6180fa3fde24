package render

import (
	"fmt"
	"io"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

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
		fmt.Fprintf(w, "    as the table's owner:   %s (inboxkeeper plan --apply sets it)\n", sql)
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
