package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// With a streaming standby, status shows its pacing (bytes behind, apply
// rate, window) and how the VACUUM after a pass is paced for it, and
// /metrics exports the window and the apply rate.
func TestPacingStatusAndMetrics(t *testing.T) {
	t.Parallel()
	primary, dir, pol := clusterFixture(t)
	pgtest.NewStandby(t, primary, nil)
	env := cliEnv("INBOXKEEPER_DATABASE_URL="+primary.URL("postgres"), "INBOXKEEPER_POLICY_FILE="+pol,
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_SCHEDULE=@every 1h")

	r := runCLI(t, dir, env, "status")
	wantExit(t, r, 0)
	if !regexp.MustCompile(`(?m)^  pace standby \S+: [0-9.]+ (B|KiB|MiB) behind, apply rate .+, window [0-9.]+ (KiB|MiB)$`).MatchString(r.stdout) {
		t.Errorf("status lacks the standby's pace line\n%s", r)
	}
	if !regexp.MustCompile(`(?m)^  vacuum after a pass: paced at most [0-9.]+ (KiB|MiB)/s of WAL for standby \S+, .+ \(vacuum_cost_delay \S+, vacuum_cost_limit [0-9]+\)$`).MatchString(r.stdout) {
		t.Errorf("status does not say how the VACUUM after a pass is paced for the standby\n%s", r)
	}
	r = runCLI(t, dir, env, "status", "--json")
	wantExit(t, r, 0)
	got := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	if s := got.Throttle.Standbys; len(s) != 1 || s[0].Standby == "" || s[0].WindowBytes < 256<<10 {
		t.Errorf("status --json throttle.standbys: %+v\n%s", s, r.stdout)
	}
	if v := got.Throttle.Vacuum; v == nil || !v.Paced || v.Standby == "" || v.WALBytesPerSecond <= 0 || v.CostLimit < 1 || v.CostDelaySeconds <= 0 {
		t.Errorf("status --json throttle.vacuum: %+v, want the VACUUM paced for the standby\n%s", v, r.stdout)
	}

	d := startDaemon(t, dir, env, "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 60*time.Second)
	m := httpGet(t, "http://"+addr+"/metrics")
	if w := metricValue(t, m, "inboxkeeper_wal_window_bytes"); w < 256<<10 {
		t.Errorf("inboxkeeper_wal_window_bytes %v after a pass with a standby streaming, want at least the 256 KiB floor", w)
	}
	if !regexp.MustCompile(`(?m)^inboxkeeper_replica_apply_rate_bytes_per_second\{replica="walsender [^"]+"\} \S+$`).MatchString(m) {
		t.Errorf("no apply rate for the standby in\n%s", m)
	}
}

// A THROTTLE_QUERY that fails is a configuration error at startup (exit 2),
// not a pause for ever.
func TestThrottleQueryCheckedAtStart(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	// once --dry-run refuses it too: a dry run checks what the run checks.
	// A query that writes fails too (it runs READ ONLY, rolled back), and
	// deletes nothing: not even in a dry run, which writes nothing.
	for _, q := range []string{"SELEC 1", "SELECT nope FROM pg_class", "SELECT 'busy'::text", "DELETE FROM public.consumer_inbox RETURNING 0"} {
		for _, args := range [][]string{{"once"}, {"once", "--dry-run"}, {"run"}} {
			r := f.runWith([]string{"INBOXKEEPER_THROTTLE_QUERY=" + q, "INBOXKEEPER_METRICS_ADDR="}, args...)
			wantExit(t, r, 2, "INBOXKEEPER_THROTTLE_QUERY")
		}
	}
	// Nor a second statement that ends the READ ONLY transaction, where the
	// connection string asks for the simple protocol (which takes several).
	sep := "?"
	if strings.Contains(f.url, "?") {
		sep = "&"
	}
	simple := "INBOXKEEPER_DATABASE_URL=" + f.url + sep + "default_query_exec_mode=simple_protocol"
	wantExit(t, f.runWith([]string{simple, "INBOXKEEPER_THROTTLE_QUERY=COMMIT; DELETE FROM public.consumer_inbox RETURNING 0"}, "once", "--dry-run"), 2,
		"INBOXKEEPER_THROTTLE_QUERY")
	wantExit(t, f.runWith([]string{"INBOXKEEPER_THROTTLE_QUERY=SELECT 0"}, "once", "--dry-run"), 0)
	if n := f.rows(); n != 42 {
		t.Errorf("%d rows left, want all 42: nothing may be deleted", n)
	}
	wantExit(t, f.runWith([]string{"INBOXKEEPER_THROTTLE_QUERY=SELECT 0"}, "once"), 0)
	if n := f.rows(); n == 42 {
		t.Error("a valid THROTTLE_QUERY at 0 deleted nothing")
	}
}
