package docs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
)

// exitCase is a row of the exit status table of commands.md: how a
// sentence of another document names the case (phrases), and how the
// test brings it about (run: a command line for bash, with more
// environment, after prepare when set).
type exitCase struct {
	phrases *regexp.Regexp
	env     []string
	prepare func(t *testing.T, s *session)
	line    string
	says    string // what the command's output says of the case
}

// exitCases are the rows of the table, by their text.
var exitCases = map[string]exitCase{
	"the command did what it was asked; `--help`; `once` against a standby, where it does nothing": {
		phrases: regexp.MustCompile(`(?i)\bon a standby\b`),
		line:    "inboxkeeper once --dry-run && inboxkeeper status --help >/dev/null",
		says:    "would delete 0",
	},
	"a table's pass failed (`once`; the other tables were still processed)": {
		phrases: regexp.MustCompile(`(?i)\btables? (that )?fail|a table failed|table's pass failed`),
		prepare: func(t *testing.T, s *session) {
			pgtest.ExecOn(t, s.ownerURL, `
CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'this table keeps its rows'; END$$;
CREATE TRIGGER refuse BEFORE DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.refuse();
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
VALUES ('c', 'gone', '\x01', now() - interval '2 days', now() - interval '2 days', now() - interval '1 day')`)
		},
		line: "inboxkeeper once",
		says: "1 of 1 tables failed",
	},
	"the database cannot be reached, or refuses for now (starting up, too many connections)": {
		phrases: regexp.MustCompile(`(?i)unreachable|cannot (be )?reach|not reachable|too many connections|starting up`),
		env:     []string{"INBOXKEEPER_DATABASE_URL=postgres://app@127.0.0.1:1/app?connect_timeout=2"},
		line:    "inboxkeeper status",
		says:    "unreachable",
	},
	"a statement refused for want of a grant (permission denied); the message names the role the command needs": {
		phrases: regexp.MustCompile(`(?i)permission denied|want of a grant|missing grant`),
		prepare: func(t *testing.T, s *session) {
			// set is the operator's: run as the daemon's login.
			s.env = append(s.env, "INBOXKEEPER_DATABASE_URL="+pgtest.ApplyRoleScript(t, s.ownerURL).Daemon)
		},
		line: "inboxkeeper set batch_size=1000 --reason night",
		says: "set needs the operator's role",
	},
	"`plan --check` found a promise the deployment does not keep": {
		phrases: regexp.MustCompile(`(?i)plan --check|promise .*not kept|does not keep`),
		prepare: func(t *testing.T, s *session) {
			// A row remembered one day where the record promises 12.
			s.appendPolicy(t, `retention:
  - { scope: shipping, table: public.consumer_inbox, consequence: medium, owner: shipping-team, margin: 2d,
      margin_reason: a late scheduler, after_expiry: a parcel is booked twice, extension: { owner: shipping-oncall },
      paths: [{ name: dead-letter redrive, stages: [{ after: 10d, from: first_seen }] }] }
`)
			pgtest.ExecOn(t, s.ownerURL, `INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
VALUES ('shipping', 'short', '\x01', now(), now(), now() + interval '1 day')`)
		},
		line: "inboxkeeper plan --check",
		says: "FAIL ",
	},
	"`hold release` or `replay finish` of an unknown or already ended id": {
		phrases: regexp.MustCompile(`(?i)unknown or already|already released|already ended`),
		line:    "inboxkeeper hold release 999",
		says:    "999",
	},
	"`hold add` or `replay start` waited `INBOXKEEPER_FENCE_TIMEOUT` for the hold fence": {
		phrases: regexp.MustCompile(`FENCE_TIMEOUT`),
		prepare: func(t *testing.T, s *session) {
			// A cleanup step in flight holds the fence against hold writers.
			tx := pgtest.Lock(t, pgtest.Connect(t, s.ownerURL), "LOCK TABLE inboxkeeper.fence IN ROW EXCLUSIVE MODE")
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		},
		env:  []string{"INBOXKEEPER_FENCE_TIMEOUT=1s"},
		line: "inboxkeeper hold add --table public.consumer_inbox --reason audit --owner legal",
		says: "waiting for the cleanup batches in flight (the hold fence)",
	},
	"`once` waited its whole `INBOXKEEPER_RUN_TIME` while another instance held the lease": {
		phrases: regexp.MustCompile(`(?i)held the lease|held it for|lease .*RUN_TIME|RUN_TIME.* lease`),
		prepare: func(t *testing.T, s *session) {
			pgtest.ExecOn(t, s.ownerURL, `INSERT INTO inboxkeeper.lease (holder, acquired_at, renewed_at, expires_at) VALUES ('elsewhere/1/1', now(), now(), now() + interval '10 minutes')`)
		},
		env:  []string{"INBOXKEEPER_RUN_TIME=1s"},
		line: "inboxkeeper once",
		says: "held the lease for the whole INBOXKEEPER_RUN_TIME",
	},
	"`once` ended while a standby of `INBOXKEEPER_REPLICA_URLS` could not be read (it waits for one at most `INBOXKEEPER_REPLICA_WAIT`)": {
		phrases: regexp.MustCompile(`REPLICA_WAIT|standby .*could not be read|could not read a standby`),
		env:     []string{"INBOXKEEPER_REPLICA_URLS=postgres://app@127.0.0.1:1/app?connect_timeout=1", "INBOXKEEPER_REPLICA_WAIT=2s"},
		line:    "inboxkeeper once",
		says:    "a standby could not be read",
	},
	"a TLS failure: a certificate its CA does not sign or made out to another host, no TLS where `sslmode` asks for it, an `sslrootcert` file that cannot be read": {
		phrases: regexp.MustCompile(`(?i)TLS|certificate|sslrootcert`),
		env:     []string{"INBOXKEEPER_DATABASE_URL=postgres://app@HOST/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt"},
		line:    "inboxkeeper status",
		says:    "/nonexistent/ca.crt",
	},
	"a bad flag or argument": {
		phrases: regexp.MustCompile(`(?i)\b(bad|unknown) flag|usage error|unexpected argument`),
		line:    "inboxkeeper status --nope",
		says:    "-nope",
	},
	"an unknown or malformed `INBOXKEEPER_*` variable": {
		phrases: regexp.MustCompile(`(?i)variable`),
		env:     []string{"INBOXKEEPER_BATCH_SIZE=lots"},
		line:    "inboxkeeper status",
		says:    "INBOXKEEPER_BATCH_SIZE",
	},
	"a policy file that cannot be read or does not parse": {
		phrases: regexp.MustCompile(`(?i)does not parse|cannot be read|malformed policy`),
		env:     []string{"INBOXKEEPER_POLICY_FILE=/nonexistent/inboxkeeper.yaml"},
		line:    "inboxkeeper status",
		says:    "INBOXKEEPER_POLICY_FILE: cannot read the policy file",
	},
	"a policy that does not match the database (a table, column or index it lacks)": {
		phrases: regexp.MustCompile(`(?i)does not match|mismatch|missing (table|column|index)|column or index`),
		prepare: func(t *testing.T, s *session) {
			s.appendPolicy(t, "  - { table: public.nope, key: [id], expires_at: remember_until }\n")
		},
		line: "inboxkeeper once --dry-run",
		says: "public.nope",
	},
	"a missing or outdated control schema": {
		phrases: regexp.MustCompile(`(?i)control schema|\bthe schema\b|migrated`),
		prepare: func(t *testing.T, s *session) {
			pgtest.ExecOn(t, s.ownerURL, "DROP SCHEMA inboxkeeper CASCADE")
		},
		line: "inboxkeeper status",
		says: "run `inboxkeeper migrate` first",
	},
	"a connection refused for a reason of the configuration's (a wrong password, an unknown role or database, no `CONNECT`)": {
		phrases: regexp.MustCompile(`(?i)password|unknown database|authentication|not allowed to connect|refused for a reason`),
		env:     []string{"INBOXKEEPER_DATABASE_URL=postgres://app@HOST/no_such_database"},
		line:    "inboxkeeper status",
		says:    "unknown database",
	},
}

