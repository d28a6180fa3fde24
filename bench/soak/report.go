package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
)

// printRows describes the rows, from the first rep.
func printRows(w io.Writer, r *report) {
	o := r.o
	fmt.Fprintf(w, "rows: %.0f bytes each (pg_column_size), %.0f bytes a row in a table and indexes built fresh (%.0f the table); %.0f rows/s expiring after %s: %.0f live at once\n",
		r.packing.rowBytes, r.packing.perRow, r.packing.heapPerRow, o.rate, o.expiry, o.rate*o.expiry.Seconds())
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// printRep prints rep i side by side.
func printRep(w io.Writer, r *report, i int) {
	o, rp := r.o, r.reps[i]
	fmt.Fprintf(w, "\nrep %d (cleaners and writers started in the order %s)\n", i+1, strings.Join(rp.order, ", "))
	heads := map[string]string{cleanInboxkeeper: fmt.Sprintf("inboxkeeper run (INTERVAL %s)", o.interval), cleanBaseline: "baseline's run",
		cleanProcedure: fmt.Sprintf("procedure loop (every %s, %d rows a COMMIT)", o.procEvery, o.procBatch), cleanNone: "no cleanup"}
	fmt.Fprint(w, "| |")
	for _, cl := range o.cleaners() {
		fmt.Fprintf(w, " %s |", heads[cl])
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(o.cleaners())))
	row := func(what string, f func(*result) string) {
		fmt.Fprintf(w, "| %s |", what)
		for _, cl := range o.cleaners() {
			fmt.Fprintf(w, " %s |", f(rp.results[cl]))
		}
		fmt.Fprintln(w)
	}
	held := ""
	if o.hold > 0 {
		held = " (before the hold)"
	}
	row("peak footprint ÷ live rows packed"+held, func(x *result) string { return fmt.Sprintf("%.2f", x.footprint) })
	row("at that peak: table ÷ packed, indexes ÷ packed", func(x *result) string { return fmt.Sprintf("%.2f, %.2f", x.heapPart, x.indexPart) })
	if o.hold > 0 {
		row(fmt.Sprintf("peak footprint from the hold (%s) on", o.hold), func(x *result) string { return fmt.Sprintf("%.2f", x.footprintHeld) })
	}
	row("peak dead tuples", func(x *result) string { return fmt.Sprintf("%d", x.deadPeak) })
	row("cleanup lag p99 / max", func(x *result) string {
		if x.cleaner == cleanNone {
			return fmt.Sprintf("(grows: %s at the end)", x.lagMax.Round(time.Second))
		}
		return fmt.Sprintf("%.1f s / %.1f s", x.lagP99.Seconds(), x.lagMax.Seconds())
	})
	row("insert p50 / p99 / p999, ms", func(x *result) string {
		return fmt.Sprintf("%s / %s / %s", ms(x.lat.p50), ms(x.lat.p99), ms(x.lat.p999))
	})
	none := rp.results[cleanNone]
	row("insert p99 ÷ no cleanup", func(x *result) string { return fmt.Sprintf("%.2f", ratio(x.lat.p99, none.lat.p99)) })
	row("insert p999 ÷ no cleanup", func(x *result) string { return fmt.Sprintf("%.2f", ratio(x.lat.p999, none.lat.p999)) })
	row("inserts (started > 100 ms late)", func(x *result) string { return fmt.Sprintf("%d (%d)", x.lat.inserts, x.late) })
	row("the cleaner's transactions a second", func(x *result) string {
		if x.cleaner == cleanNone {
			return "-"
		}
		return fmt.Sprintf("%.2f", x.xactsPerSecond)
	})
	printDaemon(w, o, "daemon", rp.daemon)
	if o.Baseline != "" {
		printDaemon(w, o, "baseline daemon", rp.baseline)
	}
	d := rp.daemon
	if rp.stealValid {
		fmt.Fprintf(w, "CPU steal: %.1f%% of the machine's CPU time during the rep (/proc/stat: the hypervisor running other guests)\n", 100*rp.steal)
	}
	if o.hold > 0 {
		named := "NOT named"
		if d.namedInStatus != "" {
			named = "named: " + d.namedInStatus
		}
		fmt.Fprintf(w, "hold (a REPEATABLE READ session, pid %d in the daemon's database): status %s\n", d.holdPID, named)
		fmt.Fprintf(w, "hold: inboxkeeper_xmin_horizon_age_seconds{kind=\"backend\"} %.1f s at %.1f s into it (scraped every 250 ms until 1 s or more; INTERVAL %s)\n",
			d.metricInHold, d.metricInHoldAt.Seconds(), o.interval)
	}
}

