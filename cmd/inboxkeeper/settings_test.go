package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
)

// set and settings: values checked like the environment, global and per
// table, with their source, the history, and nothing written when refused.
func TestSettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxDDL, strings.Replace(inboxPolicy, "expires_at: remember_until", `expires_at: remember_until
    tuning: {batch_pause: 10ms, batch_size: 4000}`, 1), true)

	r := f.run("settings")
	wantExit(t, r, 0, "global\n", "public.consumer_inbox\n")
	if !strings.Contains(r.stdout, "batch_pause            10ms") || !strings.Contains(r.stdout, "(policy tuning)") {
		t.Errorf("the tuning block is not shown as the source\n%s", r)
	}

	wantExit(t, f.run("set", "batch_size=1000", "max_replica_lag=5s", "--reason", "night load"), 0,
		"global batch_size: (not set) -> 1000 by postgres: night load", "global max_replica_lag: (not set) -> 5s")
	wantExit(t, f.run("set", "--table", "public.consumer_inbox", "batch_size=300", "--reason", "a hot table"), 0,
		"public.consumer_inbox batch_size: (not set) -> 300")
	r = f.run("status")
	wantExit(t, r, 0, "settings (all tables):      batch_size=1000 (global setting), max_replica_lag=5s (global setting)\n",
		"  settings:                 batch_size=300 (table setting), batch_pause=10ms (policy tuning), max_replica_lag=5s (global setting)\n")
	r = f.run("settings", "--json")
	wantExit(t, r, 0)
	got := decodeOutput[render.SettingsJSON](t, "settings --json", r, nil)
	in := map[string]string{}
	for _, s := range got.Scopes {
		for _, v := range s.Settings {
			in[s.Table+" "+v.Key] = fmt.Sprintf("%v %s (%s)", v.Value, v.Unit, v.Source)
		}
	}
	for k, want := range map[string]string{
		"global batch_size":                     "1000 rows (global setting)",
		"global batch_pause":                    "0 seconds (default)",
		"public.consumer_inbox batch_size":      "300 rows (table setting)",
		"public.consumer_inbox batch_pause":     "0.01 seconds (policy tuning)",
		"public.consumer_inbox max_replica_lag": "5 seconds (global setting)",
		"public.consumer_inbox batch_size_max":  "50000 rows (default)",
	} {
		if in[k] != want {
			t.Errorf("%s = %q, want %q", k, in[k], want)
		}
	}

	// Refused, naming why, and nothing written.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "batch_size=lots", "--reason", "r"}, `batch_size: "lots" is not an integer`},
		{[]string{"set", "lock_timeout=1s", "--reason", "r"}, `unknown key "lock_timeout"`},
		{[]string{"set", "batch_size=10"}, "--reason"},
		{[]string{"set", "--table", "public.consumer_inbox", "batch_size_min=500", "--reason", "r"}, "between batch_size_min (500)"},
		{[]string{"set", "--table", "public.nope", "batch_size=5", "--reason", "r"}, "not in the policy"},
		{[]string{"set", "--table", "public.consumer_inbox", "max_replica_lag=5s", "--reason", "r"}, "holds for the whole database"},
		{[]string{"set", "batch_size", "--reason", "r"}, "want KEY=VALUE"},
		{[]string{"set", "--unset", "batch_size=5", "--reason", "r"}, "name the key alone"},
		{[]string{"set", "max_replica_lag=999us", "--reason", "r"}, ""},
	} {
		r := f.run(c.args...)
		if c.want == "" { // accepted: a positive duration
			wantExit(t, r, 0)
			continue
		}
		wantExit(t, r, 2, c.want)
	}
	f.wantCount("changes recorded", 4, "SELECT count(*) FROM inboxkeeper.settings_history")

	wantExit(t, f.run("set", "--unset", "batch_size", "max_replica_lag", "--reason", "back to normal"), 0,
		"global batch_size: 1000 -> (not set)", "global max_replica_lag: 999us -> (not set)")
	r = f.run("settings", "--history")
	wantExit(t, r, 0, "public.consumer_inbox batch_size: (not set) -> 300 by postgres: a hot table")
	if n := strings.Count(r.stdout, "\n"); n != 6 {
		t.Errorf("history has %d lines, want 6\n%s", n, r)
	}

	// A tuning block is checked like the environment when the policy loads.
	bad := f.writeFile("bad.yaml", strings.Replace(inboxPolicy, "expires_at: remember_until", `expires_at: remember_until
    tuning: {batch_target: soon}`, 1))
	wantExit(t, f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + bad}, "once", "--dry-run"), 2,
		`bad.yaml:7: tables[0] (public.consumer_inbox): tuning.batch_target: "soon" is not a duration`)
}

