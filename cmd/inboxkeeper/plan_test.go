package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/app/setup"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/redisprobe"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/redistest"
	"github.com/inboxkeeper/inboxkeeper/retention"
)

// The plan tests call the command in-process: they need no child process,
// and most of them no database.

var planTables = inbox.PlainPolicy + `  - table: public."InboxState"
    key: ["MessageId", "ConsumerId"]
    first_seen: "Delivered"
    expires_after: { column: "Delivered", after: 30d }
`

// planEntries are the records for both tables: the article's calculation
// (retention 50d) for the inbox, with a migration deadline; and a framework
// table whose 30d window is shorter than its 50d retention.
const planEntries = `retention:
  - scope: payments
    table: public.consumer_inbox
    producer: billing-service
    consequence: high
    owner: payments-team
    margin: 2d
    margin_reason: clock skew, scheduler delay, delayed cleanup
    after_expiry: a redelivery is applied again; the ledger's unique payout id is the durable guard
    extension: { owner: payments-oncall }
    permanent_key: [consumer, business_key]
    storage_tiers: hot 72h full payload; warm identity + hash + outcome; permanent business key
    paths:
      - { name: broker redelivery, stages: [{ after: 14d, from: event_time }] }
      - { name: dead-letter redrive, stages: [{ after: 30d, from: first_seen }] }
      - name: restore then backlog
        stages: [{ name: restore, after: 45d, from: event_time }, { name: backlog, after: 3d }]
      - { name: migration replay, stages: [{ deadline: 2026-03-01T00:00:00Z }] }
      - { name: manual backfill, unbounded: true }
  - scope: masstransit
    table: public."InboxState"
    consequence: medium
    owner: orders-team
    margin: 2d
    margin_reason: clock skew
    after_expiry: the order handler checks the order status first
    extension: { owner: orders-oncall }
    paths:
      - name: restore then backlog
        stages: [{ after: 45d, from: first_seen }, { after: 3d }]
`

const planDDL = `
CREATE TABLE public.consumer_inbox (
    consumer       text NOT NULL,
    message_id     text NOT NULL,
    event_time     timestamptz,
    first_seen_at  timestamptz,
    remember_until timestamptz,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ON public.consumer_inbox (remember_until);
CREATE TABLE public."InboxState" (
    "MessageId"  uuid NOT NULL,
    "ConsumerId" uuid NOT NULL,
    "Delivered"  timestamp,
    PRIMARY KEY ("MessageId", "ConsumerId")
);
CREATE INDEX ON public."InboxState" ("Delivered");`

// Rows whose remember_until is exactly what the rule gives (the boundary
// is not "earlier"), one late first delivery, and rows the check must not
// count: another scope's, and rows that never expire.
const planRows = `
INSERT INTO public.consumer_inbox (consumer, message_id, event_time, first_seen_at)
SELECT 'payments', 'p-' || i, timestamptz '2026-01-01 00:00Z' + i * interval '1 day',
       timestamptz '2026-01-01 00:00Z' + i * interval '1 day' + interval '1 hour'
FROM generate_series(1, 20) i;
INSERT INTO public.consumer_inbox (consumer, message_id, event_time, first_seen_at)
VALUES ('payments', 'p-late', '2025-06-01 00:00Z', '2026-05-01 00:00Z');
UPDATE public.consumer_inbox SET remember_until = greatest(first_seen_at + interval '30 days',
       event_time + interval '48 days', timestamptz '2026-03-01 00:00Z') + interval '2 days';
INSERT INTO public.consumer_inbox VALUES
    ('billing', 'b-early', '2026-01-01 00:00Z', '2026-01-01 00:00Z', '2026-01-02 00:00Z'),
    ('payments', 'p-forever', '2026-01-01 00:00Z', '2026-01-01 00:00Z', NULL);
INSERT INTO public."InboxState" VALUES
    ('11111111-1111-1111-1111-111111111111', '22222222-2222-2222-2222-222222222222', '2026-01-01 00:00'),
    ('33333333-3333-3333-3333-333333333333', '22222222-2222-2222-2222-222222222222', NULL);`