// printDaemon prints a daemon's own figures of a rep.
func printDaemon(w io.Writer, o options, name string, d daemonFigures) {
	fmt.Fprintf(w, "%s: CPU %.1f%% of a core; RSS %.1f MB in the first minute, %.1f MB half way, %.1f MB in the last (anonymous %.1f, %.1f, %.1f MB); %.0f log lines an hour\n",
		name, 100*d.cpu, benchdata.MB(d.rss.first.rss), benchdata.MB(d.rss.middle.rss), benchdata.MB(d.rss.last.rss),
		benchdata.MB(d.rss.first.anon), benchdata.MB(d.rss.middle.anon), benchdata.MB(d.rss.last.anon), d.linesPerHour)
	fmt.Fprintf(w, "%s's VACUUMs (INBOXKEEPER_VACUUM_DEAD_RATIO): %d ran (%d once another session's lock let it, %d again after an older snapshot held the first back), %d passed over to the end, %d not run for another reason\n",
		name, d.vacuums, d.vacuumsLate, d.vacuumsHeldBack, d.vacuumsPassedOver, d.vacuumsNotRun)
	fmt.Fprintf(w, "%s with nothing due, over %s: %.2f transactions a second, %.0f log lines an hour\n", name, o.idle, d.idleXacts, d.idleLinesPerHour)
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// printGoals judges the goals on the medians of the reps, for this build;
// with -baseline, the baseline's figures follow on each line, not judged.
func printGoals(w io.Writer, r *report) {
	o := r.o
	of := func(f func(rep) float64) (float64, string) {
		var vs []float64
		var s []string
		for _, rp := range r.reps {
			v := f(rp)
			vs = append(vs, v)
			s = append(s, fmt.Sprintf("%.2f", v))
		}
		return median(vs), strings.Join(s, ", ")
	}
	// goal judges what for this build (cleanInboxkeeper), f given the
	// cleaner and its figures, and prints the baseline's beside.
	goal := func(what string, f func(rp rep, cleaner string, d daemonFigures) float64, ok func(float64) bool) {
		v, each := of(func(rp rep) float64 { return f(rp, cleanInboxkeeper, rp.daemon) })
		fmt.Fprintf(w, "goal: %s: %.2f (reps: %s): %s", what, v, each, benchdata.Verdict(ok(v)))
		if o.Baseline != "" {
			bv, beach := of(func(rp rep) float64 { return f(rp, cleanBaseline, rp.baseline) })
			fmt.Fprintf(w, "; baseline %.2f (reps: %s)", bv, beach)
		}
		fmt.Fprintln(w)
	}
	atMost := func(limit float64) func(float64) bool { return func(v float64) bool { return v <= limit } }
	fmt.Fprintf(w, "\ngoals, on the median of %d reps:\n", len(r.reps))
	goal(fmt.Sprintf("footprint at most %.1f x the live rows packed", goalFootprint),
		func(rp rep, cl string, _ daemonFigures) float64 { return rp.results[cl].footprint }, atMost(goalFootprint))
	if o.hold > 0 {
		goal(fmt.Sprintf("footprint at most %.1f x while a session holds the horizon for %s", goalFootprintHeld, o.hold),
			func(rp rep, cl string, _ daemonFigures) float64 { return rp.results[cl].footprintHeld }, atMost(goalFootprintHeld))
		fmt.Fprintf(w, "  (no cleaner can go below %.2f there: %s\n", heldFloor(o),
			"every row alive during the hold, from an expiry before it began to its end, stays on disk until it ends)")
		named := 0
		for _, rp := range r.reps {
			if rp.daemon.namedInStatus != "" && rp.daemon.metricInHold >= 1 {
				named++
			}
		}
		fmt.Fprintf(w, "goal: the holder named in status and the metric at 1 s or more during the hold: %d of %d reps: %s\n", named, len(r.reps), benchdata.Verdict(named == len(r.reps)))
	}
	goal(fmt.Sprintf("insert p99 at most %.2f x no cleanup's", goalP99), func(rp rep, cl string, _ daemonFigures) float64 {
		return ratio(rp.results[cl].lat.p99, rp.results[cleanNone].lat.p99)
	}, atMost(goalP99))
	goal(fmt.Sprintf("insert p999 at most %.2f x no cleanup's", goalP999), func(rp rep, cl string, _ daemonFigures) float64 {
		return ratio(rp.results[cl].lat.p999, rp.results[cleanNone].lat.p999)
	}, atMost(goalP999))
	limit := (o.interval + goalLagSlack).Seconds()
	goal(fmt.Sprintf("cleanup lag at most INTERVAL + %s = %.0f s (the maximum, s)", goalLagSlack, limit),
		func(rp rep, cl string, _ daemonFigures) float64 { return rp.results[cl].lagMax.Seconds() }, atMost(limit))
	goal(fmt.Sprintf("at most %.0f transaction a second from the daemon when nothing is due", goalIdleXacts),
		func(_ rep, _ string, d daemonFigures) float64 { return d.idleXacts }, atMost(goalIdleXacts))
	goal(fmt.Sprintf("RSS flat: the last minute's at most %.2f x the half-way minute's", goalRSSGrowth), func(_ rep, _ string, d daemonFigures) float64 {
		if d.rss.middle.rss == 0 { // a run too short to have a half-way minute
			return math.NaN()
		}
		return float64(d.rss.last.rss) / float64(d.rss.middle.rss)
	}, atMost(goalRSSGrowth))
	v, each := of(func(rp rep) float64 {
		return float64(rp.daemon.rss.last.rss) / float64(max(rp.daemon.rss.first.rss, 1))
	})
	fmt.Fprintf(w, "  (the last minute's ÷ the first's, not judged: %.2f (reps: %s))\n", v, each)
}

// heldFloor is the footprint no cleaner can go below while a session holds
// the xmin horizon: the rows inserted from one expiry before the hold began
// until it ends, (expiry + hold) ÷ expiry times the live rows, since none of
// those deleted after it began can be reclaimed before it ends.
func heldFloor(o options) float64 {
	return (o.expiry + o.hold).Seconds() / o.expiry.Seconds()
}