// exitRow is a row of the table.
type exitRow struct {
	status int
	when   string
}

// exitTable reads the exit status table of commands.md.
func exitTable(t *testing.T) []exitRow {
	t.Helper()
	text := section(t, "reference/commands.md", "\n## Exit status\n")
	text = text[:strings.Index(text[1:], "\n## ")+1]
	var rows []exitRow
	for _, m := range regexp.MustCompile(`(?m)^\| ([012]) \| (.+) \|$`).FindAllStringSubmatch(text, -1) {
		n, _ := strconv.Atoi(m[1])
		rows = append(rows, exitRow{n, m[2]})
	}
	if len(rows) < 10 {
		t.Fatalf("reference/commands.md: the exit status table has %d rows: %v", len(rows), rows)
	}
	return rows
}

// Every row of the exit status table is brought about against a real
// PostgreSQL, and the binary exits as the row says; a row without a case
// here, or a case without its row, fails.
func TestExitStatuses(t *testing.T) {
	t.Parallel()
	rows := exitTable(t)
	for _, r := range rows {
		if _, ok := exitCases[r.when]; !ok {
			t.Errorf("reference/commands.md: the row %q has no case in exitCases", r.when)
		}
	}
	for when := range exitCases {
		if !slices.ContainsFunc(rows, func(r exitRow) bool { return r.when == when }) {
			t.Errorf("exitCases has %q, which is not a row of the table", when)
		}
	}
	bin := buildBinary(t)
	pgBin := pgBinDir(t)
	readme := blocksOf(t, "README.md")
	// One server, a database per case: the cases' roles have names of
	// their own (pgtest.ApplyRoleScript).
	server := pgtest.NewCluster(t)
	pgtest.ExecOn(t, server.URL("postgres"), "CREATE ROLE app LOGIN CREATEROLE")
	for i, r := range rows {
		c, ok := exitCases[r.when]
		if !ok {
			continue
		}
		// Named by the row's place: the name becomes a directory, which
		// the commands' lines hold unquoted.
		t.Run(fmt.Sprintf("row%d", i+1), func(t *testing.T) {
			t.Parallel()
			s := sessionOn(t, bin, pgBin, server, fmt.Sprintf("app_%d", i+1))
			s.setUp(readme)
			if c.prepare != nil {
				c.prepare(t, s)
			}
			var env []string
			for _, e := range c.env {
				env = append(env, strings.ReplaceAll(e, "HOST", s.host))
			}
			stdout, stderr, code := s.bash(c.line, env)
			if code != r.status || !strings.Contains(stdout+stderr, c.says) {
				t.Errorf("%q: %s: exit %d, saying\n%s%s\nthe table says %d, and the case %q", r.when, c.line, code, stdout, stderr, r.status, c.says)
			}
		})
	}
}