type planEnv struct {
	t   *testing.T
	dir string
	cfg config.Config
}

func newPlanEnv(t *testing.T, policyText string) *planEnv {
	e := &planEnv{t: t, dir: t.TempDir()}
	e.cfg = config.Config{PolicyFile: filepath.Join(e.dir, "inboxkeeper.yaml"), StatementTimeout: 30 * time.Second}
	if policyText != "" {
		e.write("inboxkeeper.yaml", policyText)
	}
	return e
}

func (e *planEnv) write(name, text string) string {
	e.t.Helper()
	return writeFile(e.t, e.dir, name, text)
}

// run calls `inboxkeeper plan args...` in-process and maps its error to the
// exit status as run() does.
func (e *planEnv) run(args ...string) result {
	e.t.Helper()
	var stdout, stderr bytes.Buffer
	a := &app{Command: &setup.Command{Cfg: e.cfg, Log: slog.New(slog.DiscardHandler), Name: "plan"}, stdout: &stdout, stderr: &stderr}
	err := a.plan(context.Background(), args)
	a.Close()
	code := a.exitCode(err)
	return result{args: append([]string{"plan"}, args...), code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func TestPlanPrint(t *testing.T) {
	t.Parallel()
	e := newPlanEnv(t, planTables+planEntries)

	r := e.run()
	wantExit(t, r, 0, "# Retention record: payments", "# Retention record: masstransit",
		"retention = max(14d, 30d, 48d) + 2d margin = **50d** (longest: restore then backlog)",
		"remember_until = max(first_seen + 30d, event_time + 48d, 2026-03-01T00:00:00Z) + 2d",
		"| consequence class | high |", "Who may extend: payments-oncall.", "## After expiry", "## Storage tiers")

	// --json round-trips to the plans the policy file gives.
	r = e.run("--json")
	wantExit(t, r, 0)
	var got []retention.Plan
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	p, err := policy.Load(e.cfg.PolicyFile)
	if err != nil {
		t.Fatal(err)
	}
	want, err := retention.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("--json gives\n%+v\nwant\n%+v", got, want)
	}
	if !strings.Contains(r.stdout, `"retention": {
        "text": "50d",
        "seconds": 4320000
      }`) {
		t.Errorf("--json lacks the retention as text and seconds\n%s", r)
	}

	// FILE, with the flags before or after it; the policy file still checks
	// the tables.
	file := e.write("retention.yaml", planEntries)
	for _, args := range [][]string{{file}, {file, "--json"}, {"--json", file}} {
		r = e.run(args...)
		wantExit(t, r, 0, "masstransit")
	}
	bad := e.write("bad.yaml", strings.Replace(planEntries, `table: public."InboxState"`, "table: public.nope", 1))
	r = e.run(bad)
	wantExit(t, r, 2, bad+":", "retention[1] (masstransit): table: public.nope is not among the tables of the policy file")
}

// Without a policy file, `plan FILE` still prints the records; --check then
// has nothing to find the tables in.
func TestPlanFileWithoutPolicy(t *testing.T) {
	t.Parallel()
	e := newPlanEnv(t, "")
	file := e.write("retention.yaml", planEntries)
	wantExit(t, e.run(file), 0, "# Retention record: payments", "| table | public.consumer_inbox |")
	wantExit(t, e.run(file, "--check"), 2, `the record for "payments" names table public.consumer_inbox, but there is no policy file`)
	wantExit(t, e.run(), 2, "inboxkeeper.yaml")
}

func TestPlanErrors(t *testing.T) {
	t.Parallel()
	e := newPlanEnv(t, planTables+strings.Replace(planEntries, "margin: 2d", "margin: -2d", 1))
	wantExit(t, e.run(), 2, "configuration error", "inboxkeeper.yaml:18: retention[0] (payments): margin: must not be negative")

	unbounded := strings.Replace(planEntries, "    permanent_key: [consumer, business_key]\n", "", 1)
	e = newPlanEnv(t, planTables+unbounded)
	wantExit(t, e.run(), 2, `paths[4].unbounded: path "manual backfill" lets any history be replayed`, "max_backfill_age", "permanent_key")

	e = newPlanEnv(t, planTables)
	wantExit(t, e.run(), 2, "inboxkeeper.yaml: no retention section", "inboxkeeper plan FILE")

	file := e.write("r.yaml", planEntries)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{file, file}, "unexpected argument"},
		{[]string{"--redis-url", "redis://x"}, "--redis-url needs --check"},
		{[]string{"--json", "--check"}, "cannot be combined"},
		{[]string{"--frob"}, "flag provided but not defined"},
		{[]string{filepath.Join(e.dir, "missing.yaml")}, "missing.yaml"},
	} {
		wantExit(t, e.run(c.args...), 2, c.want)
	}
}

