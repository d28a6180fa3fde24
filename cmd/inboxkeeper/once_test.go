package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxDDL, inboxPolicy, false)

	r := f.run("migrate")
	wantExit(t, r, 0, fmt.Sprintf("migrated to version %d", migrations.Latest()))
	r = f.run("migrate")
	wantExit(t, r, 0, fmt.Sprintf("up to date (version %d)", migrations.Latest()))
	if strings.Contains(r.stdout, "migrated") {
		t.Errorf("the second migrate applied something\n%s", r)
	}
	f.wantCount("schema versions", int64(len(migrations.All())), "SELECT count(*) FROM inboxkeeper.schema_version")

	// A migrate Job without the policy mounted still succeeds, but says
	// that it could not create a tiered policy's key tables.
	r = f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + f.dir + "/not-mounted.yaml"}, "migrate")
	wantExit(t, r, 0, "permanent key tables: none checked, no policy file at "+f.dir+"/not-mounted.yaml", "mount it and run migrate again")

	wantExit(t, f.run("once"), 0)
	f.wantCount("rows left", allRows-expiredRows, "SELECT count(*) FROM public.consumer_inbox")
}

// Sidecars that start together all migrate at once: each succeeds, one
// applies the migrations, and each version is recorded exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "", inboxPolicy, false)
	const n = 4
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = startCLI(t, f.dir, f.env(), "migrate")
	}
	migrated := 0
	for _, p := range procs {
		r := p.wait()
		wantExit(t, r, 0, "control schema inboxkeeper")
		if strings.Contains(r.stdout, "migrated to version") {
			migrated++
		}
	}
	if migrated != 1 {
		t.Errorf("%d of %d processes say they migrated, want exactly 1", migrated, n)
	}
	for _, m := range migrations.All() {
		f.wantCount(fmt.Sprintf("rows for version %d", m.Version), 1, "SELECT count(*) FROM inboxkeeper.schema_version WHERE version = $1", m.Version)
	}
	f.wantCount("schema versions", int64(len(migrations.All())), "SELECT count(*) FROM inboxkeeper.schema_version")
}

func TestOnceBeforeMigrate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxDDL, inboxPolicy, false)
	for _, args := range [][]string{
		{"once"}, {"once", "--dry-run"}, {"status"},
		{"hold", "list"}, {"hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o"},
		{"replay", "list"},
	} {
		r := f.run(args...)
		// A setup error, like a bad policy: exit 2.
		wantExit(t, r, 2, "inboxkeeper migrate")
	}
	// Policy errors are reported with it, not only after migrate.
	bad := f.writeFile("bad.yaml", strings.Replace(inboxPolicy, "scope: consumer", "scope: tenant", 1))
	for _, args := range [][]string{{"once"}, {"status"}} {
		r := f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + bad}, args...)
		wantExit(t, r, 2, "inboxkeeper migrate", `column "tenant" does not exist`)
	}
	f.wantCount("rows", allRows, "SELECT count(*) FROM public.consumer_inbox")
	f.wantCount("control schema", 0, "SELECT count(*) FROM pg_namespace WHERE nspname = 'inboxkeeper'")
	// The daemon waits for the control schema (a migrate job may be about
	// to create it), says so, and starts working once it exists.
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR="), "run")
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: waiting for the control schema".*inboxkeeper migrate`), 30*time.Second)
	f.wantCount("rows while waiting", allRows, "SELECT count(*) FROM public.consumer_inbox")
	wantExit(t, f.run("migrate"), 0)
	d.waitLine(passDone, 60*time.Second)
	f.wantCount("expired rows after the first pass", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	d.signal(syscall.SIGTERM)
	if code, _ := d.exit(10 * time.Second); code != 0 {
		t.Errorf("run exited %d after SIGTERM while waiting\n%s", code, d.log())
	}
}

