package main

// End-to-end tests of the inboxkeeper command: every test runs the real
// main() in a child process (exit codes, signals, concurrent processes), with
// a controlled environment, against a database of its own.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// beMain makes the test binary behave as the inboxkeeper binary: TestMain
// calls main() instead of running tests. The name must not start with
// INBOXKEEPER_, which the command would reject as an unknown variable.
//
// Re-executing the test binary rather than `go build`ing one gives a real
// process with the real main(), compiled with the test's own flags (-race,
// -cover), and leaves no binary behind: pgtest.Main ends with os.Exit, so a
// temporary directory made in TestMain could never be removed.
const beMain = "IKCLITEST_BE_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beMain) == "1" {
		main() // exits
		return
	}
	// These tests wait on child processes and PostgreSQL far more than they
	// use the CPU, so run more of them at once than GOMAXPROCS. The command
	// line is parsed later, in m.Run, so an explicit -parallel still wins.
	if f := flag.Lookup("test.parallel"); f != nil {
		_ = f.Value.Set(strconv.Itoa(max(8, runtime.GOMAXPROCS(0))))
	}
	pgtest.Main(m)
}

// exe is the program the tests run: this test binary (see beMain).
var exe = func() string {
	p, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return p
}()

// cliEnv is this process's environment without any INBOXKEEPER_* variable
// (whatever its case), the metrics listener off, and then vars, which win
// over anything before them.
func cliEnv(vars ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(strings.ToUpper(name), "INBOXKEEPER_") || name == beMain {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, beMain+"=1", "INBOXKEEPER_METRICS_ADDR=")
	return append(env, vars...)
}

// result is what one finished command did.
type result struct {
	args           []string
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("inboxkeeper %s: exit %d\n--- stdout:\n%s--- stderr:\n%s---", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// output is stdout and stderr together, for checks that apply to both.
func (r result) output() string { return r.stdout + r.stderr }

// proc is a started command whose output is collected in memory.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	args           []string
	stdout, stderr bytes.Buffer
	cancel         context.CancelFunc
}

func startCLI(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	p := &proc{t: t, args: args, cancel: cancel}
	p.cmd = exec.CommandContext(ctx, exe, args...)
	p.cmd.Env = env
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start inboxkeeper %s: %v", strings.Join(args, " "), err)
	}
	return p
}

func (p *proc) wait() result {
	p.t.Helper()
	defer p.cancel()
	err := p.cmd.Wait()
	r := result{args: p.args, stdout: p.stdout.String(), stderr: p.stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		r.code = ee.ExitCode()
	default:
		p.t.Fatalf("inboxkeeper %s did not exit normally: %v\n%s", strings.Join(p.args, " "), err, r)
	}
	return r
}

// runCLI runs the command to completion in dir.
func runCLI(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	return startCLI(t, dir, env, args...).wait()
}

// wantExit fails the test unless r exited with code and its output has every
// one of the substrings.
func wantExit(t *testing.T, r result, code int, substrings ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d\n%s", code, r)
	}
	for _, s := range substrings {
		if !strings.Contains(r.output(), s) {
			t.Fatalf("output lacks %q\n%s", s, r)
		}
	}
}

// The inbox every fixture starts with: 42 rows.
//   - billing: 10 expired (events 2026-02-01 01:00Z.. 10:00Z), 5 not expired
//   - payments: 20 expired (events 2026-01-01 01:00Z.. 20:00Z), 5 not expired
//   - 2 rows without an expiry, which never expire
//
// The oldest expired row is payments' 20th, due 2h20m ago; expiries are
// relative to the database clock, which the command uses.
const (
	inboxTable = pgtest.ShortInboxDDL // with its index
	inboxRows  = `
INSERT INTO public.consumer_inbox
SELECT c, p || '-old-' || i, first_event + i * interval '1 hour', now() - interval '2 hours' - i * interval '1 minute'
FROM (VALUES ('billing', 'b', timestamptz '2026-02-01 00:00Z', 10), ('payments', 'p', timestamptz '2026-01-01 00:00Z', 20)) v (c, p, first_event, n),
     generate_series(1, n) i;
INSERT INTO public.consumer_inbox
SELECT c, p || '-new-' || i, now(), now() + kept + i * interval '1 minute'
FROM (VALUES ('billing', 'b', interval '1 day'), ('payments', 'p', interval '2 days')) v (c, p, kept), generate_series(1, 5) i;
INSERT INTO public.consumer_inbox VALUES ('billing', 'b-forever', NULL, NULL), ('payments', 'p-forever', NULL, NULL);`

	inboxDDL = inboxTable + inboxRows

	inboxPolicy = pgtest.ShortInboxPolicy
	// Row counts of the data above.
	allRows     = 42
	expiredRows = 30
)

