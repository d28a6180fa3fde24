package main

// One surface: Every command, value, metric and page says the
// same thing; each test retries an item as a new user would.

import (
	"encoding/json"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/jsondoc"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/redistest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
	"github.com/jackc/pgx/v5"
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
		`(?m)^  batch_pause\s+0s\s+\(default, this shell\)$`, // no daemon publishes its environment
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

// set against a lower layer: a higher layer's bound bounds what lower
// layers give, only a contradiction within one layer is refused, and
// settings says where each part of the value in force comes from.
func TestSetBoundsLowerLayers(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	env := []string{"INBOXKEEPER_BATCH_SIZE=500"}
	wantExit(t, f.runWith(env, "set", "--table", "public.consumer_inbox", "batch_size_max=123", "--reason", "a small table"), 0,
		"public.consumer_inbox batch_size_max: (not set) -> 123")
	r := f.runWith(env, "settings")
	wantExit(t, r, 0)
	for _, want := range []string{
		`(?m)^global\n  batch_size\s+500\s+\(environment, this shell\)$`, // no daemon publishes its environment
		`(?m)^  batch_size\s+123\s+\(environment 500, bounded by batch_size_max from table setting, this shell\)$`,
		`(?m)^  batch_size_max\s+123\s+\(table setting\)$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("settings does not match %s\n%s", want, r)
		}
	}
	wantExit(t, f.runWith(env, "status"), 0,
		"  settings:                 batch_size=123 (environment 500, bounded by batch_size_max from table setting, this shell), batch_size_max=123 (table setting)\n")
	// The pass runs with it: its batches take 123 rows at most.
	file := filepath.Join(f.dir, "once.prom")
	wantExit(t, f.runWith(env, "once", "--metrics-file", file), 0)
	if v := metricValue(t, testfile.Read(t, file), `inboxkeeper_batch_size{table="public.consumer_inbox"}`); v < 100 || v > 123 {
		t.Errorf("the pass's batch size is %v, want between the default batch_size_min (100) and the table's batch_size_max (123)", v)
	}

	// A contradiction within one layer is refused, and nothing is written.
	wantExit(t, f.runWith(env, "set", "--table", "public.consumer_inbox", "batch_size_min=200", "--reason", "r"), 2,
		"the settings of public.consumer_inbox would not hold together: batch_size_max: 123 must be at least batch_size_min (200)")
	f.wantCount("changes recorded", 1, "SELECT count(*) FROM inboxkeeper.settings_history")
}

// documented is what the commands reference documents of a JSON output
// ("status --json"): its fields.
func documented(t *testing.T, output string) []jsondoc.Field {
	t.Helper()
	fields, err := jsondoc.Read(testfile.Read(t, "../../docs/reference/commands.md"), output)
	if err != nil {
		t.Fatalf("docs/reference/commands.md: %s: %v", output, err)
	}
	return fields
}

// decodeOutput decodes a command's JSON output strictly: every field it
// holds must be documented for output in the commands reference, with a
// value of the documented type; then into T, which must know every field.
// seen (nil: none) collects the fields shown.
func decodeOutput[T any](t *testing.T, output string, r result, seen jsondoc.Seen) T {
	t.Helper()
	if seen == nil {
		seen = jsondoc.Seen{}
	}
	for _, d := range jsondoc.Check([]byte(r.stdout), documented(t, output), seen) {
		t.Errorf("%s: %s", output, d)
	}
	var v T
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v\n%s", output, err, r)
	}
	return v
}

// retentionSection is a retention record of payments on the short inbox,
// with a field of every kind (plan --json shows them all).
const retentionSection = `retention:
  - scope: payments
    table: public.consumer_inbox
    producer: billing-service
    consequence: high
    owner: payments-team
    margin: 2d
    margin_reason: clock skew and delayed cleanup
    after_expiry: applied again; the ledger's unique payout id guards it
    extension: { owner: payments-oncall, on_duplicate: true, by: 7d, cap: 90d }
    max_backfill_age: 60d
    storage_tiers: hot only
    paths:
      - { name: broker redelivery, stages: [{ after: 14d, from: event_time }] }
      - name: restore then backlog
        stages: [{ name: restore, after: 45d, from: event_time }, { name: backlog, after: 3d }]
      - name: migration replay
        stages: [{ deadline: 2099-03-01T00:00:00Z }]
      - { name: manual backfill, unbounded: true }
`

// Every JSON output decodes strictly against the fields the commands
// reference documents for it (a field not documented, or of another type,
// fails), and shows every documented field that cannot be null: a table
// managed by rows with holds, replays and settings bounded across layers,
// one managed by partition, one with tiers; the settings, their history
// and the retention records.
func TestJSONOutputsAsDocumented(t *testing.T) {
	t.Parallel()
	seen := map[string]jsondoc.Seen{}
	check := func(output string, r result) {
		t.Helper()
		wantExit(t, r, 0)
		if seen[output] == nil {
			seen[output] = jsondoc.Seen{}
		}
		for _, d := range jsondoc.Check([]byte(r.stdout), documented(t, output), seen[output]) {
			t.Errorf("%s: %s\n%s", output, d, r.stdout)
		}
	}

	f := newFixture(t, inboxDDL, strings.Replace(inboxPolicy, "expires_at: remember_until", `expires_at: remember_until
    tuning: {batch_pause: 10ms}`, 1)+retentionSection, true)
	env := []string{"INBOXKEEPER_BATCH_SIZE=500"}
	wantExit(t, f.run("plan", "--apply"), 0)
	wantExit(t, f.run("hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--from", "2026-02-01", "--to", "2026-02-02",
		"--reason", "r", "--owner", "o", "--for", "30d"), 0)
	wantExit(t, f.run("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments", "--from", "2000-01-01", "--to", "2000-01-02",
		"--owner", "o", "--force"), 0)
	wantExit(t, f.runWith(env, "set", "--table", "public.consumer_inbox", "batch_size_max=123", "--reason", "r"), 0)
	wantExit(t, f.run("set", "active_hours=22:00-06:00", "max_replica_lag_bytes=16MB", "--reason", "r"), 0)
	wantExit(t, f.run("set", "--unset", "active_hours", "--reason", "r"), 0)
	check("status --json", f.runWith(env, "status", "--json"))
	check("settings --json", f.runWith(env, "settings", "--json"))
	check("settings --history --json", f.run("settings", "--history", "--json"))
	check("plan --json", f.run("plan", "--json"))

	p := newFixture(t, partitionedDDL, partitionedPolicy, true)
	check("status --json", p.run("status", "--json"))
	tiered := newFixture(t, tieredDDL, pgtest.TieredInboxPolicy, true)
	wantExit(t, tiered.run("migrate"), 0) // creates the permanent key table
	check("status --json", tiered.run("status", "--json"))

	for output, s := range seen {
		if unseen := jsondoc.Unseen(documented(t, output), s); len(unseen) > 0 {
			t.Errorf("%s never showed %v", output, unseen)
		}
	}
}

// One vocabulary for the backlog: after a pass, status, status --json and
// the metrics once exports (the textfile here; the push is the same
// registry) name and count the same: due, protected by holds, protected by
// replays, the replays beyond the window.
func TestOneVocabularyForTheBacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxDDL, inboxPolicy+retentionSection, true)
	wantExit(t, f.run("plan", "--apply"), 0)
	wantExit(t, f.run("hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--reason", "r", "--owner", "o"), 0)
	wantExit(t, f.run("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T05:30:00Z", "--owner", "o", "--force"), 0)

	// Before the pass: billing's 10 are held, payments' first 5 replayed,
	// its other 15 due.
	r := f.run("status")
	wantExit(t, r, 0, "  due (deletable now):      15\n", "  protected by holds:       10\n", "  protected by replays:     5\n",
		"  replays beyond the window: 1\n", "BEYOND THE DEDUP WINDOW (forced)")

	file := filepath.Join(f.dir, "once.prom")
	wantExit(t, f.run("once", "--metrics-file", file), 0)
	m := testfile.Read(t, file)
	st := decodeOutput[render.StatusJSON](t, "status --json", f.run("status", "--json"), nil)
	rows := st.Tables[0].Rows
	for series, got := range map[string]float64{
		`inboxkeeper_rows_due{table="public.consumer_inbox"}`:                   float64(rows.Due),
		`inboxkeeper_rows_protected{by="hold",table="public.consumer_inbox"}`:   float64(rows.ProtectedByHolds),
		`inboxkeeper_rows_protected{by="replay",table="public.consumer_inbox"}`: float64(rows.ProtectedByReplays),
		`inboxkeeper_replays_beyond_window{table="public.consumer_inbox"}`:      float64(rows.ReplaysBeyondWindow),
	} {
		if want := metricValue(t, m, series); got != want {
			t.Errorf("status --json says %v where once exported %s %v", got, series, want)
		}
	}
	if rows.Due != 0 || rows.ProtectedByHolds != 10 || rows.ProtectedByReplays != 5 || rows.ReplaysBeyondWindow != 1 {
		t.Errorf("after the pass: %+v, want 0 due, 10 and 5 protected, 1 replay beyond the window", rows)
	}
	wantExit(t, f.run("status"), 0, "  due (deletable now):      0\n", "  protected by holds:       10\n", "  protected by replays:     5\n")
}

// Connection failures are classified: a wrong password, a role that may
// not connect, a database that does not exist and a connection string that
// does not parse are configuration errors (exit 2), said once, without
// pgx's attempt with TLS and without doubled parentheses; an unreachable
// server is a runtime failure (exit 1). run waits for a cause of the
// configuration's with one ERROR line per change of cause, backing off.
func TestConnectionFailuresClassified(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := pgtest.NewCluster(t)
	pgtest.ExecOn(t, c.URL("postgres"), `CREATE DATABASE app`)
	pgtest.ExecOn(t, c.URL("postgres"), `CREATE ROLE ik_pw LOGIN PASSWORD 'right'; CREATE ROLE ik_nogrant LOGIN;
REVOKE CONNECT ON DATABASE app FROM PUBLIC; GRANT CONNECT ON DATABASE app TO ik_pw`)
	if err := c.RequirePassword(ctx, "ik_pw"); err != nil {
		t.Fatal(err)
	}
	// No sslmode: pgx tries TLS first, which this server refuses.
	url := func(userinfo, db string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s", userinfo, c.Port, db)
	}
	pgtest.WaitFor(t, 30*time.Second, "the server to want ik_pw's password", func() bool {
		conn, err := pgx.Connect(ctx, url("ik_pw:wrong", "app"))
		if err == nil {
			conn.Close(ctx)
		}
		return err != nil
	})
	dir := t.TempDir()
	policy := writeFile(t, dir, "inboxkeeper.yaml", inboxPolicy)
	for _, k := range []struct {
		url  string
		code int
		want string
	}{
		{url("ik_pw:wrong", "app"), 2, `INBOXKEEPER_DATABASE_URL: connect to postgres://ik_pw:***@127.0.0.1:` + fmt.Sprint(c.Port) +
			`/app: authentication failed: password authentication failed for user "ik_pw" (SQLSTATE 28P01)`},
		{url("ik_nosuchrole", "app"), 2, `authentication failed: role "ik_nosuchrole" does not exist (SQLSTATE 28000)`},
		{url("ik_nogrant", "app"), 2, `not allowed to connect: permission denied for database "app" (SQLSTATE 42501)`},
		{url("postgres", "nosuchdb"), 2, `unknown database: database "nosuchdb" does not exist (SQLSTATE 3D000)`},
		{"postgres://u:s3cret/x@h/db", 2, "INBOXKEEPER_DATABASE_URL: cannot parse the connection string: invalid port; the string is not shown, as it may hold a password"},
		{fmt.Sprintf("host=127.0.0.1 port=%d sslmode=sometimes", c.Port), 2, "cannot parse the connection string: failed to configure TLS"},
		{fmt.Sprintf("postgres://postgres@127.0.0.1:%d/app", redistest.FreePort(t)), 1, "unreachable: dial tcp 127.0.0.1:"},
	} {
		for _, args := range [][]string{{"status"}, {"once"}, {"migrate"}, {"hold", "list"}} {
			r := runCLI(t, dir, cliEnv("INBOXKEEPER_DATABASE_URL="+k.url, "INBOXKEEPER_POLICY_FILE="+policy), args...)
			wantExit(t, r, k.code, k.want)
			for _, noise := range []string{"tls error", "((", "s3cret", "\n\t"} {
				if strings.Contains(r.output(), noise) {
					t.Errorf("the message holds %q\n%s", noise, r)
				}
			}
		}
	}

	// run waits: one ERROR however often it tries, until the cause changes.
	failures := func() int {
		return strings.Count(testfile.Read(t, c.LogFile()), `password authentication failed for user "ik_pw"`)
	}
	before := failures()
	// At info, as run logs by default (startDaemon's debug adds a line
	// for every try).
	d := startDaemon(t, dir, cliEnv("INBOXKEEPER_DATABASE_URL="+url("ik_pw:wrong", "app"), "INBOXKEEPER_POLICY_FILE="+policy,
		"INBOXKEEPER_LOG_LEVEL=info"), "run")
	d.waitLine(regexp.MustCompile(`level=ERROR msg="inboxkeeper: cannot connect; trying again with backoff until the configuration or the database changes" cause="authentication failed"`), 30*time.Second)
	pgtest.WaitFor(t, 60*time.Second, "run to try three times", func() bool { return failures() >= before+3 })
	// The password changes on the server's side: run connects, and waits
	// for what comes next (the control schema, the table).
	pgtest.ExecOn(t, c.URL("postgres"), `ALTER ROLE ik_pw PASSWORD 'wrong'`)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: the policy does not match the database; nothing is touched until it does" error="control schema`), 60*time.Second)
	if n := strings.Count(d.log(), `msg="inboxkeeper: cannot connect`); n != 1 {
		t.Errorf("run logged %d lines for one cause of failing to connect, want 1\n%s", n, d.log())
	}
	d.stop()
}

