package main

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/redistest"
)

func TestUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	r := runCLI(t, dir, cliEnv())
	wantExit(t, r, 2, "Usage:", "inboxkeeper migrate")

	r = runCLI(t, dir, cliEnv(), "frobnicate")
	wantExit(t, r, 2, `unknown command "frobnicate"`, "Usage:")

	for _, arg := range []string{"help", "-h", "--help"} {
		r = runCLI(t, dir, cliEnv(), arg)
		wantExit(t, r, 0, "Usage:")
	}

	for _, arg := range []string{"version", "--version"} {
		r = runCLI(t, dir, cliEnv(), arg)
		wantExit(t, r, 0)
		if !strings.HasPrefix(r.stdout, "inboxkeeper") {
			t.Errorf("version output does not start with inboxkeeper\n%s", r)
		}
	}

	// Subcommands without their subcommand, or with an unknown one.
	for _, args := range [][]string{{"hold"}, {"hold", "frob"}, {"replay"}, {"replay", "frob"}} {
		r = runCLI(t, dir, cliEnv(), args...)
		wantExit(t, r, 2)
	}
}

func TestHelpEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	// Every connection string the command accepts gets a password.
	vars := []string{"INBOXKEEPER_BATCH_SIZE=123", "INBOXKEEPER_LOG_LEVEL=debug"}
	for _, name := range config.KnownVariables() {
		if strings.HasSuffix(name, "_URL") || strings.HasSuffix(name, "_URLS") {
			vars = append(vars, name+"=postgres://u:s3cret@host/db")
		}
	}
	r := runCLI(t, dir, cliEnv(vars...), "help", "env")
	wantExit(t, r, 0)
	for _, name := range config.KnownVariables() {
		if !strings.Contains(r.stdout, name) {
			t.Errorf("help env lacks %s\n%s", name, r)
		}
	}
	for _, want := range []string{
		`(?m)^INBOXKEEPER_DATABASE_URL\s+postgres://u:\*\*\*@host/db\s`,
		`(?m)^INBOXKEEPER_BATCH_SIZE\s+123\s+5000\s`,
		`(?m)^INBOXKEEPER_LOG_LEVEL\s+debug\s+info\s`,
		`(?m)^INBOXKEEPER_METRICS_ADDR\s+\(empty: no listener\)\s+127\.0\.0\.1:9610\s`,
		`(?m)^INBOXKEEPER_POLICY_FILE\s+\./inboxkeeper\.yaml\s`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("help env does not match %s\n%s", want, r)
		}
	}
	if strings.Contains(r.output(), "s3cret") {
		t.Errorf("help env shows the password\n%s", r)
	}

	// The keyword/value form loses its password too.
	r = runCLI(t, dir, cliEnv("INBOXKEEPER_DATABASE_URL=host=db.example user=u password=s3cret dbname=inbox", "INBOXKEEPER_RUN_TIME=1d12h"), "help", "env")
	wantExit(t, r, 0, "host=db.example")
	if strings.Contains(r.output(), "s3cret") {
		t.Errorf("help env shows the password\n%s", r)
	}
	// What an empty value means, each its own (the session URL
	// falls back to DATABASE_URL, not to libpq's variables); durations in
	// the one grammar.
	for _, want := range []string{
		`(?m)^INBOXKEEPER_SESSION_DATABASE_URL\s+\(empty: DATABASE_URL\)\s+\(empty: DATABASE_URL\)\s`,
		`(?m)^INBOXKEEPER_REPLICA_URLS\s+\(empty: none\)\s`,
		`(?m)^INBOXKEEPER_RUN_TIME\s+1d12h\s+0s\s`,
		`(?m)^INBOXKEEPER_INTERVAL\s+1m\s+1m\s`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("help env does not match %s\n%s", want, r)
		}
	}

	// With a bad environment the table is still shown, the problems follow,
	// and the exit says configuration error.
	r = runCLI(t, dir, cliEnv("INBOXKEEPER_BATCHSIZE=10", "INBOXKEEPER_DATABASE_URL=postgres://u:s3cret@host/db"), "help", "env")
	wantExit(t, r, 2, "INBOXKEEPER_BATCH_SIZE", "INBOXKEEPER_BATCHSIZE", "unknown variable")
	if strings.Contains(r.output(), "s3cret") {
		t.Errorf("help env shows the password\n%s", r)
	}
}