// fixture is a database of the test's own with an inbox table, a policy file
// and a directory to run the command in.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	url    string
	dir    string
	policy string
}

// newFixture runs ddl on a new database, writes policy as the policy file,
// and creates the control schema when migrate is true.
func newFixture(t *testing.T, ddl, policy string, migrate bool) *fixture {
	t.Helper()
	pool, url := pgtest.NewPool(t)
	f := &fixture{t: t, pool: pool, url: url, dir: t.TempDir()}
	if ddl != "" {
		pgtest.Exec(t, pool, ddl)
	}
	f.policy = f.writeFile("inboxkeeper.yaml", policy)
	if migrate {
		pgtest.Migrate(t, url)
	}
	return f
}

// inboxFixture is the usual fixture: the 42-row consumer_inbox, migrated.
func inboxFixture(t *testing.T) *fixture { return newFixture(t, inboxDDL, inboxPolicy, true) }

func (f *fixture) writeFile(name, content string) string {
	f.t.Helper()
	return writeFile(f.t, f.dir, name, content)
}

// writeFile writes content to the file name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// env is the command's environment for this fixture, plus vars.
func (f *fixture) env(vars ...string) []string {
	return cliEnv(append([]string{"INBOXKEEPER_DATABASE_URL=" + f.url, "INBOXKEEPER_POLICY_FILE=" + f.policy}, vars...)...)
}

func (f *fixture) run(args ...string) result {
	f.t.Helper()
	return runCLI(f.t, f.dir, f.env(), args...)
}

func (f *fixture) runWith(vars []string, args ...string) result {
	f.t.Helper()
	return runCLI(f.t, f.dir, f.env(vars...), args...)
}

// count runs a query returning one integer.
func (f *fixture) count(query string, args ...any) int64 {
	f.t.Helper()
	var n int64
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// wantCount fails the test unless query returns want.
func (f *fixture) wantCount(what string, want int64, query string, args ...any) {
	f.t.Helper()
	if got := f.count(query, args...); got != want {
		f.t.Errorf("%s: got %d, want %d", what, got, want)
	}
}

func (f *fixture) rows() int64 { return f.count("SELECT count(*) FROM public.consumer_inbox") }

// expiredOf counts the expired rows of one consumer still present.
func (f *fixture) expiredOf(consumer string) int64 {
	return f.count("SELECT count(*) FROM public.consumer_inbox WHERE consumer = $1 AND remember_until <= now()", consumer)
}

// resultLine finds the one-line result of `once` for table and returns its
// numbers: deleted (or would delete), protected by holds, by replays.
func resultLine(t *testing.T, r result, table, verb string) (n, holds, replays int64) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(table) + `: ` + verb +
		` (\d+), protected by holds (\d+), protected by replays (\d+), (\S+)$`)
	var found [][]string
	for _, line := range strings.Split(r.stdout, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one %q line for %s, got %d\n%s", verb, table, len(found), r)
	}
	m := found[0]
	if d, err := time.ParseDuration(m[4]); err != nil || d < 0 {
		t.Errorf("result line for %s ends in %q, not a duration\n%s", table, m[4], r)
	}
	var nums [3]int64
	for i := range nums {
		nums[i], _ = strconv.ParseInt(m[i+1], 10, 64) // digits, by the pattern
	}
	return nums[0], nums[1], nums[2]
}

// wantResult checks the `once` line for table.
func wantResult(t *testing.T, r result, table, verb string, n, holds, replays int64) {
	t.Helper()
	gn, gh, gr := resultLine(t, r, table, verb)
	if gn != n || gh != holds || gr != replays {
		t.Errorf("%s: got %s %d, holds %d, replays %d; want %d, %d, %d\n%s", table, verb, gn, gh, gr, n, holds, replays, r)
	}
}