// A standby of INBOXKEEPER_REPLICA_URLS refused for a reason of the
// configuration's is a configuration error of once, real or dry (exit 2,
// every such entry named, nothing deleted), where it used to make once wait
// for that standby until RUN_TIME ended; run says it once at ERROR and
// holds the batches (fail closed). The throttle's own reading of it names
// the cause without pgx's attempt with TLS.
func TestReplicaURLConfigErrors(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	u, err := neturl.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	replica := func(user, db string) string {
		return fmt.Sprintf("postgres://%s@%s/%s", user, u.Host, db)
	}
	env := []string{"INBOXKEEPER_REPLICA_URLS=" + replica("ik_nosuchrole", "postgres") + "," + replica("postgres", "postgres") + "," + replica("postgres", "nosuchdb")}
	for _, args := range [][]string{{"once"}, {"once", "--dry-run"}} {
		r := f.runWith(env, args...)
		wantExit(t, r, 2, `INBOXKEEPER_REPLICA_URLS entry 1: connect to postgres://ik_nosuchrole@`)
		for _, want := range []string{`authentication failed: role "ik_nosuchrole" does not exist (SQLSTATE 28000)`,
			`INBOXKEEPER_REPLICA_URLS entry 3: connect to postgres://postgres@` + u.Host + `/nosuchdb: unknown database`} {
			if !strings.Contains(r.output(), want) {
				t.Errorf("%v: the output does not say %q\n%s", args, want, r)
			}
		}
		if strings.Contains(r.output(), "entry 2") || strings.Contains(r.output(), "tls error") {
			t.Errorf("%v: the output names the good entry or pgx's TLS attempt\n%s", args, r)
		}
	}
	f.wantCount("rows after the refused passes", allRows, "SELECT count(*) FROM public.consumer_inbox")

	// One standby here: the entries above share a host:port, the name the
	// throttle reads them under, and the first reading of any of them
	// (entry 2's database has no heartbeat table) would give the reason.
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_REPLICA_URLS="+replica("ik_nosuchrole", "postgres"), "INBOXKEEPER_INTERVAL=1s"), "run")
	d.waitLine(regexp.MustCompile(`level=ERROR msg="inboxkeeper: INBOXKEEPER_REPLICA_URLS entry 1: connect to .*role \\"ik_nosuchrole\\" does not exist.*; batches wait until it connects \(fail closed\)"`), 30*time.Second)
	d.waitLine(regexp.MustCompile(`msg="throttle: pausing" kind=replica_unreachable reason="replica_unreachable [^ ]+ \[connect to ik_nosuchrole@[^ ]+/postgres: authentication failed: role \\"ik_nosuchrole\\" does not exist \(SQLSTATE 28000\)\]"`), 30*time.Second)
	d.stop()
	if strings.Contains(d.log(), "tls error") {
		t.Errorf("run's log holds pgx's TLS attempt\n%s", d.log())
	}
	f.wantCount("rows after run held for the standby", allRows, "SELECT count(*) FROM public.consumer_inbox")
}

