package main

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The tiered inbox (pgtest.TieredInboxDDL), filled relative to the database
// clock:
//   - legal: 5 rows first seen 10 days ago, expired 2 hours ago
//   - audit: 5 rows the same
//   - free: 5 rows the same, and 5 first seen 10 days ago that expire in a day
//   - fresh: 5 rows first seen an hour ago
const tieredDDL = pgtest.TieredInboxDDL + `
INSERT INTO public.inbox
SELECT c, c || '-' || i, '\x01', now() - interval '10 days', now() - interval '10 days', now() - interval '2 hours', c || '-bk-' || i, 'secret'
FROM unnest(ARRAY['legal', 'audit', 'free']) c, generate_series(1, 5) i;
INSERT INTO public.inbox
SELECT 'free', 'live-' || i, '\x01', now() - interval '10 days', now() - interval '10 days', now() + interval '1 day', 'live-bk-' || i, 'secret'
FROM generate_series(1, 5) i;
INSERT INTO public.inbox
SELECT 'fresh', 'f-' || i, '\x01', now(), now() - interval '1 hour', now() + interval '30 days', 'f-bk-' || i, 'secret'
FROM generate_series(1, 5) i;`

func TestHoldBlocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, tieredDDL, pgtest.TieredInboxPolicy, true)

	r := f.run("hold", "add", "--table", "public.inbox", "--scope", "legal", "--reason", "r", "--owner", "o", "--blocks", "payload")
	wantExit(t, r, 2, `--blocks "payload": want delete or all`)
	f.wantCount("holds after a refused hold", 0, "SELECT count(*) FROM inboxkeeper.holds")

	legal := f.addID("hold", "add", "--table", "public.inbox", "--scope", "legal", "--reason", "litigation", "--owner", "legal")
	audit := f.addID("hold", "add", "--table", "public.inbox", "--scope", "audit", "--reason", "audit", "--owner", "ops", "--blocks", "delete")
	r = f.run("hold", "list")
	wantExit(t, r, 0, "hold "+audit+` on public.inbox scope="audit" blocks=delete owner="ops"`)
	if strings.Contains(r.stdout, "hold "+legal+` on public.inbox scope="legal" blocks=`) {
		t.Errorf("a hold that blocks all is listed with blocks=\n%s", r)
	}
	f.wantCount("blocks stored", 1, "SELECT count(*) FROM inboxkeeper.holds WHERE blocks = 'delete' AND id = $1::bigint", audit)

	r = f.run("once", "--dry-run")
	wantExit(t, r, 0, "public.inbox: would demote 10 to warm, payload kept by holds 5, ")
	wantResult(t, r, "public.inbox", "would delete", 5, 10, 0)
	f.wantCount("payloads after the dry run", 25, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")
	f.wantCount("key tables after the dry run", 0, "SELECT count(*) FROM pg_class WHERE relname = 'keys_public_inbox'")

	r = f.run("once")
	// audit's rows (their hold blocks deletion only) and free's live ones;
	// free's expired rows are left to the deleter, which takes them next.
	wantExit(t, r, 0, "public.inbox: demoted 10 to warm, payload kept by holds 5, ")
	wantResult(t, r, "public.inbox", "deleted", 5, 10, 0)
	f.wantCount("legal payloads", 5, "SELECT count(*) FROM public.inbox WHERE consumer = 'legal' AND payload IS NOT NULL")
	f.wantCount("audit payloads", 0, "SELECT count(*) FROM public.inbox WHERE consumer = 'audit' AND payload IS NOT NULL")
	f.wantCount("audit rows", 5, "SELECT count(*) FROM public.inbox WHERE consumer = 'audit'")
	f.wantCount("fresh payloads", 5, "SELECT count(*) FROM public.inbox WHERE consumer = 'fresh' AND payload IS NOT NULL")
	f.wantCount("permanent keys", 5, "SELECT count(*) FROM inboxkeeper.keys_public_inbox WHERE consumer = 'free' AND business_key LIKE 'free-bk-%' AND first_seen IS NOT NULL")

	pgtestAnalyze(t, f)
	r = f.run("status")
	if n := strings.Count(r.stdout, "public.inbox\n"); n != 1 {
		t.Errorf("status names public.inbox %d times, want once\n%s", n, r)
	}
	wantExit(t, r, 0, "\n  tiers:                    hot for 3d, payload in place",
		"due for demotion:       5 (held ones included; holds blocking demotion: 1)", "permanent:              ~5 rows", "in inboxkeeper.keys_public_inbox")
	r = f.run("status", "--json")
	wantExit(t, r, 0)
	st := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	if len(st.Tables) != 1 || st.Tables[0].Tiers == nil || st.Tables[0].Rows == nil {
		t.Fatalf("status --json: %+v\n%s", st, r)
	}
	ti, of := st.Tables[0].Tiers, func(v *float64) float64 {
		if v == nil {
			return -1
		}
		return *v
	}
	if ti.Due != 5 || of(ti.Rows.Warm) != 10 || of(ti.Rows.Hot) != 10 || ti.PermanentKeyTable == nil || *ti.PermanentKeyTable != "inboxkeeper.keys_public_inbox" {
		t.Errorf("status --json tiers: %+v\n%s", ti, r)
	}
	if h := st.Tables[0].Rows.Holds; len(h) != 2 || h[1].Blocks != "delete" {
		t.Errorf("status --json holds: %+v", st.Tables)
	}
}

func pgtestAnalyze(t *testing.T, f *fixture) {
	t.Helper()
	if _, err := f.pool.Exec(t.Context(), "ANALYZE public.inbox; ANALYZE inboxkeeper.keys_public_inbox"); err != nil {
		t.Fatal(err)
	}
}

