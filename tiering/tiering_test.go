package tiering

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the pinned "now" of the tests.
var t0 = time.Date(2026, 6, 15, 12, 0, 0, 0, time.UTC)

// at are the demoter's options with now pinned at now, and the defaults.
func at(now time.Time) Options {
	return Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(now)}}}
}

// inboxDDL is the recommended inbox plus payload columns for in-place
// emptying, with the recommended partial index on the anchor; and a side
// table for the side-table layout.
const inboxDDL = `
CREATE TABLE public.inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_hash   bytea       NOT NULL,
    outcome        text,
    event_time     timestamptz,
    first_seen_at  timestamptz,
    remember_until timestamptz,
    business_key   text,
    payload        text,
    headers        jsonb,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ON public.inbox (remember_until);
CREATE INDEX inbox_hot_idx ON public.inbox (first_seen_at) WHERE payload IS NOT NULL OR headers IS NOT NULL;
CREATE TABLE public.inbox_payload (
    consumer      text        NOT NULL,
    message_id    text        NOT NULL,
    first_seen_at timestamptz NOT NULL,
    payload       text        NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ON public.inbox_payload (first_seen_at);`

// inPlacePolicy and sidePolicy are pgtest's tiered policy with the payload
// of inboxDDL in place (payload and headers) or in its side table.
const inPlacePolicy = pgtest.TieredPolicyHead + "      payload_columns: [payload, headers]\n"
const sidePolicy = pgtest.TieredPolicyHead + "      payload_table: public.inbox_payload\n"

type fixture struct {
	pool  *pgxpool.Pool
	table *catalog.Table
}

func resolve(t *testing.T, pool *pgxpool.Pool, pol string) *catalog.Table {
	t.Helper()
	return pgtest.Resolve(t, pool, pol)[0]
}

// setup makes a migrated database with ddl, resolves the policy's first
// table and creates its permanent key table.
func setup(t *testing.T, ddl, pol string) fixture {
	t.Helper()
	ctx := context.Background()
	pool, _ := pgtest.NewMigratedPool(t, ddl)
	ct := resolve(t, pool, pol)
	if _, err := EnsureKeyTable(ctx, pool, ct); err != nil {
		t.Fatal(err)
	}
	return fixture{pool: pool, table: ct}
}

// insert adds n rows of consumer first seen at base + i*step (event time
// the same, expiry 30 days later), with payload in both layouts.
func (f fixture) insert(t *testing.T, consumer string, n int, base time.Time, step time.Duration) {
	t.Helper()
	pgtest.Exec(t, f.pool, `
INSERT INTO public.inbox (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until, business_key, payload, headers)
SELECT $1, $1 || '-' || i, sha256(($1 || i)::bytea), 'applied', s, s, s + interval '30 days', 'bk-' || $1 || '-' || i,
       repeat('x', 100), '{"h": 1}'
FROM generate_series(0, $4 - 1) i, LATERAL (SELECT $2::timestamptz + i * $3::interval) AS f(s)`,
		consumer, base, step, n)
	pgtest.Exec(t, f.pool, `INSERT INTO public.inbox_payload SELECT consumer, message_id, first_seen_at, payload FROM public.inbox WHERE consumer = $1`, consumer)
}

func (f fixture) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (f fixture) demote(t *testing.T, opts Options) Result {
	t.Helper()
	res, err := New(f.pool, []*catalog.Table{f.table}, opts).RunPass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results, want 1", len(res))
	}
	if res[0].Err != nil {
		t.Fatalf("demotion failed: %v", res[0].Err)
	}
	return res[0]
}

// DeleterResult is what one pass of the deleter did to a table, as far as
// these tests look; Err is the table's error.
type DeleterResult struct {
	Deleted, PermanentKeys, ProtectedByReplays int64
	Err                                        error
}

// RunDeleter runs one pass of the deleter (expiry) over table at now.
// deleter_test.go sets it, from a test package of its own, since the
// deleter imports this package.
var RunDeleter func(pool *pgxpool.Pool, table *catalog.Table, now time.Time) (DeleterResult, error)