// Policy errors: a syntax error on the line where it is, and every problem
// of the file at once, each on its field's line.
func TestPolicyErrorsAllAtTheirLines(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	for _, c := range []struct{ policy, want string }{
		// The key under the list item is indented one space short.
		{"tables:\n  - table: public.consumer_inbox\n   key: [consumer, message_id]\n    expires_at: remember_until\n",
			"syntax.yaml:3: did not find expected '-' indicator"},
		{"tables:\n  - table: public.consumer_inbox\n    key: [consumer, message_id]\n    scope: consumer\n    event_time: event_time\n    expires_at remember_until\n",
			"syntax.yaml:6: could not find expected ':'"},
	} {
		r := f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + f.writeFile("syntax.yaml", c.policy)}, "status")
		wantExit(t, r, 2, c.want)
	}
	r := f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + f.writeFile("many.yaml", `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    expires_at: remember_until
    colour: blue
    tuning:
      batch_target: soon
      batch_size: lots
  - table: public.other
    key: []
    expires_after: {column: seen, after: 30 days}
`)}, "once", "--dry-run")
	wantExit(t, r, 2,
		`many.yaml:5: tables[0] (public.consumer_inbox): unknown field "colour"`,
		`many.yaml:7: tables[0] (public.consumer_inbox): tuning.batch_target: "soon" is not a duration`,
		`many.yaml:8: tables[0] (public.consumer_inbox): tuning.batch_size: "lots" is not an integer`,
		`many.yaml:10: tables[1] (public.other): key: required`,
		`many.yaml:11: tables[1] (public.other): expires_after.after: "30 days" is not a duration`)
	if n := strings.Count(r.stderr, "many.yaml:"); n != 5 {
		t.Errorf("%d problems reported, want 5, once each\n%s", n, r)
	}
}