func TestOnceAndDryRun(t *testing.T) {
	t.Parallel()
	// A second table expires rows a fixed time after a timestamp without time
	// zone (read as UTC): 7 rows are due, 3 are not.
	const otherDDL = `
CREATE TABLE public.other_inbox (id bigint PRIMARY KEY, first_seen_at timestamp NOT NULL);
CREATE INDEX ON public.other_inbox (first_seen_at);
INSERT INTO public.other_inbox SELECT i, (now() AT TIME ZONE 'UTC') - interval '3 hours' - i * interval '1 second' FROM generate_series(1, 7) i;
INSERT INTO public.other_inbox SELECT i, (now() AT TIME ZONE 'UTC') - interval '30 minutes' FROM generate_series(8, 10) i;`
	const policy = inboxPolicy + `  - table: public.other_inbox
    key: [id]
    expires_after: {column: first_seen_at, after: 2h}
`
	f := newFixture(t, inboxDDL+otherDDL, policy, true)
	other := func() int64 { return f.count("SELECT count(*) FROM public.other_inbox") }

	r := f.run("once", "--dry-run")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "would delete", expiredRows, 0, 0)
	wantResult(t, r, "public.other_inbox", "would delete", 7, 0, 0)
	// The log says what it would do, not what it did.
	if !strings.Contains(r.stderr, `msg="expiry: table done" table=public.consumer_inbox would_delete=30 `) || strings.Contains(r.stderr, " deleted=") {
		t.Errorf("a dry run's log must say would_delete, not deleted\n%s", r)
	}
	if got := f.rows(); got != allRows {
		t.Fatalf("dry run deleted rows: %d left of %d", got, allRows)
	}
	if got := other(); got != 10 {
		t.Fatalf("dry run deleted rows: %d left of 10", got)
	}

	r = f.run("once")
	wantExit(t, r, 0)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "public.consumer_inbox: ") || !strings.HasPrefix(lines[1], "public.other_inbox: ") {
		t.Errorf("want one line per table, in policy order\n%s", r)
	}
	wantResult(t, r, "public.consumer_inbox", "deleted", expiredRows, 0, 0)
	wantResult(t, r, "public.other_inbox", "deleted", 7, 0, 0)
	f.wantCount("expired rows left", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	f.wantCount("rows not expired", 10, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until > now()")
	f.wantCount("rows without expiry", 2, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until IS NULL")
	f.wantCount("other_inbox rows not due", 3, "SELECT count(*) FROM public.other_inbox WHERE id > 7")
	f.wantCount("other_inbox rows due", 0, "SELECT count(*) FROM public.other_inbox WHERE id <= 7")

	r = f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "deleted", 0, 0, 0)
	wantResult(t, r, "public.other_inbox", "deleted", 0, 0, 0)
	r = f.run("once", "--dry-run")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "would delete", 0, 0, 0)
}