// A connection string with a password, pointing at a port nothing listens
// on: every command fails (exit 1) and no output shows the password, even at
// debug level.
func TestPasswordNeverShown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := redistest.FreePort(t)
	policy := writeFile(t, dir, "inboxkeeper.yaml", inboxPolicy)
	urls := []struct {
		name, url string
		code      int
	}{
		{"url", fmt.Sprintf("postgres://u:s3cret@127.0.0.1:%d/db?sslmode=disable&connect_timeout=5", port), 1},
		{"url-query", fmt.Sprintf("postgresql://u@127.0.0.1:%d/db?password=s3cret&sslmode=disable", port), 1},
		{"keywords", fmt.Sprintf("host=127.0.0.1 port=%d user=u password=s3cret dbname=db sslmode=disable", port), 1},
		{"quoted-keywords", fmt.Sprintf("host=127.0.0.1 port=%d user=u password='s3cret x' dbname=db sslmode=disable", port), 1},
		// pgx cannot parse this one: a configuration error, still redacted.
		{"unparseable", "postgres://u:s3cret@127.0.0.1:notaport/db", 2},
	}
	// migrate connects on its own; the others share one way to connect, but
	// reach it from different places. `run` waits for the database instead
	// of exiting: it is checked below.
	commands := [][]string{
		{"migrate"}, {"once"}, {"hold", "list"},
		{"hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o"},
	}
	for _, u := range urls {
		t.Run(u.name, func(t *testing.T) {
			t.Parallel()
			env := cliEnv("INBOXKEEPER_DATABASE_URL="+u.url, "INBOXKEEPER_POLICY_FILE="+policy, "INBOXKEEPER_LOG_LEVEL=debug")
			for _, args := range commands {
				r := runCLI(t, dir, env, args...)
				if r.code != u.code {
					t.Errorf("want exit %d\n%s", u.code, r)
				}
				if strings.Contains(r.output(), "s3cret") {
					t.Errorf("the password is shown\n%s", r)
				}
				if u.code == 1 && !strings.Contains(r.stderr, fmt.Sprint(port)) {
					t.Errorf("the error does not say where it tried to connect\n%s", r)
				}
			}
			if u.code != 1 {
				return
			}
			// The daemon keeps waiting for its database, and says so.
			d := startDaemon(t, dir, env, "run")
			line := d.waitLine(waitingForDB, 30*time.Second)
			if !strings.Contains(line, fmt.Sprint(port)) {
				t.Errorf("the wait does not say where it tries to connect: %s", line)
			}
			d.signal(syscall.SIGTERM)
			if code, _ := d.exit(10 * time.Second); code != 0 {
				t.Errorf("run exited %d after SIGTERM while waiting\n%s", code, d.log())
			}
			if strings.Contains(d.log(), "s3cret") {
				t.Errorf("run shows the password\n%s", d.log())
			}
		})
	}
}

var waitingForDB = regexp.MustCompile(`msg="inboxkeeper: waiting for the database"`)

// Every command that takes no positional argument refuses one instead of
// ignoring it: a user who writes `status public.consumer_inbox` must not get
// the status of every table as if the argument were honoured.
func TestUnexpectedArguments(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	for _, args := range [][]string{
		{"migrate", "extra"},
		{"once", "extra"},
		{"once", "--dry-run", "extra"},
		{"run", "extra"},
		{"demo", "extra"},
		{"status", "public.consumer_inbox"},
		{"hold", "list", "extra"},
		{"hold", "release", "1", "2"},
		{"hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o", "extra"},
		{"replay", "list", "extra"},
		{"replay", "finish", "1", "2"},
		{"replay", "start", "--table", "public.consumer_inbox", "--scope", "s", "--from", "2026-01-01T00:00:00Z",
			"--to", "2026-01-02T00:00:00Z", "--owner", "o", "extra"},
		{"once", "--no-such-flag"},
		{"status", "--no-such-flag"},
	} {
		r := f.run(args...)
		if r.code != 2 {
			t.Errorf("want exit 2\n%s", r)
		}
	}
	f.wantCount("rows", allRows, "SELECT count(*) FROM public.consumer_inbox")
	f.wantCount("holds", 0, "SELECT count(*) FROM inboxkeeper.holds")
	f.wantCount("replays", 0, "SELECT count(*) FROM inboxkeeper.replays")
}

