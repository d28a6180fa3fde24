package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/render"
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