// appendPolicy adds text to the session's policy file.
func (s *session) appendPolicy(t *testing.T, text string) {
	t.Helper()
	p := filepath.Join(s.dir, "inboxkeeper.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(b, text...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// exitStatement finds the statements of an exit status: "exit status 2",
// "exits 1", "exit 2", "exit code 2", "(exit 1,".
var exitStatement = regexp.MustCompile(`(?i)\bexit(?:s|ing)?(?: with)?(?: status| code)?(?: is)? ([012])\b`)

// clauses splits text into the clauses an exit status is stated in: at a
// sentence's end, a semicolon, or a comma that a number follows ("exit
// status 2 is a configuration error, 1 a table that failed"). Not at a
// colon: "That the database is migrated: status exits 1" is one.
var clauseEnd = regexp.MustCompile(`[.;!?](\s|$)|,\s+(?:[012]\b)|\n\s*\n|\n\s*[-|#]`)

func clauses(text string) []string {
	return clauseEnd.Split(text, -1)
}

// exitProblems checks text's statements of an exit status against rows:
// a clause that states one status and names the case of rows of one
// status only must state that one. A clause that names none, or cases of
// several statuses, is not judged.
func exitProblems(text string, rows []exitRow) []string {
	out, _ := judgeExits(text, rows)
	return out
}

// judgeExits is exitProblems, and how many clauses it judged.
func judgeExits(text string, rows []exitRow) (out []string, judged int) {
	for _, cl := range clauses(text) {
		ms := exitStatement.FindAllStringSubmatch(cl, -1)
		if len(ms) != 1 {
			continue
		}
		stated, _ := strconv.Atoi(ms[0][1])
		statuses := map[int]string{}
		for _, r := range rows {
			if c, ok := exitCases[r.when]; ok && c.phrases.MatchString(cl) {
				statuses[r.status] = r.when
			}
		}
		if len(statuses) != 1 {
			continue
		}
		judged++
		for status, when := range statuses {
			if status != stated {
				out = append(out, fmt.Sprintf("%q says exit %d; the exit status table says %d for %q", strings.Join(strings.Fields(cl), " "), stated, status, when))
			}
		}
	}
	return out, judged
}

// Every document, and the comments of deploy/ and the alert rules, state
// exit statuses as the table does: a missing control schema is 2
// everywhere, never 1 in one runbook.
func TestExitStatusesInTheDocs(t *testing.T) {
	t.Parallel()
	rows := exitTable(t)
	// The checker catches what it is for: the sentences that said 1 for a
	// missing control schema.
	for _, wrong := range []string{
		"Every other command refuses an outdated control schema. `run` waits for the schema, and the other commands exit 1.",
		"That the database is migrated: `inboxkeeper status` exits 1 and says so otherwise.",
	} {
		if len(exitProblems(wrong, rows)) == 0 {
			t.Errorf("the checker passes %q", wrong)
		}
	}
	if p := exitProblems("Exit status 2 is a configuration error, 1 a table that failed.", rows); len(p) > 0 {
		t.Errorf("the checker fails a right sentence: %q", p)
	}
	checked, judged := 0, 0
	for _, file := range referencingFiles(t) {
		text := testfile.Read(t, filepath.Join(root, file))
		if file == "docs/reference/commands.md" {
			// The table's own page: its prose is checked, the table is
			// the reference.
			i := strings.Index(text, "\n## Exit status\n")
			j := strings.Index(text[i+1:], "\n## ") + i + 1
			text = text[:i] + text[j:]
		}
		checked += len(exitStatement.FindAllString(text, -1))
		problems, n := judgeExits(text, rows)
		judged += n
		for _, p := range problems {
			t.Errorf("%s: %s", file, p)
		}
	}
	if checked < 30 || judged < 20 {
		t.Errorf("found %d statements of an exit status and judged %d: the patterns no longer find them", checked, judged)
	}
	t.Logf("%d statements of an exit status, %d judged against the table", checked, judged)
}
