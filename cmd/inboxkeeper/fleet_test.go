package main

import (
	"bufio"
	"context"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

var (
	activeLogged  = regexp.MustCompile(`msg="inboxkeeper: active"`)
	waitingLogged = regexp.MustCompile(`msg="inboxkeeper: another instance is active; waiting"`)
	standbyLogged = regexp.MustCompile(`msg="inboxkeeper: the database is a standby`)
	downLogged    = regexp.MustCompile(`msg="inboxkeeper: the database does not answer|expiry: table failed`)
)

// clusterFixture is a cluster of the test's own (for tests that stop,
// restart or replicate it), with the usual inbox in its database
// "postgres", migrated, and the policy file in a directory to run in.
func clusterFixture(t *testing.T) (c *pgcluster.Cluster, dir, policyFile string) {
	t.Helper()
	ctx := context.Background()
	c = pgtest.NewCluster(t)
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, inboxDDL); err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	policyFile = writeFile(t, dir, "inboxkeeper.yaml", inboxPolicy)
	env := cliEnv("INBOXKEEPER_DATABASE_URL="+c.URL("postgres"), "INBOXKEEPER_POLICY_FILE="+policyFile)
	wantExit(t, runCLI(t, dir, env, "migrate"), 0)
	return c, dir, policyFile
}

func metricsAddr(t *testing.T, d *daemon) string {
	t.Helper()
	return metricsListening.FindStringSubmatch(d.waitLine(metricsListening, 30*time.Second))[1]
}

// Two daemons on one database: exactly one works, the other waits and says
// so, and takes over when the first stops.
func TestTwoInstancesOneActive(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	env := f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_SCHEDULE=@every 1s", "INBOXKEEPER_LEASE_TTL=3s")
	a := startDaemon(t, f.dir, env, "run")
	addrA := metricsAddr(t, a)
	a.waitLine(activeLogged, 30*time.Second)
	a.waitLine(passDone, 30*time.Second)

	b := startDaemon(t, f.dir, env, "run")
	addrB := metricsAddr(t, b)
	b.waitLine(waitingLogged, 30*time.Second)
	if v := metricValue(t, httpGet(t, "http://"+addrB+"/metrics"), "inboxkeeper_active"); v != 0 {
		t.Errorf("the waiting instance reports inboxkeeper_active %v", v)
	}
	if v := metricValue(t, httpGet(t, "http://"+addrA+"/metrics"), "inboxkeeper_active"); v != 1 {
		t.Errorf("the working instance reports inboxkeeper_active %v", v)
	}

	a.signal(syscall.SIGTERM)
	if code, _ := a.exit(10 * time.Second); code != 0 {
		t.Fatalf("first instance exit %d\n%s", code, a.log())
	}
	// The first one released the lease on the way out: the second takes
	// over at its next pass, without waiting for the lease to run out.
	b.waitLine(activeLogged, 30*time.Second)
	b.waitLine(passDone, 30*time.Second)
	b.signal(syscall.SIGTERM)
	if code, _ := b.exit(10 * time.Second); code != 0 {
		t.Fatalf("second instance exit %d\n%s", code, b.log())
	}
}

// Beside a standby the daemon does nothing and says so in logs and metrics,
// and starts working when the standby is promoted.
func TestStandbyThenPromoted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, dir, pol := clusterFixture(t)
	standby := pgtest.NewStandby(t, primary, nil)

	env := cliEnv("INBOXKEEPER_DATABASE_URL="+standby.URL("postgres"), "INBOXKEEPER_POLICY_FILE="+pol,
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_SCHEDULE=@every 1s")
	wantExit(t, runCLI(t, dir, env, "once"), 0, "standby")
	d := startDaemon(t, dir, env, "run")
	addr := metricsAddr(t, d)
	d.waitLine(standbyLogged, 30*time.Second)
	m := httpGet(t, "http://"+addr+"/metrics")
	if metricValue(t, m, "inboxkeeper_in_recovery") != 1 || metricValue(t, m, "inboxkeeper_active") != 0 {
		t.Errorf("on a standby: in_recovery/active metrics wrong\n%s", m)
	}

	if err := primary.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	sconn := pgtest.Connect(t, standby.URL("postgres"))
	pgtest.Exec(t, sconn, "SELECT pg_promote()")
	d.waitLine(activeLogged, 30*time.Second)
	d.waitLine(passDone, 30*time.Second)
	var left int
	if err := sconn.QueryRow(ctx, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d expired rows left on the promoted standby (%v)", left, err)
	}
	d.stop()
}

// The database restarts under a running daemon: it notices, counts the
// failure, does not exit, and cleans again once the database is back.
func TestDatabaseRestartUnderDaemon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, dir, pol := clusterFixture(t)
	url := c.URL("postgres")
	env := cliEnv("INBOXKEEPER_DATABASE_URL="+url, "INBOXKEEPER_POLICY_FILE="+pol,
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_SCHEDULE=@every 1s")
	d := startDaemon(t, dir, env, "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)

	if err := c.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	d.waitLine(downLogged, 30*time.Second)
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO public.consumer_inbox SELECT 'late', 'l-' || i, now(), now() - interval '1 minute' FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	// Wait for a pass that starts after the insert and succeeds.
	deadline := time.Now().Add(60 * time.Second)
	for {
		d.waitLine(passDone, 60*time.Second)
		var left int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d expired rows still there a minute after the restart\n%s", left, d.log())
		}
	}
	m := httpGet(t, "http://"+addr+"/metrics")
	if metricValue(t, m, `inboxkeeper_passes_total{outcome="failed"}`)+metricValue(t, m, `inboxkeeper_passes_total{outcome="partial"}`) < 1 {
		t.Errorf("the outage was not counted\n%s", m)
	}
	// A restart is not a configuration problem: no line sends the DBA to
	// the role's privileges or says the settings are wrong. A table that
	// failed on it (the passes while the lease was still held) is a
	// warning, and counted as a connection error.
	tableFailed := false
	for _, line := range strings.Split(d.log(), "\n") {
		if strings.Contains(line, "UPDATE privilege") ||
			strings.Contains(line, "level=ERROR") && strings.Contains(line, "runtime settings") {
			t.Errorf("a restart logged as a configuration problem: %s", line)
		}
		if strings.Contains(line, "expiry: table failed") {
			tableFailed = true
			if !strings.Contains(line, "level=WARN") {
				t.Errorf("a table that failed on the restart, logged above a warning: %s", line)
			}
		}
	}
	t.Logf("a table failed during the outage: %v", tableFailed)
	if tableFailed && metricValue(t, m, `inboxkeeper_errors_total{kind="connection",table="public.consumer_inbox"}`) < 1 {
		t.Errorf("a table failed on the restart, but no connection error was counted\n%s", m)
	}
	d.stop()
}

