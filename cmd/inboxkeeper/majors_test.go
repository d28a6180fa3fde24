package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgmajors"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The smoke of every major: the tiered inbox of the tiers tests (legal and
// audit 5 expired rows each, free 5 expired and 5 live, fresh 5 hot), and
// a partitioned inbox of three months: one due with 3 rows, one due with 2
// rows of a held scope, and this month's with 1 row.
const (
	majorsDDL = tieredDDL + "\n" + partitionedDDL + `
DO $$
DECLARE m timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
BEGIN
  EXECUTE format('CREATE TABLE public.held_month PARTITION OF public.consumer_inbox FOR VALUES FROM (%L) TO (%L)', m - interval '3 months', m - interval '2 months');
END $$;
INSERT INTO public.consumer_inbox
SELECT 'legal', 'held-' || i, NULL, date_trunc('month', now()) - interval '75 days' FROM generate_series(1, 2) i;`
)

// majorsPolicy is the two tables' policy file.
var majorsPolicy = pgtest.TieredInboxPolicy + strings.TrimPrefix(partitionedPolicy, "tables:\n")

// Every supported PostgreSQL major runs the daemon end to end: migrate, a
// hold on each table, a replay, a pass held back by a lagging standby, the
// pass that demotes, deletes and retires exactly what is due and nothing
// held, a pass with nothing left to do, and status, all behind a
// streaming standby listed in INBOXKEEPER_REPLICA_URLS. The binaries of
// the majors the distribution lacks come from npm (pgmajors; fetched on
// first use). The majors run side by side.
func TestMajors(t *testing.T) {
	t.Parallel()
	for _, major := range pgmajors.Supported() {
		t.Run(fmt.Sprintf("postgres%d", major), func(t *testing.T) {
			t.Parallel()
			smokeMajor(t, major)
		})
	}
}