// A running daemon applies a set before its next batch, without a restart,
// and another instance that takes over later runs with it too.
func TestSettingsApplyLive(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxTable+`
INSERT INTO public.consumer_inbox
SELECT 'c' || i % 4, 'old-' || i, now(), now() - interval '1 hour' - i * interval '1 second'
FROM generate_series(1, 5000) i;`, inboxPolicy, true)
	slow := []string{"INBOXKEEPER_LOG_LEVEL=debug", "INBOXKEEPER_INTERVAL=1h", "INBOXKEEPER_LEASE_TTL=3s",
		"INBOXKEEPER_BATCH_SIZE=10", "INBOXKEEPER_BATCH_SIZE_MIN=10", "INBOXKEEPER_BATCH_SIZE_MAX=10", "INBOXKEEPER_BATCH_PAUSE=50ms"}
	a := startDaemon(t, f.dir, f.env(slow...), "run")
	a.waitLine(regexp.MustCompile(`msg="expiry: batch" table=public.consumer_inbox deleted=10 `), 30*time.Second)
	b := startDaemon(t, f.dir, f.env(append(slow, "INBOXKEEPER_INTERVAL=300ms")...), "run") // waits for the lease
	b.waitLine(regexp.MustCompile(`msg="inboxkeeper: another instance is active; waiting"`), 30*time.Second)

	wantExit(t, f.run("set", "batch_size=40", "batch_size_min=40", "batch_size_max=40", "--reason", "catch up"), 0)
	a.waitLine(regexp.MustCompile(`stopped_early="the runtime settings changed; the next pass applies them"`), 30*time.Second)
	a.waitLine(regexp.MustCompile(`msg="expiry: batch" table=public.consumer_inbox deleted=40 `), 30*time.Second)

	// The other instance takes over with the settings in force now.
	wantExit(t, f.run("set", "batch_size=25", "batch_size_min=25", "batch_size_max=25", "--reason", "gentler"), 0)
	a.stop()
	b.waitLine(regexp.MustCompile(`msg="expiry: batch" table=public.consumer_inbox deleted=25 `), 30*time.Second)
	b.stop()
}

// settings and status show the active instance's environment, as it
// publishes it with its lease, never the shell's as if it were the
// daemon's: a daemon running with INBOXKEEPER_BATCH_SIZE=1000, read from a
// shell without it, does not run with the default 5000; standbys only the
// shell names do not pause it; and its own standbys, which the shell
// cannot know, are said to be unknown rather than measured as unreachable.
func TestSettingsAreTheDaemons(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	batchSize := regexp.MustCompile(`(?m)^  batch_size +(\d+) +\(([^)]*)\)$`)
	sizeIn := func(r result) string {
		t.Helper()
		m := batchSize.FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("no batch_size line\n%s", r)
		}
		return m[1] + " (" + m[2] + ")"
	}

	// No instance: the shell's values, marked as such.
	r := f.run("settings")
	wantExit(t, r, 0, "environment: this shell's, since no instance holds the lease")
	if got := sizeIn(r); got != "5000 (default, this shell)" {
		t.Errorf("without an active instance, batch_size is %q, want the shell's default marked as the shell's", got)
	}

	deadStandby := "postgres://standby:pw@127.0.0.1:1/app?connect_timeout=1"
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_BATCH_SIZE=1000", "INBOXKEEPER_INTERVAL=1h"), "run")
	d.waitLine(regexp.MustCompile(`msg="lease: this instance is now the active one"`), 30*time.Second)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: pass done"`), 30*time.Second)

	// A shell without BATCH_SIZE, and with standbys the daemon does not read.
	shell := []string{"INBOXKEEPER_REPLICA_URLS=" + deadStandby}
	r = f.runWith(shell, "settings")
	wantExit(t, r, 0, "environment: the active instance's (")
	if got := sizeIn(r); got != "1000 (environment)" {
		t.Errorf("batch_size is %q beside a daemon running with 1000, want 1000 (environment)\n%s", got, r)
	}
	if regexp.MustCompile(`\b5000\b`).MatchString(r.stdout) || strings.Contains(r.stdout, "this shell") {
		t.Errorf("settings shows the shell's values as the daemon's\n%s", r)
	}
	got := decodeOutput[render.SettingsJSON](t, "settings --json", f.runWith(shell, "settings", "--json"), nil)
	if got.Environment.Of != "active_instance" || got.Environment.Instance == nil {
		t.Errorf("settings --json: environment %+v, want the active instance's", got.Environment)
	}
	for _, v := range got.Scopes[0].Settings {
		if v.Key == "batch_size" && (v.Text != "1000" || v.Source != "environment" || v.FromThisShell) {
			t.Errorf("settings --json: batch_size %+v, want 1000 from the daemon's environment", v)
		}
	}
	r = f.runWith(shell, "status")
	wantExit(t, r, 0, "environment: the active instance's (", "throttle: running")
	if strings.Contains(r.stdout, "replica") {
		t.Errorf("status measured the shell's standbys, which the daemon does not read\n%s", r)
	}
	d.stop()

	// A daemon with standbys of its own, read from a shell without them.
	d = startDaemon(t, f.dir, f.env("INBOXKEEPER_REPLICA_URLS="+deadStandby, "INBOXKEEPER_INTERVAL=1h"), "run")
	d.waitLine(regexp.MustCompile(`msg="lease: this instance is now the active one"`), 30*time.Second)
	r = f.run("status")
	wantExit(t, r, 0, "not known here: INBOXKEEPER_REPLICA_URLS", "not measured: the active instance's standbys")
	st := decodeOutput[render.StatusJSON](t, "status --json", f.run("status", "--json"), nil)
	if st.Environment.Of != "active_instance" || !slices.Equal(st.Environment.Unknown, []string{"INBOXKEEPER_REPLICA_URLS"}) {
		t.Errorf("status --json: environment %+v, want the active instance's with its standbys unknown", st.Environment)
	}
	d.stop()
}