// A bad environment, policy file or policy/catalog mismatch exits 2 with a
// message naming the culprit, before anything is deleted. The cases share
// one migrated database holding the inbox and copies of it that differ only
// in their indexes; every table has expired rows.
func TestBadInputDeletesNothing(t *testing.T) {
	t.Parallel()
	const copies = `
CREATE TABLE public.noindex_inbox (LIKE public.consumer_inbox INCLUDING CONSTRAINTS);
CREATE TABLE public.partial_inbox (LIKE public.consumer_inbox INCLUDING CONSTRAINTS);
-- Partial: a row of another consumer would not be in it. (One WHERE
-- remember_until IS NOT NULL serves: every due row is in it.)
CREATE INDEX ON public.partial_inbox (remember_until) WHERE consumer = 'billing';
CREATE TABLE public.second_inbox (LIKE public.consumer_inbox INCLUDING CONSTRAINTS);
CREATE INDEX ON public.second_inbox (consumer, remember_until);
INSERT INTO public.noindex_inbox SELECT * FROM public.consumer_inbox;
INSERT INTO public.partial_inbox SELECT * FROM public.consumer_inbox;
INSERT INTO public.second_inbox SELECT * FROM public.consumer_inbox;`
	const countAll = `SELECT (SELECT count(*) FROM public.consumer_inbox) + (SELECT count(*) FROM public.noindex_inbox) +
       (SELECT count(*) FROM public.partial_inbox) + (SELECT count(*) FROM public.second_inbox)`
	f := newFixture(t, inboxDDL+copies, inboxPolicy, true)
	rows := f.count(countAll)
	if rows != 4*allRows {
		t.Fatalf("fixture has %d rows, want %d", rows, 4*allRows)
	}

	swap := func(old, new string) string {
		if !strings.Contains(inboxPolicy, old) {
			panic(old)
		}
		return strings.Replace(inboxPolicy, old, new, 1)
	}
	cases := []struct {
		name   string
		policy string   // default inboxPolicy
		vars   []string // extra environment
		want   []string // in the output; "POLICY" stands for the policy file's path
		// catalog: the policy does not match the database. once exits 2;
		// run waits for the database to match, touching nothing.
		catalog bool
	}{
		{name: "unknown variable", vars: []string{"INBOXKEEPER_BATCHSIZE=10"},
			want: []string{"INBOXKEEPER_BATCHSIZE", "unknown variable", "INBOXKEEPER_BATCH_SIZE"}},
		{name: "lower-case variable", vars: []string{"inboxkeeper_batch_size=10"},
			want: []string{"inboxkeeper_batch_size", "unknown variable"}},
		{name: "malformed integer", vars: []string{"INBOXKEEPER_BATCH_SIZE=abc"},
			want: []string{"INBOXKEEPER_BATCH_SIZE", `"abc"`}},
		{name: "batch size zero", vars: []string{"INBOXKEEPER_BATCH_SIZE=0"},
			want: []string{"INBOXKEEPER_BATCH_SIZE"}},
		{name: "malformed duration", vars: []string{"INBOXKEEPER_LOCK_TIMEOUT=soon"},
			want: []string{"INBOXKEEPER_LOCK_TIMEOUT", `"soon"`}},
		{name: "malformed schedule", vars: []string{"INBOXKEEPER_SCHEDULE=every day"},
			want: []string{"INBOXKEEPER_SCHEDULE"}},
		{name: "malformed log level", vars: []string{"INBOXKEEPER_LOG_LEVEL=loud"},
			want: []string{"INBOXKEEPER_LOG_LEVEL", `"loud"`}},
		{name: "missing policy file", vars: []string{"INBOXKEEPER_POLICY_FILE=/nonexistent/inboxkeeper.yaml"},
			want: []string{"/nonexistent/inboxkeeper.yaml"}},
		{name: "unknown policy field", policy: swap("event_time: event_time", "event_time: event_time\n    expire_at: remember_until"),
			want: []string{"POLICY", `unknown field "expire_at"`}},
		{name: "invalid yaml", policy: swap("key: [consumer, message_id]", "key: [consumer, message_id"),
			want: []string{"POLICY"}},
		{name: "missing table", policy: swap("public.consumer_inbox", "public.consumer_inbx"),
			want: []string{"POLICY", "public.consumer_inbx", "no such table"}, catalog: true},
		{name: "missing expiry column", policy: swap("expires_at: remember_until", "expires_at: remember_untill"),
			want: []string{"POLICY", `"remember_untill"`, "does not exist"}, catalog: true},
		{name: "missing key column", policy: swap("key: [consumer, message_id]", "key: [consumer, msg_id]"),
			want: []string{"POLICY", `"msg_id"`, "does not exist"}, catalog: true},
		{name: "missing scope column", policy: swap("scope: consumer", "scope: Consumer"),
			want: []string{"POLICY", `"Consumer"`, "does not exist"}, catalog: true},
		{name: "expiry column of the wrong type", policy: swap("expires_at: remember_until", "expires_at: consumer"),
			want: []string{"POLICY", `"consumer"`, "timestamptz"}, catalog: true},
		{name: "event time column of the wrong type", policy: swap("event_time: event_time", "event_time: message_id"),
			want: []string{"POLICY", `"message_id"`, "timestamptz"}, catalog: true},
		{name: "no index on the expiry column", policy: swap("public.consumer_inbox", "public.noindex_inbox"),
			want: []string{"POLICY", "public.noindex_inbox", `"remember_until"`, "index"}, catalog: true},
		{name: "only a partial index on the expiry column that leaves due rows out", policy: swap("public.consumer_inbox", "public.partial_inbox"),
			want: []string{"POLICY", "public.partial_inbox", `"remember_until"`, "index"}, catalog: true},
		{name: "expiry column second in the index", policy: swap("public.consumer_inbox", "public.second_inbox"),
			want: []string{"POLICY", "public.second_inbox", `"remember_until"`, "index"}, catalog: true},
		{name: "one good table and one missing", policy: inboxPolicy + `  - table: public.missing_inbox
    key: [id]
    expires_at: remember_until
`, want: []string{"POLICY", "public.missing_inbox", "no such table"}, catalog: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			policy := f.policy
			if c.policy != "" {
				policy = f.writeFile(fmt.Sprintf("policy-%d.yaml", i), c.policy)
			}
			var want []string
			for _, w := range c.want {
				want = append(want, strings.ReplaceAll(w, "POLICY", policy))
			}
			env := f.env(append([]string{"INBOXKEEPER_POLICY_FILE=" + policy}, c.vars...)...)
			for _, args := range [][]string{{"once"}, {"run"}} {
				if c.catalog && args[0] == "run" {
					d := startDaemon(t, f.dir, env, "run")
					line := d.waitLine(regexp.MustCompile(`the policy does not match the database`), 30*time.Second)
					for _, w := range want {
						if !strings.Contains(line, strings.ReplaceAll(w, `"`, `\"`)) && !strings.Contains(line, w) {
							t.Errorf("run's log line lacks %q\n%s", w, line)
						}
					}
					d.signal(syscall.SIGTERM)
					if code, _ := d.exit(10 * time.Second); code != 0 {
						t.Errorf("run waiting for the tables exited %d on SIGTERM\n%s", code, d.log())
					}
				} else {
					r := runCLI(t, f.dir, env, args...)
					wantExit(t, r, 2, want...)
				}
				if got := f.count(countAll); got != rows {
					t.Fatalf("%d of %d rows left after %s", got, rows, args[0])
				}
			}
		})
	}
}