func TestStatusJSON(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	wantExit(t, f.run("hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--reason", "r", "--owner", "o"), 0)
	r := f.run("status", "--json")
	wantExit(t, r, 0)
	got := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	if got.InRecovery || len(got.Tables) != 1 || got.Tables[0].Table != "public.consumer_inbox" || got.Tables[0].Rows == nil || got.Throttle.Throttled {
		t.Fatalf("status --json: %+v\n%s", got, r.stdout)
	}
	// billing's 10 expired rows are held; payments' 20 are due.
	if rows := got.Tables[0].Rows; rows.Due != expiredRows-10 || rows.ProtectedByHolds != 10 || got.Tables[0].CleanupLagSeconds < 7000 ||
		len(rows.Holds) != 1 || rows.Holds[0].Scope == nil || *rows.Holds[0].Scope != "billing" {
		t.Errorf("status --json: %+v\n%s", rows, r.stdout)
	}
	// Lists are [] when empty, never null (decodeOutput checks the types):
	// replays here, signals, and the lists of a partitioned table.
	p := newFixture(t, partitionedDDL, partitionedPolicy, true)
	decodeOutput[render.StatusJSON](t, "status --json", p.run("status", "--json"), nil)
}

// once waits while a daemon holds the lease, and RUN_TIME bounds the wait.
func TestOnceWaitsForTheLease(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=", "INBOXKEEPER_INTERVAL=1h", "INBOXKEEPER_LEASE_TTL=3s"), "run")
	d.waitLine(passDone, 30*time.Second)
	f.pool.Exec(context.Background(), `INSERT INTO public.consumer_inbox VALUES ('late', 'l1', now(), now() - interval '1 minute')`)
	r := f.runWith([]string{"INBOXKEEPER_RUN_TIME=2s", "INBOXKEEPER_LEASE_TTL=3s"}, "once")
	wantExit(t, r, 1, "held the lease", "nothing deleted")
	f.wantCount("the expired row once did not take", 1, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	d.stop()
	// With the daemon gone (and its lease released), once works.
	wantExit(t, f.run("once"), 0, "deleted 1")
}

// status --watch redraws until interrupted, and shows how the due count
// moves (falling, with when it would reach 0, or rising), from exact counts
// between rounds.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	cmd := exec.Command(exe, "status", "--watch", "200ms")
	cmd.Env, cmd.Dir = f.env(), f.dir
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(re *regexp.Regexp) string {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("status --watch ended before a line matching %s", re)
				}
				if re.MatchString(l) {
					return l
				}
			case <-deadline:
				t.Fatalf("no line matching %s within 30s", re)
			}
		}
	}
	round := regexp.MustCompile(`^--- \d{4}-`)
	next(round)
	next(regexp.MustCompile(`^  due \(deletable now\): +30$`))
	// Rows go between rounds, as a daemon would delete them.
	pgtest.Exec(t, f.pool, "DELETE FROM public.consumer_inbox WHERE consumer = 'billing' AND remember_until <= now()")
	next(regexp.MustCompile(`^  due \(deletable now\): +20$`))
	next(regexp.MustCompile(`^  due rows \(last minute\): +falling by [1-9]\d*/s, gone in about `))
	// Rows falling due faster than they go: the count rises, and no ETA.
	pgtest.Exec(t, f.pool, "INSERT INTO public.consumer_inbox SELECT 'billing', 'late' || i, now(), now() - interval '1 hour' FROM generate_series(1, 500) i")
	next(regexp.MustCompile(`^  due rows \(last minute\): +rising by [1-9]\d*/s: rows fall due faster than they go$`))
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("status --watch after SIGTERM: %v", err)
	}
}

// status --watch takes its interval after it or after "=", and its
// mistakes are named as such: --watch=3s is not "an invalid boolean", and
// --json after an interval is not "an unexpected argument".
func TestStatusWatchUsage(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	for args, want := range map[string]string{
		"--watch=3s --json":  "--watch and --json do not go together",
		"--watch 1s --json":  "--watch and --json do not go together",
		"--json --watch 1s":  "--watch and --json do not go together",
		"--watch=abc":        `status --watch "abc": want an interval such as 2s or 1m (at least 100ms)`,
		"--watch 5ms":        `status --watch "5ms": want an interval such as 2s or 1m (at least 100ms)`,
		"--watch=1s 2s":      `status --watch takes one interval, not "1s 2s"`,
		"2s":                 `status: unexpected argument "2s"`,
		"--watch=false --no": "flag provided but not defined: -no",
	} {
		wantExit(t, f.run(append([]string{"status"}, strings.Fields(args)...)...), 2, want)
	}
	wantExit(t, f.run("status", "--watch=false"), 0, "  due (deletable now):")
}