// replay start over a range nothing remembers is refused unless --force,
// whether a rule is installed or not: by the installed rule, else by the
// policy's retention record, else by what the table holds.
func TestReplayBeyondWhatIsRemembered(t *testing.T) {
	t.Parallel()
	replay := func(f *fixture, scope, from, to string, extra ...string) result {
		return f.run(append([]string{"replay", "start", "--table", "public.consumer_inbox", "--scope", scope, "--from", from, "--to", to, "--owner", "o"}, extra...)...)
	}
	recent := time.Now().UTC().Add(-10 * 24 * time.Hour).Format(time.DateOnly)
	today := time.Now().UTC().Format(time.DateOnly)

	// No rule and no record: what the table holds. Payments' oldest event
	// is 2026-01-01T01:00Z.
	f := inboxFixture(t)
	wantExit(t, replay(f, "payments", "2000-01-01", "2000-01-02"), 2,
		`it ends at 2000-01-02T00:00:00Z, before the oldest event table public.consumer_inbox still holds for scope "payments" (2026-01-01T01:00:00Z)`,
		"use --force to start it anyway")
	wantExit(t, replay(f, "nobody", "2026-01-01", "2026-01-02"), 2, `table public.consumer_inbox holds no event of scope "nobody"`)
	f.wantCount("replays after the refusals", 0, "SELECT count(*) FROM inboxkeeper.replays")
	wantExit(t, replay(f, "payments", "2026-01-01", "2026-01-02"), 0) // it reaches what is held
	wantExit(t, replay(f, "payments", "2000-01-01", "2000-01-02", "--force"), 0)
	wantExit(t, f.run("status"), 0, "  replays beyond the window: 1\n", "BEYOND THE DEDUP WINDOW (forced)")

	// A record in the policy, not installed: its horizon (60d + 2d).
	g := newFixture(t, inboxDDL, inboxPolicy+retentionSection, true)
	wantExit(t, replay(g, "payments", "2026-01-01", "2026-01-02"), 2,
		`only events since`, `are still remembered for scope "payments" (the retention record of scope "payments" in `, "not installed: plan --apply installs it")
	wantExit(t, replay(g, "payments", recent, today), 0)
	// Installed: the rule's.
	wantExit(t, g.run("plan", "--apply"), 0)
	wantExit(t, replay(g, "payments", "2026-01-01", "2026-01-02"), 2, `are still remembered for scope "payments" (the installed rule)`)
	wantExit(t, replay(g, "payments", recent, today), 0)
	g.wantCount("replays started", 2, "SELECT count(*) FROM inboxkeeper.replays")
}