func (f fixture) expire(t *testing.T, now time.Time) DeleterResult {
	t.Helper()
	res, err := RunDeleter(f.pool, f.table, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Err != nil {
		t.Fatalf("expiry failed: %v", res.Err)
	}
	return res
}

// hot counts the rows that still have payload, in either layout.
func (f fixture) hot(t *testing.T, where string) int64 {
	if Of(f.table).Side != nil {
		return f.count(t, "SELECT count(*) FROM public.inbox_payload WHERE "+where)
	}
	return f.count(t, "SELECT count(*) FROM public.inbox WHERE (payload IS NOT NULL OR headers IS NOT NULL) AND "+where)
}

var layouts = []struct{ name, policy string }{{"in place", inPlacePolicy}, {"side table", sidePolicy}}

// eachLayout runs test as a parallel subtest for each of layouts, with the
// layout's policy: every guarantee must hold in place and from a side table.
func eachLayout(t *testing.T, test func(t *testing.T, policy string)) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			test(t, l.policy)
		})
	}
}

// The boundary: a row whose anchor is exactly now - hot_for leaves the hot
// tier, one a second younger stays; the database clock is pinned.
func TestDemotionBoundary(t *testing.T) {
	t.Parallel()
	eachLayout(t, func(t *testing.T, policy string) {
		f := setup(t, inboxDDL, policy)
		cut := t0.Add(-72 * time.Hour)
		f.insert(t, "c", 3, cut.Add(-time.Second), time.Second) // cut-1s, cut, cut+1s
		f.insert(t, "old", 10, cut.Add(-10*24*time.Hour), time.Hour)

		dry := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), DryRun: true}}})
		if dry.Demoted != 12 {
			t.Errorf("dry run would demote %d, want 12", dry.Demoted)
		}
		if n := f.hot(t, "true"); n != 13 {
			t.Fatalf("the dry run demoted rows: %d hot, want 13", n)
		}
		res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 4}})
		if res.Demoted != 12 || res.Batches != 3 || res.Tier != Warm {
			t.Errorf("demoted %d in %d batches to %s, want 12 in 3 to warm", res.Demoted, res.Batches, res.Tier)
		}
		if n := f.hot(t, "message_id = 'c-2'"); n != 1 {
			t.Errorf("the row one second inside the hot window lost its payload")
		}
		if n := f.hot(t, "message_id IN ('c-0', 'c-1')"); n != 0 {
			t.Errorf("%d rows at or past the boundary kept their payload", n)
		}
		// Identity, hash, outcome and timestamps stay.
		if n := f.count(t, `SELECT count(*) FROM public.inbox WHERE payload_hash = sha256((consumer || substr(message_id, length(consumer) + 2))::bytea)
  AND outcome = 'applied' AND first_seen_at IS NOT NULL AND remember_until IS NOT NULL AND business_key IS NOT NULL`); n != 13 {
			t.Errorf("%d of 13 rows kept identity, hash, outcome and timestamps", n)
		}
		// A second pass finds nothing more.
		if res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Demoted != 0 {
			t.Errorf("second pass demoted %d", res.Demoted)
		}
		// An hour later the last row goes too.
		if res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0.Add(time.Hour))}}}); res.Demoted != 1 {
			t.Errorf("an hour later demoted %d, want 1", res.Demoted)
		}
	})
}

// The database clock is the default: rows first seen 4 days ago go, rows
// first seen now stay.
func TestDatabaseClock(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL, inPlacePolicy)
	pgtest.Exec(t, f.pool, `INSERT INTO public.inbox (consumer, message_id, payload_hash, first_seen_at, payload) VALUES
 ('c', 'old', '\x00', now() - interval '4 days', 'p'), ('c', 'new', '\x00', now(), 'p'), ('c', 'none', '\x00', NULL, 'p')`)
	if res := f.demote(t, Options{}); res.Demoted != 1 {
		t.Errorf("demoted %d, want 1", res.Demoted)
	}
	if n := f.hot(t, "message_id IN ('new', 'none')"); n != 2 {
		t.Errorf("rows inside the window or without an anchor lost their payload")
	}
}