func TestPlanCheck(t *testing.T) {
	t.Parallel()
	db, url := pgtest.NewPool(t)
	e := newPlanEnv(t, planTables+planEntries)
	e.cfg.DatabaseURL = url
	pgtest.Exec(t, db, planDDL+planRows)

	// One row whose remember_until is a second short of the rule.
	pgtest.Exec(t, db, `UPDATE public.consumer_inbox SET remember_until = remember_until - interval '1 second' WHERE message_id = 'p-late'`)
	r := e.run("--check")
	wantExit(t, r, 1, "plan --check: 3 of 7 checks failed")
	for _, re := range []string{
		`(?m)^FAIL payments \(public\.consumer_inbox\): rows: 1 with an expiry earlier than max\(first_seen \+ 30d, event_time \+ 48d, 2026-03-01T00:00:00Z\) \+ 2d \(scope "payments"\), so forgotten too early; ` +
			`the first: consumer=payments message_id=p-late: expiry 2026-06-01T23:59:59Z, rule 2026-06-02T00:00:00Z$`,
		`(?m)^OK   payments \(public\.consumer_inbox\): partition coverage: not partitioned$`,
		`(?m)^FAIL masstransit \(public\."InboxState"\): expiry rule: expires_after Delivered \+ 30d is shorter than the computed retention 50d \(48d longest scenario \+ 2d margin\)`,
		`(?m)^FAIL masstransit \(public\."InboxState"\): rows: 1 with an expiry earlier than first_seen \+ 48d \+ 2d, so forgotten too early; ` +
			`the first: MessageId=11111111-1111-1111-1111-111111111111 ConsumerId=22222222-2222-2222-2222-222222222222: expiry 2026-01-31T00:00:00Z, rule 2026-02-20T00:00:00Z$`,
		`(?m)^OK   masstransit \(public\."InboxState"\): partition coverage: not partitioned$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("output does not match %s\n%s", re, r)
		}
	}

	// Fixed: the row keeps its promise, and the framework table keeps its
	// identities for 60 days.
	pgtest.Exec(t, db, `UPDATE public.consumer_inbox SET remember_until = remember_until + interval '1 second' WHERE message_id = 'p-late'`)
	e.write("inboxkeeper.yaml", strings.Replace(planTables, "after: 30d", "after: 60d", 1)+planEntries)
	r = e.run("--check")
	wantExit(t, r, 0, `OK   masstransit (public."InboxState"): expiry rule: expires_after Delivered + 60d covers the retention 50d`,
		`OK   payments (public.consumer_inbox): rows: none with an expiry earlier than`)
	if strings.Contains(r.stdout, "FAIL") {
		t.Errorf("a check failed\n%s", r)
	}

	// A record whose table is not in the database is a configuration error.
	pgtest.Exec(t, db, `DROP TABLE public."InboxState"`)
	wantExit(t, e.run("--check"), 2, "InboxState", "no such table")
}

func TestPlanCheckRedis(t *testing.T) {
	t.Parallel()
	// No table: only the Redis checks count.
	noTables := strings.NewReplacer("    table: public.consumer_inbox\n", "", `    table: public."InboxState"`+"\n", "").Replace(planEntries)
	e := newPlanEnv(t, planTables+noTables)
	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"evicting", []string{"--save", "3600 1", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"}, 1,
			[]string{"FAIL redis redis://127.0.0.1:", "eviction: maxmemory-policy allkeys-lru evicts keys", redisprobe.Ceiling, "1 of 2 checks failed"}},
		{"durable", []string{"--save", "", "--appendonly", "yes", "--maxmemory-policy", "noeviction"}, 0,
			[]string{"OK   redis redis://127.0.0.1:", "eviction: maxmemory-policy noeviction", "persistence: appendonly yes"}},
		{"keeps nothing across a restart", []string{"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"}, 1,
			[]string{"persistence: save is empty and appendonly is no: a restart keeps nothing", redisprobe.Ceiling}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			addr := redistest.Start(t, c.args...)
			r := e.run("--check", "--redis-url", "redis://"+addr)
			wantExit(t, r, c.code, append(c.want, "SKIP payments: the record names no table", "SKIP masstransit: the record names no table")...)
		})
	}
	r := e.run("--check", "--redis-url", fmt.Sprintf("redis://:s3cret@127.0.0.1:%d", redistest.FreePort(t)))
	wantExit(t, r, 1, "FAIL redis: cannot read its settings", "connect to redis://127.0.0.1:")
	if strings.Contains(r.output(), "s3cret") {
		t.Errorf("the password is shown\n%s", r)
	}
}

// A partitioned table: the rule writes expiries up to 50d ahead (48d of
// restore and backlog + 2d margin), so max_expiry and the partitions that
// exist must reach that far.
func TestPlanCheckPartitionCoverage(t *testing.T) {
	t.Parallel()
	db, url := pgtest.NewPool(t)
	tables := func(maxExpiry string) string {
		return inbox.PlainPolicy + "    partitions: {by: month, max_expiry: " + maxExpiry + ", premake: 1}\n"
	}
	payments := planEntries[:strings.Index(planEntries, "  - scope: masstransit")]
	e := newPlanEnv(t, tables("30d")+payments)
	e.cfg.DatabaseURL = url
	e.cfg.DDLLockTimeout = 100 * time.Millisecond
	pgtest.Exec(t, db, `
CREATE TABLE public.consumer_inbox (consumer text NOT NULL, message_id text NOT NULL, event_time timestamptz,
    first_seen_at timestamptz, remember_until timestamptz NOT NULL) PARTITION BY RANGE (remember_until);
CREATE INDEX ON public.consumer_inbox (consumer, message_id);
CREATE TABLE public.consumer_inbox_now PARTITION OF public.consumer_inbox FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '10 days');`)
	r := e.run("--check")
	wantExit(t, r, 1)
	for _, re := range []string{
		`(?m)^FAIL payments \(public\.consumer_inbox\): partition coverage: partitions\.max_expiry 30d is shorter than the 50d ahead the rule writes`,
		`(?m)^FAIL payments \(public\.consumer_inbox\): partition coverage: the partitions reach \S+ \(\S+ ahead\), the rule writes up to 50d ahead: inserts beyond fail`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("output does not match %s\n%s", re, r)
		}
	}

	e.write("inboxkeeper.yaml", tables("60d")+payments)
	f := &fixture{t: t, pool: db, url: url, dir: e.dir, policy: filepath.Join(e.dir, "inboxkeeper.yaml")}
	pgtest.Migrate(t, url)
	wantExit(t, f.run("partitions", "ensure"), 0, "created")
	r = e.run("--check")
	wantExit(t, r, 0, "OK   payments (public.consumer_inbox): partition coverage: partitions.max_expiry 60d covers the 50d ahead the rule writes",
		"OK   payments (public.consumer_inbox): partition coverage: the partitions reach ")
}

// plan --check compares the rule plan --apply installed for the claim path
// with the policy's: a margin changed in the policy but not applied leaves
// the claim path writing the old expiries (and replay start judging by
// them), and is a FAIL that says so until plan --apply. Before the first
// apply there is nothing to compare (SKIP).
func TestPlanCheckInstalledRule(t *testing.T) {
	t.Parallel()
	db, url := pgtest.NewPool(t)
	payments := planEntries[:strings.Index(planEntries, "  - scope: masstransit")]
	e := newPlanEnv(t, inbox.PlainPolicy+payments)
	e.cfg.DatabaseURL = url
	pgtest.Exec(t, db, planDDL)
	const subject = "payments (public.consumer_inbox): installed rule: "
	wantExit(t, e.run("--check"), 0, "SKIP "+subject+"none for this scope")
	pgtest.Migrate(t, url)
	wantExit(t, e.run("--check"), 0, "SKIP "+subject+"none for this scope")
	wantExit(t, e.run("--apply"), 0)
	wantExit(t, e.run("--check"), 0, "OK   "+subject+"remember_until = max(first_seen + 30d, event_time + 48d, 2026-03-01T00:00:00Z) + 2d, as the policy says")

	e.write("inboxkeeper.yaml", inbox.PlainPolicy+strings.Replace(payments, "margin: 2d", "margin: 5d", 1))
	r := e.run("--check")
	wantExit(t, r, 1, "FAIL "+subject+"remember_until = max(first_seen + 30d, event_time + 48d, 2026-03-01T00:00:00Z) + 2d, "+
		"where the policy says remember_until = max(first_seen + 30d, event_time + 48d, 2026-03-01T00:00:00Z) + 5d; "+
		"the claim path writes and replay start judges by the installed one until plan --apply installs the policy's")
	wantExit(t, e.run("--apply"), 0)
	wantExit(t, e.run("--check"), 0, "OK   "+subject+"remember_until = max(first_seen + 30d, event_time + 48d, 2026-03-01T00:00:00Z) + 5d, as the policy says")
}

// plan --check judges whether the space of a table's deleted rows is kept
// reclaimed at the rate its rows fall due: 2,000 live rows that all fall
// due within the minute are 33 a second, which autovacuum, coming at most
// every autovacuum_naptime (a minute), lets pile up to 2,000 dead tuples,
// over the 1,000 keeping up allows. It names the reloptions to set, and
// the naptime it would take; plan --apply sets the reloptions. With the
// daemon's own VACUUM on (and a role that may vacuum), the check passes.
func TestPlanVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, url := pgtest.NewPool(t)
	e := newPlanEnv(t, planTables+planEntries)
	e.cfg.DatabaseURL = url
	pgtest.Exec(t, db, planDDL+planRows+`
INSERT INTO public.consumer_inbox (consumer, message_id, event_time, first_seen_at, remember_until)
SELECT 'hot', 'h-' || i, now(), now(), now() + interval '10 seconds' + (i % 50) * interval '1 second' FROM generate_series(1, 2000) i;
ANALYZE public.consumer_inbox;`)
	// The 2,000 rows fall due 10 to 59 s from now: all in the next
	// minute (FallingDueOver) for the first 10 s, counted over the 59 s
	// they reach into at first, and over less as the newest comes nearer:
	// 34 a second, 40 at 9 s (2,030 to 2,400 dead tuples a naptime).
	pgtest.Migrate(t, url) // plan --apply installs the rules in the control schema

	r := e.run("--check")
	wantExit(t, r, 1)
	fail := regexp.MustCompile(`(?m)^FAIL vacuum \(public\.consumer_inbox\): autovacuum cannot keep up: at (3[3-9]|40) rows/s falling due, autovacuum lets up to 2[0-4]\d\d dead tuples pile up .*` +
		`autovacuum_naptime = 2\ds or less \(server-wide\).*; set, as the table's owner \(plan --apply does\): ` +
		`ALTER TABLE "public"\."consumer_inbox" SET \(autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false\)$`)
	if !fail.MatchString(r.stdout) {
		t.Errorf("plan --check does not say autovacuum cannot keep up as expected\n%s", r)
	}
	if !strings.Contains(r.stdout, `OK   vacuum (public."InboxState"): autovacuum keeps up`) {
		t.Errorf("the quiet table's autovacuum does not keep up?\n%s", r)
	}

	r = e.run("--apply")
	wantExit(t, r, 0, "applied autovacuum of public.consumer_inbox: autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=1000, vacuum_truncate=false")
	var opts []string
	if err := db.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'public.consumer_inbox'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if strings.Join(opts, ",") != "autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=1000,vacuum_truncate=false" {
		t.Errorf("reloptions after plan --apply: %v", opts)
	}
	// Set, but a minute of deletions still outruns a naptime: the check
	// still fails, with nothing left to set.
	r = e.run("--check")
	if !strings.Contains(r.stdout, "FAIL vacuum (public.consumer_inbox): autovacuum cannot keep up") || strings.Contains(r.stdout, "plan --apply does") {
		t.Errorf("after --apply\n%s", r)
	}

	e.cfg.VacuumDeadRatio = 0.1
	r = e.run("--check")
	if !strings.Contains(r.stdout, "OK   vacuum (public.consumer_inbox): the daemon vacuums it after a pass that leaves 10% of its tuples dead") {
		t.Errorf("with the daemon's VACUUM on\n%s", r)
	}
}