// commandsInUsage are the commands and subcommands the top-level usage
// lists ("once", "hold add", "help env"), with the flags its line names.
func commandsInUsage() map[string][]string {
	cmds := map[string][]string{}
	word := regexp.MustCompile(`^[a-z][a-z-]*$`)
	flagRE := regexp.MustCompile(`--([a-z][a-z-]*)`)
	gap := regexp.MustCompile(`\s{2,}`) // between the syntax and what it does
	for _, line := range strings.Split(usage, "\n") {
		line = gap.Split(strings.TrimSpace(line), 2)[0]
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "inboxkeeper" {
			continue
		}
		name := fields[1]
		if len(fields) > 2 && word.MatchString(fields[2]) {
			name += " " + fields[2]
		}
		for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
			cmds[name] = append(cmds[name], m[1])
		}
		if _, ok := cmds[name]; !ok {
			cmds[name] = nil
		}
	}
	return cmds
}

// Every command and subcommand answers --help and -h with its usage and
// every flag, exit 0, even with a broken environment, and touches nothing.
func TestHelpForEveryCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmds := commandsInUsage()
	if len(cmds) < 15 {
		t.Fatalf("found only %d commands in the usage: %v", len(cmds), cmds)
	}
	for name, flags := range cmds {
		for _, h := range []string{"--help", "-h"} {
			args := append(strings.Fields(name), h)
			r := runCLI(t, dir, cliEnv("INBOXKEEPER_NO_SUCH_SETTING=1", "INBOXKEEPER_DATABASE_URL=postgres://127.0.0.1:1/x"), args...)
			wantExit(t, r, 0, "Usage:\n  inboxkeeper "+name)
			for _, f := range flags {
				if !strings.Contains(r.stdout, "\n  -"+f+" ") && !strings.Contains(r.stdout, "\n  -"+f+"\n") {
					t.Errorf("inboxkeeper %s %s does not describe --%s\n%s", name, h, f, r)
				}
			}
		}
	}
}

// A policy file that cannot be read is named by its variable, for every
// command that reads one: the default, ./inboxkeeper.yaml, is relative to
// wherever the command runs.
func TestUnreadablePolicyFileNamesItsVariable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, env := range [][]string{{"INBOXKEEPER_POLICY_FILE=" + dir + "/missing.yaml"}, nil} {
		for _, args := range [][]string{{"status"}, {"once", "--dry-run"}, {"settings"}, {"plan"}} {
			r := runCLI(t, dir, cliEnv(append(env, "INBOXKEEPER_DATABASE_URL=postgres://nobody@127.0.0.1:1/none")...), args...)
			wantExit(t, r, 2, "INBOXKEEPER_POLICY_FILE: cannot read the policy file ", ": no such file or directory")
		}
	}
}

// A command refused for want of a grant says which role of role.sql it
// needs: set and hold add run as the daemon's login are the operator's.
func TestPermissionErrorsNameTheRole(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	roles := pgtest.ApplyRoleScript(t, f.url, map[string]string{"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until"})
	asDaemon := []string{"INBOXKEEPER_DATABASE_URL=" + roles.Daemon}
	for _, args := range [][]string{
		{"set", "batch_size=1000", "--reason", "r"},
		{"hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o"},
		{"pause", "--reason", "r"},
	} {
		r := f.runWith(asDaemon, args...)
		wantExit(t, r, 1, "permission denied", "needs the operator's role (inboxkeeper_operator in deploy/sql/role.sql)")
	}
}