// Quoted, mixed-case and SQL-looking names in every position: the policy
// names them exactly, and every command treats them as data.
func TestHostileIdentifiers(t *testing.T) {
	t.Parallel()
	const ddl = `
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema"."weird ""name""; drop table x" (
    "consumer id"        text NOT NULL,
    "message id"         text NOT NULL,
    "Event Time"         timestamptz,
    "Remember ""Until""" timestamptz,
    PRIMARY KEY ("consumer id", "message id")
);
CREATE INDEX ON "Odd Schema"."weird ""name""; drop table x" ("Remember ""Until""");
INSERT INTO "Odd Schema"."weird ""name""; drop table x"
SELECT c, 'm' || i || c, now(), now() - i * interval '1 hour'
FROM unnest(ARRAY['plain', 'it''s "held"; drop table x; --']) c, generate_series(1, 4) i;
INSERT INTO "Odd Schema"."weird ""name""; drop table x"
SELECT c, 'n' || i || c, now(), now() + i * interval '1 hour'
FROM unnest(ARRAY['plain', 'it''s "held"; drop table x; --']) c, generate_series(1, 3) i;
CREATE TABLE "Odd Schema".x (id int);
INSERT INTO "Odd Schema".x VALUES (1);
CREATE TABLE public.x (id int);
INSERT INTO public.x VALUES (1);`
	const policy = `tables:
  - table: '"Odd Schema"."weird ""name""; drop table x"'
    key: ['consumer id', 'message id']
    scope: 'consumer id'
    event_time: 'Event Time'
    expires_at: 'Remember "Until"'
`
	const name = `"Odd Schema"."weird ""name""; drop table x"`
	const held = `it's "held"; drop table x; --`
	f := newFixture(t, ddl, policy, true)
	count := func(where string, args ...any) int64 {
		return f.count(`SELECT count(*) FROM "Odd Schema"."weird ""name""; drop table x" WHERE `+where, args...)
	}

	r := f.run("once", "--dry-run")
	wantExit(t, r, 0)
	wantResult(t, r, name, "would delete", 8, 0, 0)

	r = f.run("hold", "add", "--table", name, "--scope", held, "--reason", "r; drop table x", "--owner", `o"`)
	wantExit(t, r, 0)
	id := strings.TrimSpace(r.stdout)
	if !regexp.MustCompile(`^[1-9][0-9]*$`).MatchString(id) {
		t.Fatalf("hold add did not print an id\n%s", r)
	}
	r = f.run("hold", "list")
	wantExit(t, r, 0, "hold "+id+" on "+name)

	r = f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, name, "deleted", 4, 4, 0)

	r = f.run("status")
	wantExit(t, r, 0, name+"\n", "due (deletable now):      0\n", "protected by holds:       4\n", "active holds:             1")

	if n := count(`"Remember ""Until""" <= now() AND "consumer id" = 'plain'`); n != 0 {
		t.Errorf("%d expired rows of plain left", n)
	}
	if n := count(`"Remember ""Until""" <= now() AND "consumer id" = $1`, held); n != 4 {
		t.Errorf("%d expired held rows left, want 4", n)
	}
	if n := count(`"Remember ""Until""" > now()`); n != 6 {
		t.Errorf("%d rows not expired left, want 6", n)
	}
	f.wantCount(`"Odd Schema".x`, 1, `SELECT count(*) FROM "Odd Schema".x`)
	f.wantCount("public.x", 1, `SELECT count(*) FROM public.x`)

	wantExit(t, f.run("hold", "release", id), 0)
	r = f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, name, "deleted", 4, 0, 0)
	f.wantCount(`"Odd Schema".x`, 1, `SELECT count(*) FROM "Odd Schema".x`)
	f.wantCount("public.x", 1, `SELECT count(*) FROM public.x`)
	f.wantCount("tables in the database", 3, `SELECT count(*) FROM pg_tables WHERE schemaname IN ('public', 'Odd Schema')`)
}