// status shows how each table's space is kept reclaimed, and warns when
// autovacuum cannot keep up with the rows falling due while the daemon
// does not vacuum the table itself.
func TestStatusVacuum(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxTable+`
INSERT INTO public.consumer_inbox SELECT 'hot', 'h-' || i, now(), now() + interval '10 seconds' + (i % 50) * interval '1 second' FROM generate_series(1, 2000) i;
ANALYZE public.consumer_inbox;`, inboxPolicy, true)
	r := f.run("status")
	wantExit(t, r, 0, "  dead tuples:              0 (0% of its tuples); last vacuum never, last autovacuum ",
		"  vacuum:                   by the daemon after a pass that leaves 10% of the tuples dead (INBOXKEEPER_VACUUM_DEAD_RATIO)")
	r = f.runWith([]string{"INBOXKEEPER_VACUUM_DEAD_RATIO=0"}, "status")
	wantExit(t, r, 0, "  WARNING vacuum:           autovacuum cannot keep up: at 3",
		`    as the table's owner:   ALTER TABLE public.consumer_inbox SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false)`,
		"(or inboxkeeper plan --apply, once a retention record names the table)")
	// This policy has no retention section: plan --apply is refused, so the
	// advice does not send the operator there as if it were not.
	wantExit(t, f.run("plan", "--apply"), 2, "no retention section")
	r = f.runWith([]string{"INBOXKEEPER_VACUUM_DEAD_RATIO=0"}, "status", "--json")
	wantExit(t, r, 0)
	st := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	// 2,000 rows fall due from 10 to 59 s ahead: counted over the 59 s
	// they reach into, 34 a second, and more as the newest comes nearer
	// (40 at 9 s), less those already due when status counted.
	if v := st.Tables[0].Vacuum; v == nil || v.AutovacuumKeepsUp || v.DaemonVacuums || v.FallingDuePerSecond < 25 || v.FallingDuePerSecond > 41 ||
		len(v.Recommended) == 0 {
		t.Errorf("status --json: vacuum %+v, want autovacuum not keeping up with about 33 rows a second, no daemon VACUUM, and reloptions recommended", v)
	}
}