// Holds: a legal hold (blocks all) keeps the payload; a --blocks delete hold
// and a replay marker do not, but they keep the row when it expires.
func TestHoldsAndReplays(t *testing.T) {
	t.Parallel()
	eachLayout(t, func(t *testing.T, policy string) {
		ctx := context.Background()
		f := setup(t, inboxDDL, policy)
		base := t0.Add(-40 * 24 * time.Hour) // due for demotion and, after 30 days, for deletion
		for _, c := range []string{"legal", "delete-only", "replayed", "free"} {
			f.insert(t, c, 10, base, time.Hour)
		}
		str := func(s string) *string { return &s }
		if _, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: str("legal"), Reason: "litigation", Owner: "legal"}); err != nil {
			t.Fatal(err)
		}
		if _, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: str("delete-only"), Reason: "audit", Owner: "ops", Blocks: holds.BlocksDelete}); err != nil {
			t.Fatal(err)
		}
		if _, err := holds.StartReplay(ctx, f.pool, f.table, holds.ReplaySpec{Scope: "replayed", From: base.Add(-time.Hour), To: base.Add(24 * time.Hour), Owner: "ops"}); err != nil {
			t.Fatal(err)
		}
		// In place, free's expired rows are left to the deleter, which
		// takes them right after; a side table demotes them too.
		want := int64(30)
		if policy == inPlacePolicy {
			want = 20
		}
		dry := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), DryRun: true}}})
		res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 7}})
		if res.Demoted != want || res.ProtectedByHolds != 10 {
			t.Errorf("demoted %d, protected %d; want %d and 10", res.Demoted, res.ProtectedByHolds, want)
		}
		if dry.Demoted != res.Demoted || dry.ProtectedByHolds != res.ProtectedByHolds {
			t.Errorf("dry run %+v disagrees with the pass %+v", dry, res)
		}
		if n := f.hot(t, "consumer = 'legal'"); n != 10 {
			t.Errorf("the legal hold kept %d of 10 payloads", n)
		}
		if n := f.hot(t, "consumer IN ('delete-only', 'replayed')"); n != 0 {
			t.Errorf("%d payloads left that a delete-only hold or a replay keep", n)
		}
		// Deletion: every hold and the replay block it.
		del := f.expire(t, t0)
		if n := f.hot(t, "consumer <> 'legal'"); n != 0 {
			t.Errorf("%d payloads left outside the legal hold after expiry", n)
		}
		if del.Deleted != 10 || del.PermanentKeys != 10 {
			t.Errorf("expiry deleted %d and wrote %d keys, want only the 10 free rows and their keys", del.Deleted, del.PermanentKeys)
		}
		for _, c := range []string{"legal", "delete-only", "replayed"} {
			if n := f.count(t, "SELECT count(*) FROM public.inbox WHERE consumer = $1", c); n != 10 {
				t.Errorf("%s: %d of 10 rows left after expiry", c, n)
			}
		}
	})
}

// A hold added while a demotion batch is in flight: the hold command waits
// for that batch (the fence), and no later batch demotes a held row.
func TestFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inPlacePolicy)
	f.insert(t, "legal", 30, t0.Add(-10*24*time.Hour), time.Minute)
	inFlight, release := make(chan struct{}), make(chan struct{})
	first := true
	d := New(f.pool, []*catalog.Table{f.table}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 10}})
	d.TestSignals.BeforeCommit = func(string, int64) {
		if first {
			first = false
			close(inFlight)
			<-release
		}
	}
	passDone := make(chan Result, 1)
	go func() {
		res, _ := d.RunPass(ctx)
		passDone <- res[0]
	}()
	<-inFlight
	holdDone := pgtest.QueueOnFence(t, f.pool, func() error {
		s := "legal"
		_, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: &s, Reason: "legal", Owner: "legal"})
		return err
	})
	close(release)
	if err := <-holdDone; err != nil {
		t.Fatal(err)
	}
	res := <-passDone
	if res.Err != nil || res.Demoted != 10 {
		t.Errorf("pass: %+v, want only the 10 of the batch in flight", res)
	}
	if n := f.hot(t, "true"); n != 20 {
		t.Errorf("%d rows kept their payload, want 20", n)
	}
}