// wantOnce runs `once --dry-run`, then `once`, and wants both to succeed
// with the same result line for table: n rows (would be) deleted, holds and
// replays rows kept.
func (f *fixture) wantOnce(table string, n, holds, replays int64) {
	f.t.Helper()
	r := f.run("once", "--dry-run")
	wantExit(f.t, r, 0)
	wantResult(f.t, r, table, "would delete", n, holds, replays)
	r = f.run("once")
	wantExit(f.t, r, 0)
	wantResult(f.t, r, table, "deleted", n, holds, replays)
}

// daemon is a long-running command whose stderr is read line by line while it
// runs, so tests can wait for a log line instead of sleeping.
type daemon struct {
	t   *testing.T
	cmd *exec.Cmd

	mu      sync.Mutex
	lines   []string
	next    int           // first line waitLine has not looked at
	eof     bool          // stderr closed: the process is gone
	changed chan struct{} // closed and replaced whenever lines or eof change

	done    chan struct{} // closed when the process has exited
	waitErr error
}

func startDaemon(t *testing.T, dir string, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, changed: make(chan struct{}), done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(exe, args...)
	// Debug unless the test says otherwise (a later value wins): a pass
	// that goes as planned says "pass done" only there, and the tests wait
	// for it.
	d.cmd.Env, d.cmd.Dir = append([]string{"INBOXKEEPER_LOG_LEVEL=debug"}, env...), dir
	d.cmd.Stderr = pw // stdout is discarded: the daemon logs to stderr
	err = d.cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		t.Fatal(err)
	}
	go d.read(pr)
	go func() {
		d.waitErr = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

func (d *daemon) read(r *os.File) {
	defer r.Close()
	var partial []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		partial = append(partial, buf[:n]...)
		var complete []string
		for {
			i := bytes.IndexByte(partial, '\n')
			if i < 0 {
				break
			}
			complete = append(complete, string(partial[:i]))
			partial = partial[i+1:]
		}
		d.mu.Lock()
		d.lines = append(d.lines, complete...)
		if err != nil {
			if len(partial) > 0 {
				d.lines = append(d.lines, string(partial))
			}
			d.eof = true
		}
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// log is everything the daemon wrote to stderr so far.
func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.lines, "\n")
}

// waitLine returns the first line matching re after the last line an earlier
// waitLine returned, waiting at most timeout for it.
func (d *daemon) waitLine(re *regexp.Regexp, timeout time.Duration) string {
	d.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	d.mu.Lock()
	for {
		for d.next < len(d.lines) {
			line := d.lines[d.next]
			d.next++
			if re.MatchString(line) {
				d.mu.Unlock()
				return line
			}
		}
		if d.eof {
			d.mu.Unlock()
			d.t.Fatalf("the process ended before logging a line matching %s\nstderr:\n%s", re, d.log())
		}
		changed := d.changed
		d.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			d.t.Fatalf("no line matching %s within %s\nstderr:\n%s", re, timeout, d.log())
		}
		d.mu.Lock()
	}
}

func (d *daemon) signal(sig syscall.Signal) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatalf("signal %v: %v", sig, err)
	}
}

// stop sends SIGTERM and expects a clean exit (status 0) within 30 s.
func (d *daemon) stop() {
	d.t.Helper()
	d.signal(syscall.SIGTERM)
	if code, _ := d.exit(30 * time.Second); code != 0 {
		d.t.Errorf("run exited %d after SIGTERM\n%s", code, d.log())
	}
}

// exit waits at most timeout for the process to end and returns its exit
// code and how long the wait took.
func (d *daemon) exit(timeout time.Duration) (int, time.Duration) {
	d.t.Helper()
	start := time.Now()
	select {
	case <-d.done:
	case <-time.After(timeout):
		_ = d.cmd.Process.Kill()
		<-d.done
		d.t.Fatalf("the process did not exit within %s\nstderr:\n%s", timeout, d.log())
	}
	// The stderr reader may still be draining the pipe; the log is complete
	// once it has seen the end.
	for {
		d.mu.Lock()
		eof, changed := d.eof, d.changed
		d.mu.Unlock()
		if eof {
			break
		}
		<-changed
	}
	var ee *exec.ExitError
	switch {
	case d.waitErr == nil:
		return 0, time.Since(start)
	case errors.As(d.waitErr, &ee) && ee.Exited():
		return ee.ExitCode(), time.Since(start)
	}
	d.t.Fatalf("the process did not exit normally: %v\nstderr:\n%s", d.waitErr, d.log())
	return -1, 0
}
