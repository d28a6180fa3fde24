package main

import (
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/scrape"
)

var (
	metricsListening = regexp.MustCompile(`msg="inboxkeeper: metrics listening" addr=(\S+)`)
	batchLogged      = regexp.MustCompile(`level=DEBUG msg="expiry: batch" .*deleted=[1-9]`)
	passDone         = regexp.MustCompile(`msg="inboxkeeper: pass done"`)
	stoppedLogged    = regexp.MustCompile(`msg="inboxkeeper: stopped"`)
)

func httpGet(t *testing.T, url string) string { return scrape.Get(t, url) }

func metricValue(t *testing.T, exposition, series string) float64 {
	return scrape.Value(t, exposition, series)
}

// The daemon serves metrics while it deletes, and SIGTERM in the middle of a
// long pass stops it promptly with exit 0 and every batch either committed
// whole or not at all.
func TestRunStopsMidPassOnSIGTERM(t *testing.T) {
	t.Parallel()
	// 10,000 expired rows in batches of 100 with a 100ms pause: a pass takes
	// more than 10 seconds.
	const expired = 10000
	f := newFixture(t, inboxTable+`
INSERT INTO public.consumer_inbox
SELECT 'c' || i % 4, 'old-' || i, now(), now() - interval '1 hour' - i * interval '1 second'
FROM generate_series(1, 10000) i;
INSERT INTO public.consumer_inbox
SELECT 'c' || i % 4, 'new-' || i, now(), now() + interval '1 hour'
FROM generate_series(1, 50) i;`, inboxPolicy, true)

	vars := []string{
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0",
		"INBOXKEEPER_LOG_LEVEL=debug",
		"INBOXKEEPER_BATCH_SIZE=100",
		"INBOXKEEPER_BATCH_PAUSE=100ms",
	}
	// Where the batch size adapts (it starts at BATCH_SIZE), pin its bounds
	// too, so that every batch is exactly 100 rows.
	if slices.Contains(config.KnownVariables(), "INBOXKEEPER_BATCH_SIZE_MIN") {
		vars = append(vars, "INBOXKEEPER_BATCH_SIZE_MIN=100", "INBOXKEEPER_BATCH_SIZE_MAX=100")
	}
	d := startDaemon(t, f.dir, f.env(vars...), "run")
	addr := metricsListening.FindStringSubmatch(d.waitLine(metricsListening, 30*time.Second))[1]
	d.waitLine(batchLogged, 30*time.Second)

	metrics := httpGet(t, "http://"+addr+"/metrics")
	for _, name := range []string{"inboxkeeper_rows_deleted_total", "inboxkeeper_batches_total", "inboxkeeper_batch_duration_seconds"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// Counted exactly when the pass began: every expired row.
	if due := metricValue(t, metrics, `inboxkeeper_rows_due{table="public.consumer_inbox"}`); due != expired {
		t.Errorf("inboxkeeper_rows_due = %v when the pass began, want %d", due, expired)
	}
	deletedSoFar := metricValue(t, metrics, `inboxkeeper_rows_deleted_total{table="public.consumer_inbox"}`)
	if deletedSoFar < 100 || int64(deletedSoFar)%100 != 0 {
		t.Errorf("inboxkeeper_rows_deleted_total is %v after the first batch, want a positive multiple of 100", deletedSoFar)
	}
	if b := metricValue(t, metrics, `inboxkeeper_batches_total{table="public.consumer_inbox"}`); b < 1 {
		t.Errorf("inboxkeeper_batches_total is %v after the first batch", b)
	}
	if body := httpGet(t, "http://"+addr+"/livez"); body != "ok\n" {
		t.Errorf("/livez says %q", body)
	}

	d.signal(syscall.SIGTERM)
	code, took := d.exit(10 * time.Second)
	if code != 0 {
		t.Fatalf("exit %d after SIGTERM\nstderr:\n%s", code, d.log())
	}
	t.Logf("stopped %s after SIGTERM", took)
	if !regexp.MustCompile(`msg="inboxkeeper: stopped" reason=signal during_pass=true`).MatchString(d.log()) {
		t.Errorf("no log line saying it stopped during a pass\nstderr:\n%s", d.log())
	}

	left := f.count("SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	deleted := expired - left
	switch {
	case deleted%100 != 0:
		t.Errorf("%d rows deleted: not a whole number of batches of 100", deleted)
	case deleted < int64(deletedSoFar):
		t.Errorf("%d rows deleted, fewer than the %v the metrics reported", deleted, deletedSoFar)
	case left == 0:
		t.Errorf("the whole pass finished: SIGTERM did not interrupt it")
	}
	f.wantCount("rows not expired", 50, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until > now()")
}

// With a schedule the daemon runs pass after pass until told to stop.
func TestRunOnSchedule(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	d := startDaemon(t, f.dir, f.env(
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0",
		"INBOXKEEPER_SCHEDULE=@every 1s",
	), "run")
	d.waitLine(passDone, 30*time.Second)
	f.wantCount("expired rows after the first pass", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	d.waitLine(passDone, 30*time.Second)

	d.signal(syscall.SIGTERM)
	code, _ := d.exit(10 * time.Second)
	if code != 0 {
		t.Fatalf("exit %d after SIGTERM\nstderr:\n%s", code, d.log())
	}
	if !stoppedLogged.MatchString(d.log()) {
		t.Errorf("no log line saying it stopped\nstderr:\n%s", d.log())
	}
	f.wantCount("rows", allRows-expiredRows, "SELECT count(*) FROM public.consumer_inbox")
}

// A sidecar that starts before the application's migration has created the
// inbox waits for it (a crash-looping native sidecar would take the
// database pod out of service), says so in its log and in
// inboxkeeper_policy_mismatch, and starts working once the table exists.
// The mismatch is said once at ERROR however often it is tried (the
// retries are at DEBUG).
func TestRunWaitsForTheTables(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "", inboxPolicy, true)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1h", "INBOXKEEPER_LOG_LEVEL=debug"), "run")
	addr := metricsAddr(t, d)
	mismatch := regexp.MustCompile(`level=(ERROR|DEBUG) msg="inboxkeeper: the policy does not match the database.*public\.consumer_inbox.*no such table`)
	d.waitLine(mismatch, 30*time.Second)
	pgtest.WaitFor(t, 30*time.Second, "two more tries (1 s, then 2 s of backoff)", func() bool {
		return len(mismatch.FindAllString(d.log(), -1)) >= 3
	})
	if n := strings.Count(d.log(), `level=ERROR msg="inboxkeeper: the policy does not match the database`); n != 1 {
		t.Errorf("%d ERROR lines for one unchanged mismatch, want 1\n%s", n, d.log())
	}
	if v := metricValue(t, httpGet(t, "http://"+addr+"/metrics"), "inboxkeeper_policy_mismatch"); v != 1 {
		t.Errorf("inboxkeeper_policy_mismatch = %v while the table is missing", v)
	}
	if body := httpGet(t, "http://"+addr+"/readyz"); !strings.Contains(body, "ok") {
		t.Errorf("/readyz while waiting: %q", body)
	}
	pgtest.Exec(t, f.pool, inboxDDL)
	d.waitLine(passDone, 60*time.Second)
	if v := metricValue(t, httpGet(t, "http://"+addr+"/metrics"), "inboxkeeper_policy_mismatch"); v != 0 {
		t.Errorf("inboxkeeper_policy_mismatch = %v once the table exists", v)
	}
	f.wantCount("expired rows after the first pass", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	d.stop()
}

// A signal in the middle of a batch stops the daemon cleanly: exit 0, the
// batch rolled back, and no ERROR in the log.
func TestSignalDuringBatch(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	gate := gateDeletes(t, f)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_LOCK_TIMEOUT=60s", "INBOXKEEPER_STATEMENT_TIMEOUT=60s", "INBOXKEEPER_INTERVAL=1h"), "run")
	gate.waitForBatch()
	d.signal(syscall.SIGTERM)
	if code, _ := d.exit(30 * time.Second); code != 0 {
		t.Errorf("run exited %d after SIGTERM\n%s", code, d.log())
	}
	if strings.Contains(d.log(), "level=ERROR") {
		t.Errorf("a clean shutdown logged an ERROR:\n%s", d.log())
	}
	d.waitLine(regexp.MustCompile(`msg="expiry: table stopped for shutdown"`), time.Second)
	gate.open()
	f.wantCount("rows (the interrupted batch rolled back)", allRows, "SELECT count(*) FROM public.consumer_inbox")
}

// onlyHistory says whether every series of table in the exposition is one
// that keeps its history (counters, last success), not a measured fact.
func onlyHistory(exposition, table string) bool {
	for _, line := range strings.Split(exposition, "\n") {
		if strings.Contains(line, `table="`+table+`"`) && !strings.HasPrefix(line, "#") &&
			!regexp.MustCompile(`^inboxkeeper_\w+_(total|bucket|sum|count)\{|^inboxkeeper_last_success_timestamp_seconds\{`).MatchString(line) {
			return false
		}
	}
	return true
}

// SIGHUP, and a change of the policy file's content, make run re-read the
// policy: a policy that fails its checks is not applied (the one in force
// stays, the error is logged, the reload metric says 0), a good one is, and
// SIGHUP never ends the process.
func TestReload(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	pgtest.Exec(t, f.pool, `
CREATE TABLE public.second_inbox (id int PRIMARY KEY, remember_until timestamptz);
CREATE INDEX ON public.second_inbox (remember_until);
INSERT INTO public.second_inbox SELECT i, now() - interval '1 hour' FROM generate_series(1, 7) i;`)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1h"), "run")
	addr := metricsListening.FindStringSubmatch(d.waitLine(metricsListening, 30*time.Second))[1]
	d.waitLine(passDone, 30*time.Second)
	reloadOK := func() float64 {
		return metricValue(t, httpGet(t, "http://"+addr+"/metrics"), "inboxkeeper_config_last_reload_successful")
	}
	if v := reloadOK(); v != 1 {
		t.Errorf("inboxkeeper_config_last_reload_successful = %v at start, want 1", v)
	}
	// After a pass: nothing due, counted exactly.
	m := httpGet(t, "http://"+addr+"/metrics")
	if v := metricValue(t, m, `inboxkeeper_rows_due{table="public.consumer_inbox"}`); v != 0 {
		t.Errorf("inboxkeeper_rows_due = %v after a pass, want 0", v)
	}
	if v := metricValue(t, m, `inboxkeeper_rows_due_capped{table="public.consumer_inbox"}`); v != 0 {
		t.Errorf("inboxkeeper_rows_due_capped = %v, want 0", v)
	}

	// A policy that does not parse, then one that names a missing column.
	for _, bad := range []string{"tables: [\n", strings.Replace(inboxPolicy, "scope: consumer", "scope: tenant", 1)} {
		f.writeFile("inboxkeeper.yaml", bad)
		d.signal(syscall.SIGHUP)
		d.waitLine(regexp.MustCompile(`level=ERROR msg="inboxkeeper: the policy file cannot be applied; the policy in force stays" trigger=SIGHUP`), 30*time.Second)
		if v := reloadOK(); v != 0 {
			t.Errorf("inboxkeeper_config_last_reload_successful = %v after a bad policy, want 0", v)
		}
	}
	f.wantCount("rows of the table the bad policies never applied to", 7, "SELECT count(*) FROM public.second_inbox")

	// A good policy that adds a table, picked up on SIGHUP.
	f.writeFile("inboxkeeper.yaml", inboxPolicy+`  - table: public.second_inbox
    key: [id]
    expires_at: remember_until
`)
	d.signal(syscall.SIGHUP)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: policy reloaded" trigger=SIGHUP .* tables=2`), 30*time.Second)
	if v := reloadOK(); v != 1 {
		t.Errorf("inboxkeeper_config_last_reload_successful = %v after a good policy, want 1", v)
	}
	// A policy that no longer names a table: what was measured of it is no
	// longer exported.
	f.writeFile("inboxkeeper.yaml", `tables:
  - table: public.second_inbox
    key: [id]
    expires_at: remember_until
`)
	d.signal(syscall.SIGHUP)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: policy reloaded" trigger=SIGHUP .* tables=1`), 30*time.Second)
	if m := httpGet(t, "http://"+addr+"/metrics"); strings.Contains(m, `table="public.consumer_inbox"`) && !onlyHistory(m, "public.consumer_inbox") {
		t.Errorf("a table taken out of the policy is still measured:\n%s", m)
	}
	d.stop()

	// A content change alone (a ConfigMap volume), before the next pass.
	pgtest.Exec(t, f.pool, "INSERT INTO public.second_inbox SELECT i, now() - interval '1 hour' FROM generate_series(100, 104) i")
	f.writeFile("inboxkeeper.yaml", inboxPolicy)
	d = startDaemon(t, f.dir, f.env("INBOXKEEPER_INTERVAL=300ms"), "run")
	d.waitLine(passDone, 30*time.Second)
	f.writeFile("inboxkeeper.yaml", inboxPolicy+`  - table: public.second_inbox
    key: [id]
    expires_at: remember_until
`)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: policy reloaded" trigger="file changed"`), 30*time.Second)
	d.waitLine(passDone, 30*time.Second)
	f.wantCount("rows of the table the changed policy added", 0, "SELECT count(*) FROM public.second_inbox")
	d.stop()
}