// A permanent key survives partition retirement: the keys of a detached
// partition are copied in the transaction that drops it. Rolled back, the
// partition and no key remain; committed, the keys and no partition.
func TestCopyPermanentKeysBeforeDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL+`
CREATE TABLE public.parted (LIKE public.inbox) PARTITION BY RANGE (remember_until);
CREATE TABLE public.parted_2026_05 PARTITION OF public.parted FOR VALUES FROM ('2026-05-01') TO ('2026-06-01');
CREATE TABLE public.parted_2026_06 PARTITION OF public.parted FOR VALUES FROM ('2026-06-01') TO ('2026-07-01');`, inPlacePolicy)
	pgtest.Exec(t, f.pool, `INSERT INTO public.parted (consumer, message_id, payload_hash, first_seen_at, remember_until, business_key)
SELECT 'c', 'm' || i, '\x01', timestamptz '2026-04-10' + i * interval '1 day', timestamptz '2026-05-10' + i * interval '1 day', CASE WHEN i % 5 <> 0 THEN 'bk' || i END
FROM generate_series(0, 39) i`) // 2026-05-10 .. 2026-06-18: 22 rows in May, 18 in June
	// A key already kept (an earlier deletion) stays as it was.
	pgtest.Exec(t, f.pool, `INSERT INTO inboxkeeper.keys_public_inbox VALUES ('c', 'bk1', '\x99', '2020-01-01')`)
	pgtest.Exec(t, f.pool, "ALTER TABLE public.parted DETACH PARTITION public.parted_2026_05")
	retire := func(commit bool) int64 {
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		n, err := CopyPermanentKeys(ctx, tx, f.table, `public.parted_2026_05`)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "DROP TABLE public.parted_2026_05"); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	retire(false)
	if n := f.count(t, "SELECT count(*) FROM inboxkeeper.keys_public_inbox"); n != 1 {
		t.Errorf("rolled back: %d keys, want the 1 kept before", n)
	}
	if n := f.count(t, "SELECT count(*) FROM public.parted_2026_05"); n != 22 {
		t.Errorf("rolled back: the partition has %d rows, want 22", n)
	}
	// May: rows 0..21, of which 0, 5, 10, 15, 20 have no key; bk1 existed.
	if n := retire(true); n != 16 {
		t.Errorf("copied %d new keys, want 16", n)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_class WHERE relname = 'parted_2026_05'"); n != 0 {
		t.Errorf("the partition is still there")
	}
	if n := f.count(t, "SELECT count(*) FROM inboxkeeper.keys_public_inbox WHERE business_key = 'bk1' AND payload_hash = '\\x99'"); n != 1 {
		t.Errorf("the key kept before was overwritten")
	}
	if n := f.count(t, "SELECT count(*) FROM inboxkeeper.keys_public_inbox WHERE first_seen = '2026-04-12' AND business_key = 'bk2' AND consumer = 'c'"); n != 1 {
		t.Errorf("bk2's first_seen date is wrong or missing")
	}
}