func smokeMajor(t *testing.T, major int) {
	bin, err := pgmajors.BinDir(major)
	if err != nil {
		t.Fatal(err)
	}
	primary, standby := startPair(t, major, bin)
	f := &fixture{t: t, url: primary.URL("postgres"), dir: t.TempDir()}
	f.pool, err = pgxpool.New(context.Background(), f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	f.wantCount("the server's major", int64(major), "SELECT current_setting('server_version_num')::int / 10000")
	pgtest.Exec(t, f.pool, majorsDDL)
	f.policy = f.writeFile("inboxkeeper.yaml", majorsPolicy)
	standbyURL := standby.URL("postgres")
	withStandby := func(vars ...string) []string {
		return append([]string{"INBOXKEEPER_REPLICA_URLS=" + standbyURL}, vars...)
	}

	wantExit(t, f.run("migrate"), 0, "control schema inboxkeeper migrated")
	f.addID("hold", "add", "--table", "public.inbox", "--scope", "legal", "--reason", "litigation", "--owner", "legal")
	f.addID("hold", "add", "--table", "public.consumer_inbox", "--scope", "legal", "--reason", "litigation", "--owner", "legal")
	day := func(d int) string { return time.Now().AddDate(0, 0, d).UTC().Format(time.RFC3339) }
	f.addID("replay", "start", "--table", "public.inbox", "--scope", "audit", "--from", day(-12), "--to", day(-8), "--owner", "ops")

	// Behind a standby that applies nothing, the pass waits out its run
	// time and changes nothing. Only the plain table: partition DDL is not
	// bounded by RUN_TIME (a missing month fails inserts), so a pass with
	// the partitioned table waits for the standby however long it takes.
	waitReplayed(t, f.pool, standbyURL)
	pgtest.ExecOn(t, standbyURL, "SELECT pg_wal_replay_pause()")
	plain := f.writeFile("plain.yaml", pgtest.TieredInboxPolicy)
	r := f.runWith(withStandby("INBOXKEEPER_RUN_TIME=2s", "INBOXKEEPER_POLICY_FILE="+plain), "once")
	wantExit(t, r, 0, "public.inbox: demoted 0 to warm, payload kept by holds 5, ", "run time reached while throttled (replica_lag 127.0.0.1:",
		"public.inbox: deleted 0, protected by holds 5, protected by replays 5, ")
	f.wantCount("rows of public.inbox after the held pass", 25, "SELECT count(*) FROM public.inbox")
	f.wantCount("payloads after the held pass", 25, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")
	pgtest.ExecOn(t, standbyURL, "SELECT pg_wal_replay_resume()")

	// Then exactly what is due goes: free's 5 expired rows (their keys
	// kept), and the month without a held row; legal's payload and rows
	// stay, audit's replayed rows stay (warm), free's live rows go warm.
	r = f.runWith(withStandby(), "once")
	wantExit(t, r, 0, "public.inbox: demoted 10 to warm, payload kept by holds 5, ", "detached 1, dropped 1, waiting 1,",
		"detached public.old_month", "dropped public.old_month", "waits: public.held_month (hold: ")
	wantResult(t, r, "public.inbox", "deleted", 5, 5, 5)
	f.wantCount("rows of public.inbox", 20, "SELECT count(*) FROM public.inbox")
	f.wantCount("free's rows", 5, "SELECT count(*) FROM public.inbox WHERE consumer = 'free'")
	f.wantCount("payloads kept (legal, fresh)", 10, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL AND consumer IN ('legal', 'fresh')")
	f.wantCount("payloads", 10, "SELECT count(*) FROM public.inbox WHERE payload IS NOT NULL")
	f.wantCount("permanent keys", 5, "SELECT count(*) FROM inboxkeeper.keys_public_inbox WHERE consumer = 'free'")
	f.wantCount("rows of public.consumer_inbox", 3, "SELECT count(*) FROM public.consumer_inbox")
	f.wantCount("held rows of public.consumer_inbox", 2, "SELECT count(*) FROM public.held_month WHERE consumer = 'legal'")
	f.wantCount("old_month", 0, "SELECT count(*) FROM pg_class WHERE relname = 'old_month'")

	// Nothing more is due.
	r = f.runWith(withStandby(), "once")
	wantExit(t, r, 0, "public.inbox: demoted 0 to warm")
	wantResult(t, r, "public.inbox", "deleted", 0, 5, 5)
	if strings.Contains(r.stdout, "detached public.") || strings.Contains(r.stdout, "dropped public.") {
		t.Errorf("the second pass retired a partition\n%s", r)
	}
	f.wantCount("rows of public.consumer_inbox after the second pass", 3, "SELECT count(*) FROM public.consumer_inbox")

	// status writes no heartbeat: the standby's lag it reads grows from the
	// last pass's last one, a second or more on a loaded machine.
	r = f.runWith(withStandby("INBOXKEEPER_MAX_REPLICA_LAG=1m"), "status")
	wantExit(t, r, 0, "due (deletable now):      0\n", "waits:                    public.held_month (hold: ")
	for _, line := range []string{
		`^  ok   replica_lag 127\.0\.0\.1:\d+: \S+ \(threshold 1m\)$`,
		`^  pace standby \S+: [0-9.]+ (B|KiB|MiB) behind, apply rate .+, window [0-9.]+ (KiB|MiB)$`,
	} {
		if !regexp.MustCompile("(?m)" + line).MatchString(r.stdout) {
			t.Errorf("status lacks a line matching %s\n%s", line, r)
		}
	}

	// The standby applied it all.
	waitReplayed(t, f.pool, standbyURL)
	var onStandby int64
	if err := pgtest.Connect(t, standbyURL).QueryRow(context.Background(), "SELECT count(*) FROM public.inbox").Scan(&onStandby); err != nil || onStandby != 20 {
		t.Errorf("the standby has %d rows of public.inbox (%v), want 20", onStandby, err)
	}
}

// startPair starts a cluster of PostgreSQL major from the binaries in bin,
// and a streaming standby of it, both removed at the end of the test.
func startPair(t *testing.T, major int, bin string) (primary, standby *pgcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: bin})
	if err != nil {
		t.Fatalf("start PostgreSQL %d from %s: %v", major, bin, err)
	}
	t.Cleanup(primary.Destroy)
	if standby, err = primary.StartColdStandby(ctx, nil); err != nil {
		t.Fatalf("start a standby of PostgreSQL %d: %v", major, err)
	}
	t.Cleanup(standby.Destroy)
	return primary, standby
}

// waitReplayed waits until the standby at url has replayed all the WAL
// the primary has inserted so far.
func waitReplayed(t *testing.T, primary *pgxpool.Pool, url string) {
	t.Helper()
	var lsn string
	if err := primary.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	pgtest.WaitFor(t, time.Minute, "the standby to replay up to "+lsn, func() bool {
		var done bool
		err := conn.QueryRow(context.Background(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&done)
		return err == nil && done
	})
}
