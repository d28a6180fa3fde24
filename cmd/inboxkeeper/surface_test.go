package main

// Issue 25: one surface. Every command, value, metric and page says the
// same thing; each test retries an item as a new user would.

import (
	"regexp"
	"strings"
	"testing"
)

// One duration grammar: 90d, 36h and 1d12h wherever a duration goes (the
// environment, the policy's tuning block, set, every flag), and one printer
// for what comes out (settings and its history say the same).
func TestOneDurationGrammar(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxDDL, strings.Replace(inboxPolicy, "expires_at: remember_until", `expires_at: remember_until
    tuning: {batch_target: 1d, run_time: 1d12h}`, 1), true)

	wantExit(t, f.runWith([]string{"INBOXKEEPER_RUN_TIME=1d", "INBOXKEEPER_INTERVAL=1d12h"}, "once", "--dry-run"), 0)
	wantExit(t, f.run("set", "batch_target=1d", "--reason", "r"), 0, "global batch_target: (not set) -> 1d by ")
	wantExit(t, f.run("set", "run_time=60m", "--reason", "r"), 0, "global run_time: (not set) -> 1h by ")
	r := f.run("settings")
	wantExit(t, r, 0)
	for _, want := range []string{
		`(?m)^  batch_target\s+1d\s+\(global setting\)$`,
		`(?m)^  run_time\s+1h\s+\(global setting\)$`,
		`(?m)^  batch_pause\s+0s\s+\(default\)$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("settings does not match %s\n%s", want, r)
		}
	}
	wantExit(t, f.run("settings", "--history"), 0, "global run_time: (not set) -> 1h by ")
	wantExit(t, f.run("set", "--unset", "batch_target", "run_time", "--reason", "r"), 0)
	r = f.run("settings")
	if !regexp.MustCompile(`(?m)^  run_time\s+1d12h\s+\(policy tuning\)$`).MatchString(r.stdout) {
		t.Errorf("the tuning block's run_time is not shown as 1d12h\n%s", r)
	}

	wantExit(t, f.run("hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o", "--for", "1d12h"), 0)
	wantExit(t, f.run("pause", "--reason", "r", "--for", "1d"), 0, "until ")
	wantExit(t, f.run("resume"), 0)

	// A bad duration is refused once, with what the grammar takes.
	for _, args := range [][]string{{"pause", "--reason", "r", "--for", "1w"}, {"hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o", "--for", "1w"}} {
		r = f.run(args...)
		wantExit(t, r, 2, `invalid value "1w" for flag -for: not a duration (like 500ms, 30s, 36h, 90d or 1d12h)`)
		if n := strings.Count(r.output(), `"1w"`); n != 1 {
			t.Errorf("the error is printed %d times, want once\n%s", n, r)
		}
	}
	wantExit(t, f.runWith([]string{"INBOXKEEPER_RUN_TIME=1w"}, "once"), 2, `INBOXKEEPER_RUN_TIME: "1w" is not a duration`)
	wantExit(t, f.run("set", "batch_target=1w", "--reason", "r"), 2, `batch_target: "1w" is not a duration`)
}