// Hostile names in every tier column, in both layouts, and a hostile key
// table: they are names, nothing else.
func TestHostileColumnNames(t *testing.T) {
	t.Parallel()
	const ddl = `
CREATE SCHEMA "Odd Schema";
CREATE TABLE public.x (id int);
CREATE TABLE "Odd Schema"."In""box" (
    "Consumer ID" text NOT NULL, "select" text NOT NULL, "Hash ""sum""" bytea, "Seen at; --" timestamptz,
    "Until" timestamptz, "Business Key" text, "Pay load" text, "ORDER" jsonb,
    PRIMARY KEY ("Consumer ID", "select"));
CREATE INDEX ON "Odd Schema"."In""box" ("Until");
CREATE INDEX ON "Odd Schema"."In""box" ("Seen at; --") WHERE "Pay load" IS NOT NULL OR "ORDER" IS NOT NULL;
CREATE TABLE "Odd Schema"."Pay""load" ("Consumer ID" text, "select" text, "Seen at; --" timestamptz, body text, PRIMARY KEY ("Consumer ID", "select"));
CREATE INDEX ON "Odd Schema"."Pay""load" ("Seen at; --");`
	head := `tables:
  - table: '"Odd Schema"."In""box"'
    key: ["Consumer ID", "select"]
    scope: "Consumer ID"
    expires_at: Until
    tiers:
      hot_for: 1d
      anchor: "Seen at; --"
      permanent_key: {columns: ["Consumer ID", "Business Key"], hash: 'Hash "sum"', table: '"Odd Schema"."Keys; drop table x"'}
`
	for _, l := range []struct{ name, policy string }{
		{"in place", head + `      payload_columns: ["Pay load", ORDER]` + "\n"},
		{"side table", head + `      payload_table: '"Odd Schema"."Pay""load"'` + "\n"},
	} {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, ddl, l.policy)
			pgtest.Exec(t, f.pool, `INSERT INTO "Odd Schema"."In""box" VALUES
 ('a''; drop table x; --', '1', '\x01', $1::timestamptz - interval '2 days', $1::timestamptz - interval '1 hour', 'k1', 'p', '{}'),
 ('b', '2', '\x02', $1::timestamptz - interval '2 days', $1::timestamptz + interval '1 hour', 'k2', 'p', '{}'),
 ('b', '3', '\x03', $1::timestamptz, $1::timestamptz + interval '1 hour', 'k3', 'p', '{}')`, t0)
			pgtest.Exec(t, f.pool, `INSERT INTO "Odd Schema"."Pay""load" SELECT "Consumer ID", "select", "Seen at; --", 'body' FROM "Odd Schema"."In""box"`)
			s := "b"
			if _, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: &s, Reason: "r", Owner: "o", Blocks: holds.BlocksDelete}); err != nil {
				t.Fatal(err)
			}
			// In place, a's expired row is left to the deleter.
			want := int64(2)
			if l.name == "in place" {
				want = 1
			}
			if res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Demoted != want {
				t.Errorf("demoted %d, want %d", res.Demoted, want)
			}
			if res := f.expire(t, t0); res.Deleted != 1 || res.PermanentKeys != 1 {
				t.Errorf("deleted %d with %d keys, want 1 and 1", res.Deleted, res.PermanentKeys)
			}
			var consumer, key string
			if err := f.pool.QueryRow(ctx, `SELECT "Consumer ID", "Business Key" FROM "Odd Schema"."Keys; drop table x" WHERE "Hash ""sum""" = '\x01'`).Scan(&consumer, &key); err != nil || consumer != "a'; drop table x; --" || key != "k1" {
				t.Errorf("the key: %q %q %v", consumer, key, err)
			}
			st, err := New(f.pool, []*catalog.Table{f.table}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}).Status(ctx, f.table)
			if err != nil || st.Due != 0 {
				t.Errorf("status: %+v, %v", st, err)
			}
			if n := f.count(t, `SELECT count(*) FROM public.x`); n != 0 {
				t.Errorf("public.x: %d", n)
			}
		})
	}
}

// A side table that lacks the scope column: holds are matched on the
// table's row of the same key; a side row without one (an orphan) has no
// identity left to hold, and is demoted.
func TestSideTableHoldJoin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL+`
CREATE TABLE public.bodies (consumer text, message_id text, first_seen_at timestamptz, body text);
CREATE INDEX ON public.bodies (first_seen_at);`, pgtest.TieredPolicyHead+"      payload_table: public.bodies\n")
	if Of(f.table).Side.HoldColumnsLocal(f.table) {
		// The inbox has scope and event_time; bodies has neither.
		t.Fatal("holds would be matched on the side row, which has no scope column")
	}
	f.insert(t, "legal", 5, t0.Add(-10*24*time.Hour), time.Hour)
	f.insert(t, "free", 5, t0.Add(-10*24*time.Hour), time.Hour)
	pgtest.Exec(t, f.pool, `INSERT INTO public.bodies SELECT consumer, message_id, first_seen_at, payload FROM public.inbox`)
	pgtest.Exec(t, f.pool, `INSERT INTO public.bodies VALUES ('legal', 'orphan', $1::timestamptz - interval '10 days', 'b')`, t0)
	s := "legal"
	if _, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: &s, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	if res.Demoted != 6 || res.ProtectedByHolds != 5 {
		t.Errorf("demoted %d, protected %d; want 6 (5 free and the orphan) and 5", res.Demoted, res.ProtectedByHolds)
	}
	if n := f.count(t, "SELECT count(*) FROM public.bodies WHERE consumer = 'legal'"); n != 5 {
		t.Errorf("%d legal bodies left, want 5", n)
	}
}

