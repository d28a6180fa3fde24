package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// A partitioned inbox with one month that expired two months ago (3 rows)
// and a partition for the current month (1 row). Bounds follow the
// database clock, which the commands use.
const (
	partitionedDDL = pgtest.ShortPartitionedDDL + `
DO $$
DECLARE m timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
BEGIN
  EXECUTE format('CREATE TABLE public.old_month PARTITION OF public.consumer_inbox FOR VALUES FROM (%L) TO (%L)', m - interval '2 months', m - interval '1 month');
  EXECUTE format('CREATE TABLE public.this_month PARTITION OF public.consumer_inbox FOR VALUES FROM (%L) TO (%L)', m, m + interval '1 month');
END $$;
INSERT INTO public.consumer_inbox
SELECT 'billing', 'old-' || i, NULL, date_trunc('month', now()) - interval '45 days' FROM generate_series(1, 3) i;
INSERT INTO public.consumer_inbox VALUES ('billing', 'new', NULL, now() + interval '1 minute');`

	partitionedPolicy = `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
    partitions:
      by: month
      premake: 2
      max_expiry: 30d
      detached_retention: 0
`
)

func TestPartitionsCommands(t *testing.T) {
	t.Parallel()
	f := newFixture(t, partitionedDDL, partitionedPolicy, true)

	r := f.run("partitions", "ensure", "--dry-run")
	wantExit(t, r, 0, "partitions to create ", "  to create public.consumer_inbox_p")
	f.wantCount("partitions after a dry run", 2, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.consumer_inbox'::regclass")

	r = f.run("partitions", "ensure")
	wantExit(t, r, 0, "created public.consumer_inbox_p")
	// This month exists (by hand); then the months up to the one holding
	// now + max_expiry (none on the 1st of a 31-day month, else one or
	// two), then premake 2 more.
	made := f.count("SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE inhparent = 'public.consumer_inbox'::regclass AND c.relname LIKE 'consumer\\_inbox\\_p%'")
	want := f.count(`SELECT ((date_part('year', b) - date_part('year', a)) * 12 + date_part('month', b) - date_part('month', a))::int + 2
FROM (SELECT date_trunc('month', now() AT TIME ZONE 'UTC') a, date_trunc('month', (now() + interval '30 days') AT TIME ZONE 'UTC') b) s`)
	if made != want {
		t.Fatalf("ensure made %d partitions, want %d\n%s", made, want, r)
	}
	if !regexp.MustCompile(`coverage \d+d(\d+h)? \(until `).MatchString(r.stdout) {
		t.Fatalf("no coverage in the output\n%s", r)
	}
	// ensure retires nothing.
	f.wantCount("rows after ensure", 4, "SELECT count(*) FROM public.consumer_inbox")

	r = f.run("status")
	wantExit(t, r, 0, "public.consumer_inbox (managed by partition)", "public.old_month [", " due", "next pass detaches:       public.old_month")

	r = f.run("partitions", "bogus")
	wantExit(t, r, 2, `want "partitions ensure"`)

	r = f.run("once")
	wantExit(t, r, 0, "detached 1", "dropped 1", "detached public.old_month", "dropped public.old_month")
	f.wantCount("rows after once", 1, "SELECT count(*) FROM public.consumer_inbox")
	f.wantCount("the old month is gone", 0, "SELECT count(*) FROM pg_class WHERE relname = 'old_month'")

	r = f.run("status", "--json")
	wantExit(t, r, 0)
	st := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	if len(st.Tables) != 1 || st.Tables[0].ManagedBy != "partition" || st.Tables[0].Partitions == nil || st.Tables[0].Partitions.CoverageSeconds == nil ||
		*st.Tables[0].Partitions.CoverageSeconds < 30*86400 {
		t.Fatalf("status --json: %+v\n%s", st, r)
	}
}

func TestPartitionsMetricsInTheDaemon(t *testing.T) {
	t.Parallel()
	f := newFixture(t, partitionedDDL, partitionedPolicy, true)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1h"), "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)
	m := httpGet(t, "http://"+addr+"/metrics")
	cov := metricValue(t, m, `inboxkeeper_partition_coverage_seconds{table="public.consumer_inbox"}`)
	maxExp := metricValue(t, m, `inboxkeeper_partition_max_expiry_seconds{table="public.consumer_inbox"}`)
	if maxExp != 30*86400 || cov < maxExp {
		t.Errorf("coverage %v, max expiry %v\n%s", cov, maxExp, m)
	}
	for _, series := range []string{
		`inboxkeeper_partitions_detached_total{table="public.consumer_inbox"} 1`,
		`inboxkeeper_partitions_dropped_total{table="public.consumer_inbox"} 1`,
		`inboxkeeper_partitions_blocked{reason="hold",table="public.consumer_inbox"} 0`,
		`inboxkeeper_cleanup_lag_seconds{table="public.consumer_inbox"} 0`,
		`inboxkeeper_partitions{state="detached",table="public.consumer_inbox"} 0`,
	} {
		if !strings.Contains(m, series+"\n") {
			t.Errorf("metrics lack %s\n%s", series, m)
		}
	}
	d.stop()
}

// A partition made by hand FROM (MINVALUE) is retired like any other, and
// the passes after it still work: its -infinity lower bound, recorded when
// it was detached, failed every later pass's read of the detached
// partitions ("cannot scan -Infinity into *time.Time"), so none was
// dropped again.
func TestPartitionFromMinvalueRetired(t *testing.T) {
	t.Parallel()
	ddl := pgtest.ShortPartitionedDDL + `
DO $$
DECLARE m timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
BEGIN
  EXECUTE format('CREATE TABLE public.before_all PARTITION OF public.consumer_inbox FOR VALUES FROM (MINVALUE) TO (%L)', m - interval '1 month');
  EXECUTE format('CREATE TABLE public.this_month PARTITION OF public.consumer_inbox FOR VALUES FROM (%L) TO (%L)', m, m + interval '1 month');
END $$;
INSERT INTO public.consumer_inbox SELECT 'billing', 'old-' || i, NULL, date_trunc('month', now()) - interval '45 days' FROM generate_series(1, 3) i;`
	f := newFixture(t, ddl, partitionedPolicy, true)
	wantExit(t, f.run("once"), 0)
	f.wantCount("the MINVALUE partition", 0, "SELECT count(*) FROM pg_class WHERE relname = 'before_all'")
	wantExit(t, f.run("once"), 0)
	wantExit(t, f.run("status"), 0)
}
