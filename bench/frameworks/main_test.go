package main

import (
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchtest"
)

// TestTinyRun runs the whole benchmark at a tiny scale, so CI proves that
// it still builds the daemon, makes every framework's table with the docs'
// index, deletes exactly the due rows both ways and reports.
func TestTinyRun(t *testing.T) {
	t.Parallel()
	benchtest.TinyRun(t, run, []string{"-rows", "4000", "-reps", "2"},
		"bench/frameworks on ", " CPUs; flags: -baseline  -frameworks Wolverine,DotNetCore.CAP,MassTransit,NServiceBus,Brighter,Eventuate Tram -keep false -referenced 0 -reps 2 -rows 4000",
		"timing: inboxkeeper once from exec to exit",
		"framework Wolverine: 4000 rows, 2000 due; its cleanup: batches of 5000",
		"framework DotNetCore.CAP: 4000 rows, 2000 due; its cleanup: batches of 1000",
		"framework MassTransit: 4000 rows, 2000 due; its cleanup: batches of 100",
		"framework NServiceBus: 4000 rows, 2000 due; its cleanup: batches of 4000",
		"framework Brighter: 4000 rows, 2000 due; its cleanup: batches of 100",
		"framework Eventuate Tram: 4000 rows, 2000 due; its cleanup: one DELETE",
		"rep 1 (inboxkeeper once first)", "rep 2 (the framework's cleanup first)",
		"    inboxkeeper once, VACUUM left ", "    the framework's cleanup ",
		"Wolverine over 2 reps, inboxkeeper once: ratio framework/this median ",
		"Eventuate Tram over 2 reps, inboxkeeper once, VACUUM left: ratio framework/this median ",
	)
}

// With -baseline (this tree's build standing in for another), the other
// build runs as one more method on a copy its own migrate set up.
func TestTinyRunBaseline(t *testing.T) {
	t.Parallel()
	bin := benchtest.Baseline(t, run)
	benchtest.TinyRun(t, run, []string{"-rows", "2000", "-reps", "1", "-frameworks", "NServiceBus", "-baseline", bin},
		"flags: -baseline "+bin+" -frameworks NServiceBus -keep false -referenced 0 -reps 1 -rows 2000",
		"    baseline once, VACUUM left ", "NServiceBus over 1 reps, baseline once, VACUUM left: ratio framework/this median ",
	)
}

// With -referenced, due rows have outbox messages pointing at them: once
// deletes them together, the framework's cleanup is left out, and the
// last once is the reference. A framework whose policy deletes no
// referencing rows is refused by name.
func TestTinyRunReferenced(t *testing.T) {
	t.Parallel()
	benchtest.TinyRun(t, run, []string{"-rows", "2000", "-reps", "1", "-frameworks", "MassTransit", "-referenced", "20"},
		"flags: -baseline  -frameworks MassTransit -keep false -referenced 20 -reps 1 -rows 2000",
		"one due row in 20 pointed at by a referencing row; the framework's cleanup left out",
		"    inboxkeeper once, VACUUM left ",
		"MassTransit over 1 reps, inboxkeeper once: ratio once/this median ",
	)
	var out strings.Builder
	if code := run([]string{"-frameworks", "Wolverine", "-referenced", "20"}, &out); code != 2 {
		t.Errorf("-referenced on Wolverine: exit %d, want 2 before anything runs\n%s", code, out.String())
	}
}