// A daemon role that may not create the permanent key table: once exits 2,
// says what to run, and changes nothing.
func TestOnceWithoutKeyTablePrivilege(t *testing.T) {
	t.Parallel()
	f := newFixture(t, tieredDDL, pgtest.TieredInboxPolicy, true)
	role := fmt.Sprintf("ik_nokeys_%d", os.Getpid()) // roles are cluster-wide
	pgtestExecf(t, f, "DROP ROLE IF EXISTS "+role)
	pgtestExecf(t, f, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw'")
	t.Cleanup(func() { _, _ = f.pool.Exec(t.Context(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	pgtestExecf(t, f, "GRANT USAGE ON SCHEMA inboxkeeper TO "+role+"; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA inboxkeeper TO "+role+
		"; GRANT SELECT, UPDATE, DELETE ON public.inbox TO "+role)
	// The dry run refuses it as the real run does, and creates nothing.
	for _, args := range [][]string{{"once", "--dry-run"}, {"once"}} {
		r := f.runWith([]string{"INBOXKEEPER_DATABASE_URL=" + asRole(t, f.url, role)}, args...)
		wantExit(t, r, 2, "permanent key table inboxkeeper.keys_public_inbox of table public.inbox does not exist and cannot be created", "inboxkeeper migrate")
	}
	f.wantCount("rows after the refused pass", 25, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")

	// run, as a sidecar would, waits for it instead of exiting.
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_DATABASE_URL="+asRole(t, f.url, role), "INBOXKEEPER_INTERVAL=1h"), "run")
	d.waitLine(regexp.MustCompile(`waiting for a permanent key table.*inboxkeeper migrate`), 30*time.Second)

	// migrate, as the owner, creates it; then the role can run. The role
	// may write to it from the moment it exists (default privileges): a
	// GRANT after migrate left a window in which the daemon found the table
	// and ran its pass without the privilege, and this test failed in CI.
	pgtestExecf(t, f, "ALTER DEFAULT PRIVILEGES IN SCHEMA inboxkeeper GRANT SELECT, INSERT ON TABLES TO "+role)
	r := f.run("migrate")
	wantExit(t, r, 0, "permanent key table inboxkeeper.keys_public_inbox created for public.inbox")
	wantExit(t, f.run("migrate"), 0, "permanent key table inboxkeeper.keys_public_inbox of public.inbox exists")
	d.waitLine(passDone, 60*time.Second)
	d.stop()
	// The daemon's pass demoted free's live rows (every expired row is the
	// deleter's) and deleted the 15 expired ones with their keys.
	f.wantCount("payloads left", 5, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")
	f.wantCount("permanent keys", 15, "SELECT count(*) FROM inboxkeeper.keys_public_inbox")
	r = f.runWith([]string{"INBOXKEEPER_DATABASE_URL=" + asRole(t, f.url, role)}, "once")
	wantExit(t, r, 0, "public.inbox: demoted 0 to warm", "public.inbox: deleted 0,")
}

// asRole is the connection string url with another user.
func asRole(t *testing.T, dsn, role string) string {
	t.Helper()
	if !strings.Contains(dsn, "://") {
		return dsn + " user=" + role + " password=pw"
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "pw")
	return u.String()
}

func pgtestExecf(t *testing.T, f *fixture, sql string) {
	t.Helper()
	if _, err := f.pool.Exec(t.Context(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// RUN_TIME bounds the whole pass, demotion and deletion together: with the
// daemon paused, demotion waits out the run time, and deletion, which
// comes after it, starts past the deadline and stops at once instead of
// waiting a second RUN_TIME.
func TestRunTimeCoversTheWholePass(t *testing.T) {
	t.Parallel()
	f := newFixture(t, tieredDDL, pgtest.TieredInboxPolicy, true)
	wantExit(t, f.run("pause", "--reason", "test"), 0)
	r := f.runWith([]string{"INBOXKEEPER_RUN_TIME=1s"}, "once")
	wantExit(t, r, 0)
	for _, want := range []string{
		"public.inbox: demoted 0 to warm", "(stopped early: run time reached while throttled (manual_pause",
		"public.inbox: deleted 0,", "(stopped early: run time reached)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("once lacks %q\n%s", want, r)
		}
	}
	f.wantCount("rows, nothing deleted", 25, "SELECT count(*) FROM public.inbox")
}

// A partitioned inbox with tiers is demoted by the pass too: its payload
// went only with its month (the pass gave it no demotion step, and said
// nothing), while status counted its rows due for demotion.
func TestPartitionedInboxDemoted(t *testing.T) {
	t.Parallel()
	ddl := strings.Replace(pgtest.TieredInboxDDL, "    PRIMARY KEY (consumer, message_id)\n);", "    PRIMARY KEY (consumer, message_id, remember_until)\n) PARTITION BY RANGE (remember_until);", 1) + `
CREATE TABLE public.inbox_all PARTITION OF public.inbox FOR VALUES FROM ('2000-01-01') TO ('2100-01-01');
INSERT INTO public.inbox
SELECT 'c', 'm-' || i, '\x01', now() - interval '5 days', now() - interval '5 days', now() + interval '20 days', 'bk-' || i, 'secret'
FROM generate_series(1, 50) i;`
	policy := pgtest.TieredInboxPolicy + "    partitions: {by: month, max_expiry: 30d, premake: 1}\n"
	f := newFixture(t, ddl, policy, true)
	wantExit(t, f.run("once", "--dry-run"), 0, "public.inbox: would demote 50 to warm")
	f.wantCount("payloads after the dry run", 50, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")
	wantExit(t, f.run("once"), 0, "public.inbox: demoted 50 to warm")
	f.wantCount("payloads after the pass", 0, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")
	f.wantCount("rows after the pass", 50, "SELECT count(*) FROM public.inbox")
}
