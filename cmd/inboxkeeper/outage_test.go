package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

var (
	outageSaid = regexp.MustCompile(`level=WARN msg="inboxkeeper: the database does not answer; passes are skipped`)
	outageEnd  = regexp.MustCompile(`level=INFO msg="inboxkeeper: the database answers again; passes resume" down_for=\S+ passes_failed=(\d+)`)
	// loggedLine is a line written at the default level, INFO: the test
	// runs the daemon at DEBUG to see each pass end, and counts what an
	// operator would read.
	loggedLine = regexp.MustCompile(`level=(INFO|WARN|ERROR) `)
	// passWentThrough is the (debug) line of a pass that went as planned.
	passWentThrough = regexp.MustCompile(`msg="inboxkeeper: pass done" outcome=ok`)
)

// An outage of the database is a few lines, however long it lasts: one
// WARN when it starts (with the tables it holds back), one INFO when it
// ends (how long, how many passes failed), and the lease lost and taken
// again on the way; every pass meanwhile is counted, not logged. Two
// tables at INTERVAL=1s, as the outage was first measured: on e58e20f an
// 8-second outage wrote 46 lines at the default LEASE_TTL (five a pass
// while the lease was held: the settings, and each table's count and
// failure), and this test's first outage (LEASE_TTL=5s) 16; it failed there.
//
// The second outage, twice as long, must write no more lines than the
// first. Both outlast LEASE_TTL, so both lose the lease; after that nothing
// new can happen: every pass, lease attempt and throttle reading is the
// same failure, counted. A 2-minute outage is therefore the same lines as
// the second: 4 on 2026-12-07 (two tables, INTERVAL=1s, the database
// stopped for 120 s under inboxkeeper run: the outage's WARN, the lease's
// WARN, and their two INFO ends); a 2-minute test is too slow for CI.
func TestOutageIsAFewLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, dir, pol := clusterFixture(t)
	url := c.URL("postgres")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE public.second_inbox (id int PRIMARY KEY, remember_until timestamptz);
CREATE INDEX ON public.second_inbox (remember_until);`)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "inboxkeeper.yaml", inboxPolicy+`  - table: public.second_inbox
    key: [id]
    expires_at: remember_until
`)
	env := cliEnv("INBOXKEEPER_DATABASE_URL="+url, "INBOXKEEPER_POLICY_FILE="+pol,
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1s", "INBOXKEEPER_LEASE_TTL=5s")
	d := startDaemon(t, dir, env, "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)

	first := outageLines(t, d, c, addr, 8)
	second := outageLines(t, d, c, addr, 16)
	// Each says when it started, and when it ended, with the passes it
	// failed.
	for i, lines := range [][]string{first, second} {
		all := strings.Join(lines, "\n")
		if end := outageEnd.FindStringSubmatch(all); !outageSaid.MatchString(all) || end == nil || end[1] == "0" {
			t.Errorf("outage %d: no line saying it started, or none saying it ended with the passes it failed:\n%s", i+1, all)
		}
	}
	t.Logf("an outage of 8 passes: %d lines; of 16 passes: %d lines\n%s\n--\n%s", len(first), len(second), strings.Join(first, "\n"), strings.Join(second, "\n"))
	if len(first) > 10 {
		t.Errorf("an outage of 8 passes at INTERVAL=1s wrote %d lines, want at most 10:\n%s", len(first), strings.Join(first, "\n"))
	}
	if len(second) > len(first) {
		t.Errorf("an outage twice as long wrote more lines (%d) than the first (%d):\n%s", len(second), len(first), strings.Join(second, "\n"))
	}
	d.stop()
}

// outageLines stops the database right after a pass ended (so that none is
// in flight), waits until passes more passes have failed, starts it
// again, and returns the lines the daemon logged at INFO or above from the
// stop until a pass went through again. It waits on the metrics, not on
// lines, so that it counts the lines of any build.
func outageLines(t *testing.T, d *daemon, c *pgcluster.Cluster, addr string, passes int) []string {
	t.Helper()
	ctx := context.Background()
	count := func(outcome string) float64 {
		return metricValue(t, httpGet(t, "http://"+addr+"/metrics"), `inboxkeeper_passes_total{outcome="`+outcome+`"}`)
	}
	failed, ok := count("failed"), count("ok")
	d.waitLine(passDone, 30*time.Second)
	from := d.mark()
	if err := c.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Duration(passes)*5*time.Second, "failed passes", func() bool { return count("failed")-failed >= float64(passes) })
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "a pass that went through", func() bool { return count("ok") > ok })
	// Its line comes after what the daemon said as it began.
	d.waitLine(passWentThrough, 30*time.Second)
	var lines []string
	for _, l := range d.linesSince(from) {
		if loggedLine.MatchString(l) {
			lines = append(lines, l)
		}
	}
	return lines
}

// waitUntil polls cond every 200 ms until it holds, failing the test after
// timeout: for a condition read over HTTP, where a tighter poll would
// load the daemon it measures.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// mark is where the log is now: linesSince(mark) are the lines after it.
func (d *daemon) mark() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.lines)
}

func (d *daemon) linesSince(mark int) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.lines[mark:]...)
}

// A listed standby that goes away is a few lines too, however many passes
// it holds back: the collector says once that it cannot be read, the
// throttle once that it pauses; when it is back, once each that it works
// again and that the throttle resumes. Passes that RUN_TIME ends while the
// throttle holds them say nothing more at INFO. On e58e20f each such pass
// wrote two lines ("expiry: table done" stopped early, "pass done"
// partial): 15 lines for this test's 6 passes.
func TestStandbyOutageIsAFewLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, dir, pol := clusterFixture(t)
	s := pgtest.NewStandby(t, c, nil)
	env := cliEnv("INBOXKEEPER_DATABASE_URL="+c.URL("postgres"), "INBOXKEEPER_POLICY_FILE="+pol, "INBOXKEEPER_REPLICA_URLS="+s.URL("postgres"),
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1s", "INBOXKEEPER_RUN_TIME=1s")
	d := startDaemon(t, dir, env, "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	due := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	pgtest.WaitFor(t, 30*time.Second, "the first passes to delete what was due", func() bool { return due() == 0 })
	partial := func() float64 {
		return metricValue(t, httpGet(t, "http://"+addr+"/metrics"), `inboxkeeper_passes_total{outcome="partial"}`)
	}
	before := partial()
	from := d.mark()
	if err := s.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO public.consumer_inbox SELECT 'late', 'l-' || i, now(), now() - interval '1 minute' FROM generate_series(1, 100) i`); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "6 passes held back", func() bool { return partial()-before >= 6 })
	if err := s.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "the rows deleted once the standby is back", func() bool { return due() == 0 })
	var lines []string
	for _, l := range d.linesSince(from) {
		if loggedLine.MatchString(l) {
			lines = append(lines, l)
		}
	}
	all := strings.Join(lines, "\n")
	t.Logf("%d lines for 6 passes held back:\n%s", len(lines), all)
	if len(lines) > 6 {
		t.Errorf("a standby gone for 6 passes wrote %d lines, want at most 6", len(lines))
	}
	for _, msg := range []string{"throttle: a listed standby cannot be read", "throttle: pausing", "throttle: a listed standby can be read again", "throttle: resuming"} {
		if n := strings.Count(all, `msg="`+msg); n != 1 {
			t.Errorf("%q said %d times, want once", msg, n)
		}
	}
	d.stop()
}
