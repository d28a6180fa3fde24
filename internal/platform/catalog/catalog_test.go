package catalog_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestResolveErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.ok (id int, "Seen" timestamptz, naive timestamp, txt text, ev timestamptz);
CREATE INDEX ON public.ok ("Seen");
CREATE INDEX ON public.ok (naive);
CREATE TABLE public.noindex (id int, e timestamptz);
CREATE TABLE public.partial (id int, e timestamptz);
CREATE INDEX ON public.partial (e) WHERE id > 0;
CREATE TABLE public.second (id int, e timestamptz);
CREATE INDEX ON public.second (id, e);
CREATE TABLE public.parted (id int, e timestamptz) PARTITION BY RANGE (e);
CREATE VIEW public.v AS SELECT * FROM public.ok;
CREATE TABLE public.precise (id int, e0 timestamptz(0), e3 timestamp(3));
CREATE INDEX ON public.precise (e0);
CREATE INDEX ON public.precise (e3);
CREATE TABLE public.local_parted (id int, e timestamp) PARTITION BY RANGE (e);`)

	cases := []struct {
		name, yaml string
		want       []string // substrings of the error; nil = resolves
	}{
		{"ok", `table: public.ok
    key: [id]
    scope: txt
    event_time: ev
    first_seen: naive
    expires_at: Seen`, nil},
		{"naive timestamp", `table: public.ok
    key: [id]
    expires_after: {column: naive, after: 1d}`, nil},
		{"missing table", `table: public.nope
    key: [id]
    expires_at: e`, []string{"public.nope", "table", "no such table"}},
		{"missing column", `table: public.ok
    key: [nope]
    expires_at: Seen`, []string{"public.ok", "key[0]", `"nope" does not exist`}},
		{"case slip", `table: public.ok
    key: [id]
    expires_at: seen`, []string{"expires_at", `did you mean "Seen"`}},
		{"wrong type", `table: public.ok
    key: [id]
    expires_at: txt`, []string{"expires_at", "is text", "timestamptz"}},
		{"wrong event_time type", `table: public.ok
    key: [id]
    event_time: txt
    expires_at: Seen`, []string{"event_time", "is text"}},
		{"wrong first_seen type", `table: public.ok
    key: [id]
    first_seen: txt
    expires_at: Seen`, []string{"first_seen", "is text"}},
		{"missing first_seen column", `table: public.ok
    key: [id]
    first_seen: nope
    expires_at: Seen`, []string{"first_seen", `"nope" does not exist`}},
		{"missing scope column", `table: public.ok
    key: [id]
    scope: nope
    expires_at: Seen`, []string{"scope", `"nope" does not exist`}},
		{"no index", `table: public.noindex
    key: [id]
    expires_at: e`, []string{"public.noindex", "no valid btree index serves the expiry order", "CREATE INDEX CONCURRENTLY"}},
		{"partial index only", `table: public.partial
    key: [id]
    expires_at: e`, []string{"no valid btree index"}},
		{"index not leading", `table: public.second
    key: [id]
    expires_after: {column: e, after: 1h}`, []string{"expires_after.column", "no valid btree index"}},
		{"partitioned", `table: public.parted
    key: [id]
    expires_at: e`, []string{"partitioned"}},
		{"timestamptz(0)", `table: public.precise
    key: [id]
    expires_at: e0`, nil},
		{"timestamp(3) in a zone", `table: public.precise
    key: [id]
    expires_at: e3
    time_zone: America/New_York`, nil},
		{"a zone PostgreSQL knows not", `table: public.precise
    key: [id]
    expires_at: e3
    time_zone: Etc/Unknown`, nil}, // the policy parser refuses it before the catalog is asked
		{"partitioned local time", `table: public.local_parted
    key: [id]
    expires_at: e
    time_zone: Europe/Berlin
    partitions: {by: month, max_expiry: 30d}`, []string{"time_zone", "partitions are cut in UTC", "Europe/Berlin"}},
		{"view", `table: public.v
    key: [id]
    expires_at: Seen`, []string{"not a table"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := policy.Parse([]byte("tables:\n  - "+c.yaml+"\n"), "p.yaml")
			if c.name == "a zone PostgreSQL knows not" {
				if err == nil || !strings.Contains(err.Error(), "time_zone") {
					t.Fatalf("policy accepted an unknown zone: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = catalog.Resolve(ctx, pool, p.Tables[0])
			if c.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			pgtest.WantInvalid(t, err, c.want...)
		})
	}
}

// A timestamp-without-time-zone column in a zone with daylight saving time:
// the comparison the batches use never takes a row before its instant, even
// in the hour the fall-back repeats, and still uses the index.
func TestLocalTimeComparisons(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.local (id int PRIMARY KEY, e timestamp(3) NOT NULL);
CREATE INDEX ON public.local (e);
-- New York falls back on 2026-11-01: 01:00-02:00 local happens twice.
INSERT INTO public.local VALUES
  (1, '2026-11-01 00:30'), (2, '2026-11-01 00:59:59'), (3, '2026-11-01 01:10'),
  (4, '2026-11-01 01:45'), (5, '2026-11-01 02:10'), (6, '2026-10-31 21:00');`)
	p, err := policy.Parse([]byte(`tables:
  - table: public.local
    key: [id]
    expires_at: e
    time_zone: America/New_York
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := catalog.Resolve(ctx, pool, p.Tables[0])
	if err != nil {
		t.Fatal(err)
	}
	expired := func(now string) []int {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT id FROM public.local WHERE e <= "+tbl.Expiry.Instant("$1::timestamptz")+" ORDER BY id", now)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	for _, c := range []struct {
		now  string
		want string
	}{
		// 20:00 EDT: read as UTC, every row but 5 would look 4 hours old.
		{"2026-11-01T00:00:00Z", "[]"},
		{"2026-11-01T01:30:00Z", "[6]"},
		// 01:30 EDT, the first pass through the repeated hour. Rows 3 and 4
		// (01:10, 01:45) may mean the second pass (EST), an hour later:
		// they stay; the plain wall clock (01:30) would take row 3. The
		// bound moves back a whole hour, to 00:30, so row 2 (00:59:59 EDT,
		// due half an hour ago) waits for the second pass: late, never early.
		{"2026-11-01T05:30:00Z", "[1 6]"},
		{"2026-11-01T06:00:00Z", "[1 2 6]"},
		// 01:30 EST, the second pass: 01:10 has passed either way.
		{"2026-11-01T06:30:00Z", "[1 2 3 6]"},
		{"2026-11-01T07:15:00Z", "[1 2 3 4 5 6]"},
	} {
		if got := fmt.Sprint(expired(c.now)); got != c.want {
			t.Errorf("expired at %s: %s, want %s", c.now, got, c.want)
		}
	}
	// The comparison is a constant for the planner: an index scan.
	pgtest.Exec(t, pool, "SET enable_seqscan = off; ANALYZE public.local")
	var plan string
	if err := pool.QueryRow(ctx, "EXPLAIN SELECT id FROM public.local WHERE e <= "+tbl.Expiry.Instant("$1::timestamptz"), "2026-11-01T05:30:00Z").Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, "Index") {
		t.Errorf("the comparison does not use the index: %s", plan)
	}
}

// countingQuerier counts the rows read through it.
type countingQuerier struct {
	catalog.Querier
	n int
}

func (q *countingQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	q.n++
	return q.Querier.QueryRow(ctx, sql, args...)
}

// WarnLocalTime reads the database's TimeZone only for a timestamp without
// time zone column the policy gives no zone: for timestamptz columns it
// costs no round trip, and warns of nothing, whatever the zone.
func TestWarnLocalTimeReadsTheZoneOnlyWhenNeeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	db := pgtest.CurrentDatabase(t, pool)
	pgtest.Exec(t, pool, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET timezone TO 'America/New_York'")
	pool.Reset() // new connections take the database's zone
	pgtest.Exec(t, pool, pgtest.ShortInboxDDL+`;
CREATE TABLE public.local_inbox (id bigint PRIMARY KEY, remember_until timestamp NOT NULL);
CREATE INDEX ON public.local_inbox (remember_until)`)
	for _, c := range []struct {
		name, policy string
		reads        int
		warns        bool
	}{
		{"timestamptz", pgtest.ShortInboxPolicy, 0, false},
		{"timestamp, no zone", "tables:\n  - table: public.local_inbox\n    key: [id]\n    expires_at: remember_until\n", 1, true},
		{"timestamp, zone given", "tables:\n  - table: public.local_inbox\n    key: [id]\n    expires_at: remember_until\n    time_zone: America/New_York\n", 0, false},
	} {
		var log strings.Builder
		q := &countingQuerier{Querier: pool}
		catalog.WarnLocalTime(ctx, q, pgtest.Resolve(t, pool, c.policy), slog.New(slog.NewTextHandler(&log, nil)))
		if q.n != c.reads || strings.Contains(log.String(), "is read as UTC") != c.warns {
			t.Errorf("%s: %d reads (want %d), log %q (a warning: %v)", c.name, q.n, c.reads, log.String(), c.warns)
		}
	}
}