// A partitioned side table: rows are matched on (tableoid, ctid).
func TestPartitionedSideTable(t *testing.T) {
	t.Parallel()
	f := setup(t, strings.Replace(inboxDDL, `CREATE TABLE public.inbox_payload (
    consumer      text        NOT NULL,
    message_id    text        NOT NULL,
    first_seen_at timestamptz NOT NULL,
    payload       text        NOT NULL,
    PRIMARY KEY (consumer, message_id)
);`, `CREATE TABLE public.inbox_payload (
    consumer text NOT NULL, message_id text NOT NULL, first_seen_at timestamptz NOT NULL, payload text NOT NULL
) PARTITION BY RANGE (first_seen_at);
CREATE TABLE public.inbox_payload_a PARTITION OF public.inbox_payload FOR VALUES FROM (MINVALUE) TO ('2026-06-05');
CREATE TABLE public.inbox_payload_b PARTITION OF public.inbox_payload FOR VALUES FROM ('2026-06-05') TO (MAXVALUE);`, 1), sidePolicy)
	if Of(f.table).Side.Kind != "p" {
		t.Fatalf("side table kind %q", Of(f.table).Side.Kind)
	}
	f.insert(t, "c", 20, t0.Add(-15*24*time.Hour), 12*time.Hour) // 2026-05-31 .. 2026-06-10, across both partitions
	res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 3}})
	want := f.count(t, "SELECT count(*) FROM public.inbox WHERE first_seen_at <= $1", t0.Add(-72*time.Hour))
	if res.Demoted != want || want < 15 {
		t.Errorf("demoted %d, want %d", res.Demoted, want)
	}
	if n := f.hot(t, "true"); n != 20-want {
		t.Errorf("%d hot rows left, want %d", n, 20-want)
	}
}

// Metrics: rows demoted count, tier estimates appear once analyzed.
func TestMetricsAndMeasure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachLayout(t, func(t *testing.T, policy string) {
		f := setup(t, inboxDDL, policy)
		f.insert(t, "c", 100, t0.Add(-40*24*time.Hour), time.Hour)
		f.insert(t, "d", 50, t0.Add(-24*time.Hour), time.Minute)
		m := NewMetrics(prometheus.NewRegistry(), nil)
		// Before c's rows expire (an expired row is the deleter's, in place).
		res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0.Add(-10*24*time.Hour - time.Hour))}}, Metrics: m})
		if got := testutil.ToFloat64(m.RowsDemoted.WithLabelValues(f.table.Name, Warm)); got != float64(res.Demoted) || got != 100 {
			t.Errorf("rows_demoted_total{tier=warm} = %v, pass demoted %d, want 100", got, res.Demoted)
		}
		if del := f.expire(t, t0.Add(-10*24*time.Hour+49*time.Hour)); del.PermanentKeys != 50 {
			t.Errorf("no permanent key written: %+v", del)
		}
		pgtest.Exec(t, f.pool, "ANALYZE public.inbox; ANALYZE public.inbox_payload; ANALYZE inboxkeeper.keys_public_inbox")
		st, err := Measure(ctx, f.pool, f.table)
		if err != nil {
			t.Fatal(err)
		}
		rows := f.count(t, "SELECT count(*) FROM public.inbox")
		hot := f.hot(t, "true")
		keys := f.count(t, "SELECT count(*) FROM inboxkeeper.keys_public_inbox")
		near := func(got float64, want int64) bool { return got >= float64(want)-1 && got <= float64(want)+1 }
		if !near(st.Rows[Hot], hot) || !near(st.Rows[Warm], rows-hot) || !near(st.Rows[Permanent], keys) {
			t.Errorf("tier rows %v, want hot %d warm %d permanent %d", st.Rows, hot, rows-hot, keys)
		}
		if !(st.BytesPerKey[Hot] > st.BytesPerKey[Warm] && st.BytesPerKey[Warm] > 0 && st.BytesPerKey[Permanent] > 0) {
			t.Errorf("bytes per key %v: want hot > warm > 0 and permanent > 0", st.BytesPerKey)
		}
	})
}