// once during pause --for 1h says it waits, until when and how long is
// left, rather than go quiet after the throttle's one line; it goes on
// once resumed.
func TestOnceSaysWhileItWaits(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	wantExit(t, f.run("pause", "--reason", "maintenance", "--for", "1h"), 0, "(until ")
	d := startDaemon(t, f.dir, f.env(), "once")
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: waiting: every instance is paused; no batch starts until the pause ends, or inboxkeeper resume" `+
		`until=\S+ left=(59m\d+s|1h) paused_by="role \S+ \(\S+\)" reason=maintenance`), 30*time.Second)
	wantExit(t, f.run("resume"), 0, "resumed")
	if code, _ := d.exit(60 * time.Second); code != 0 {
		t.Errorf("once exited %d after the pause ended\n%s", code, d.log())
	}
	if n := f.rows(); n != allRows-expiredRows {
		t.Errorf("%d rows left after the pass, want %d", n, allRows-expiredRows)
	}
}

// once's export flags are checked before the pass: a value it cannot use
// is a usage error (exit 2) naming the flag, with nothing deleted, where it
// was found only after the pass had deleted rows. A dry run exports
// nothing: its metrics would replace the real pass's.
func TestOnceExportFlagsCheckedFirst(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	before := f.rows()
	for _, args := range [][]string{
		{"--pushgateway", "not a url"},
		{"--pushgateway", "ftp://gateway:9091"},
		{"--pushgateway", "http://:9091"},
		{"--metrics-file", filepath.Join(f.dir, "missing", "once.prom")},
		{"--metrics-file", f.dir},
		{"--dry-run", "--metrics-file", filepath.Join(f.dir, "once.prom")},
		{"--dry-run", "--pushgateway", "http://localhost:9091"},
	} {
		flag := args[0]
		wantExit(t, f.run(append([]string{"once"}, args...)...), 2, flag)
	}
	if n := f.rows(); n != before {
		t.Errorf("%d rows left of %d: a refused flag deleted rows", n, before)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "once.prom")); err == nil {
		t.Error("a dry run wrote the metrics file")
	}
}