// An application that writes local time into a timestamp column (database
// TimeZone America/New_York): with time_zone in the policy, rows go when
// their local time has passed, not hours early; without it, once, run and
// status warn, naming table, column and zone.
func TestLocalTimeColumns(t *testing.T) {
	t.Parallel()
	f := newFixture(t, `
CREATE TABLE public.local_inbox (id int PRIMARY KEY, remember_until timestamp(0) NOT NULL);
CREATE INDEX ON public.local_inbox (remember_until);`, `tables:
  - table: public.local_inbox
    key: [id]
    expires_at: remember_until
    time_zone: America/New_York
`, true)
	pgtest.Exec(t, f.pool, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET TimeZone = %L', current_database(), 'America/New_York'); END $$`)
	// Written by the application in its own sessions: local wall time.
	conn, err := pgx.Connect(context.Background(), f.url)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, conn, `INSERT INTO public.local_inbox
SELECT i, localtimestamp - interval '10 minutes' FROM generate_series(1, 3) i
UNION ALL SELECT i, localtimestamp + interval '30 minutes' FROM generate_series(4, 5) i
UNION ALL SELECT i, localtimestamp + interval '3 hours' FROM generate_series(6, 7) i`)
	conn.Close(context.Background())

	r := f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.local_inbox", "deleted", 3, 0, 0)
	if strings.Contains(r.stderr, "level=WARN") {
		t.Errorf("a warning although the policy names the zone:\n%s", r)
	}
	f.wantCount("rows not yet due", 4, "SELECT count(*) FROM public.local_inbox")

	// Without time_zone the column is read as UTC, and each command says so.
	utc := f.writeFile("utc.yaml", `tables:
  - table: public.local_inbox
    key: [id]
    expires_at: remember_until
`)
	warning := regexp.MustCompile(`level=WARN msg="inboxkeeper: a timestamp without time zone column is read as UTC.*table=public.local_inbox column=remember_until database_time_zone=America/New_York`)
	for _, args := range [][]string{{"once", "--dry-run"}, {"status"}} {
		r := f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + utc}, args...)
		wantExit(t, r, 0)
		if n := len(warning.FindAllString(r.stderr, -1)); n != 1 {
			t.Errorf("inboxkeeper %v warned %d times, want once:\n%s", args, n, r)
		}
	}
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_POLICY_FILE="+utc, "INBOXKEEPER_INTERVAL=1h"), "run")
	d.waitLine(warning, 30*time.Second)
	d.stop()
}