// A missing key table that cannot be created is a configuration error that
// says how to fix it, and nothing is created.
func TestEnsureKeyTableWithoutPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewMigratedPool(t, inboxDDL)
	ct := resolve(t, pool, inPlacePolicy)
	role := fmt.Sprintf("ik_tiering_%d", time.Now().UnixNano()%1e9)
	pgtest.Exec(t, pool, "CREATE ROLE "+role+" NOLOGIN")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	pgtest.Exec(t, pool, "GRANT USAGE ON SCHEMA inboxkeeper TO "+role)
	tx := pgtest.Lock(t, pool, "SET LOCAL ROLE "+role)
	_, err := EnsureKeyTable(ctx, tx, ct)
	if !errors.Is(err, ErrKeyTable) || !strings.Contains(err.Error(), "inboxkeeper.keys_public_inbox") || !strings.Contains(err.Error(), "inboxkeeper migrate") ||
		!strings.Contains(err.Error(), "CREATE TABLE IF NOT EXISTS") {
		t.Errorf("EnsureKeyTable without CREATE: %v", err)
	}
	tx.Rollback(ctx)
	if n := (fixture{pool: pool}).count(t, "SELECT count(*) FROM pg_class WHERE relname = 'keys_public_inbox'"); n != 0 {
		t.Errorf("the key table exists")
	}
	// As the owner it is created once, with the source's column types.
	created, err := EnsureKeyTable(ctx, pool, ct)
	if err != nil || !created {
		t.Fatalf("EnsureKeyTable: %v, %v", created, err)
	}
	if created, err := EnsureKeyTable(ctx, pool, ct); err != nil || created {
		t.Errorf("second EnsureKeyTable: %v, %v", created, err)
	}
	var cols string
	if err := pool.QueryRow(ctx, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY attnum)
FROM pg_attribute WHERE attrelid = 'inboxkeeper.keys_public_inbox'::regclass AND attnum > 0`).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if want := "consumer text not null, business_key text not null, payload_hash bytea, first_seen date"; cols != want {
		t.Errorf("key table columns %q, want %q", cols, want)
	}
}

// In place, rows the deleter is about to take (expired, no hold or replay
// covering them) are left to it: an UPDATE costs three DELETEs. Expired rows
// a replay keeps are still demoted. With a side table, demotion is itself a
// DELETE and takes them all.
func TestInPlaceLeavesExpiredRowsToTheDeleter(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name, policy string
		demoted      int64
	}{{"in place", inPlacePolicy, 6}, {"side table", sidePolicy, 9}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, inboxDDL, layout.policy)
			f.insert(t, "gone", 3, t0.Add(-40*24*time.Hour), time.Minute)
			f.insert(t, "replayed", 3, t0.Add(-40*24*time.Hour), time.Minute)
			f.insert(t, "live", 3, t0.Add(-10*24*time.Hour), time.Minute)
			if _, err := holds.StartReplay(context.Background(), f.pool, f.table, holds.ReplaySpec{Scope: "replayed",
				From: t0.Add(-50 * 24 * time.Hour), To: t0.Add(-30 * 24 * time.Hour), Owner: "test", Force: true}); err != nil {
				t.Fatal(err)
			}
			if res := f.demote(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Demoted != layout.demoted {
				t.Fatalf("demoted %d, want %d", res.Demoted, layout.demoted)
			}
			if res := f.expire(t, t0); res.Deleted != 3 || res.ProtectedByReplays != 3 {
				t.Fatalf("expiry after demotion: %+v", res)
			}
			if n := f.count(t, "SELECT count(*) FROM inboxkeeper.keys_public_inbox WHERE consumer = 'gone'"); n != 3 {
				t.Fatalf("%d permanent keys of the deleted rows, want 3", n)
			}
			if n := f.hot(t, "true"); n != 0 {
				t.Fatalf("%d rows still hot", n)
			}
		})
	}
}
