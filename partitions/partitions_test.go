package partitions

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/gatetest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the pinned "now" of most tests.
var t0 = time.Date(2026, 6, 15, 12, 0, 0, 0, time.UTC)

// parentDDL is a partitioned inbox with no partitions yet: the columns of
// the recommended layout (inbox.PartitionedDDL) the manager reads, and no
// others, so that the tests' rows stay short to write.
const parentDDL = pgtest.ShortPartitionedDDL

func policyText(retention string) string {
	return `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    expires_at: remember_until
    partitions:
      by: month
      premake: 3
      max_expiry: 60d
      detached_retention: ` + retention + "\n"
}

type fixture struct {
	pool  *pgxpool.Pool
	url   string
	table *catalog.Table
}

func setup(t *testing.T, ddl, pol string) fixture {
	t.Helper()
	pool, url := pgtest.NewMigratedPool(t, ddl)
	return fixture{pool: pool, url: url, table: pgtest.Resolve(t, pool, pol)[0]}
}

// poolAs is a pool on the fixture's database as role, closed at the end of
// the test.
func (f fixture) poolAs(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (f fixture) manager(opts Options) *Manager {
	return New(f.pool, []*catalog.Table{f.table}, opts)
}

// may10 is when the rows of May that most tests write were received.
var may10 = time.Date(2026, 5, 10, 0, 0, 0, 0, time.UTC)

// legalHold adds a hold on the rows of scope: its ID.
func (f fixture) legalHold(t *testing.T, scope string) int64 {
	t.Helper()
	id, err := holds.AddHold(context.Background(), f.pool, f.table, holds.HoldSpec{Scope: &scope, Reason: "legal", Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (f fixture) pass(t *testing.T, opts Options) TableResult {
	t.Helper()
	res, err := f.manager(opts).RunPass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil {
		t.Fatalf("pass failed: %v", res[0].Err)
	}
	return res[0]
}

// names lists the partitions of the parent as "name [lower, upper)".
func (f fixture) names(t *testing.T) []string {
	t.Helper()
	parts, err := readPartitions(context.Background(), f.pool, f.table, dbconn.TxSettings{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range parts {
		out = append(out, fmt.Sprintf("%s [%s, %s)", p.Name, fmtBound(p.Lower), fmtBound(p.Upper)))
	}
	return out
}

func fmtBound(x *time.Time) string {
	if x == nil {
		return "∞"
	}
	return x.Format("2006-01-02")
}

func (f fixture) exists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	if err := f.pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func (f fixture) count(t *testing.T, rel, where string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+rel+" WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func wantNames(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("partitions:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

// premadeAtT0 are the months a pass at t0 makes: now + max_expiry (60d)
// falls in August, and premake (3) adds three more, up to November.
var premadeAtT0 = []string{
	"consumer_inbox_p202606 [2026-06-01, 2026-07-01)",
	"consumer_inbox_p202607 [2026-07-01, 2026-08-01)",
	"consumer_inbox_p202608 [2026-08-01, 2026-09-01)",
	"consumer_inbox_p202609 [2026-09-01, 2026-10-01)",
	"consumer_inbox_p202610 [2026-10-01, 2026-11-01)",
	"consumer_inbox_p202611 [2026-11-01, 2026-12-01)",
}

func TestPremakeFromEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t, parentDDL, policyText("0"))
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, nil)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}, Metrics: m})
	wantNames(t, f.names(t), premadeAtT0...)
	if len(res.Created) != 6 {
		t.Fatalf("created %v", res.Created)
	}
	wantCoverage := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Sub(t0)
	if res.Coverage != wantCoverage {
		t.Fatalf("coverage %v, want %v", res.Coverage, wantCoverage)
	}
	if got := m.Coverage.Value("public.consumer_inbox"); got != wantCoverage.Seconds() {
		t.Fatalf("coverage metric %v, want %v", got, wantCoverage.Seconds())
	}
	if got := m.MaxExpiry.Value("public.consumer_inbox"); got != (60 * 24 * time.Hour).Seconds() {
		t.Fatalf("max expiry metric %v", got)
	}
	if got := testutil.ToFloat64(m.Created.WithLabelValues("public.consumer_inbox")); got != 6 {
		t.Fatalf("created metric %v", got)
	}

	// Idempotent: the next pass creates nothing.
	if res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}}); len(res.Created) != 0 {
		t.Fatalf("second pass created %v", res.Created)
	}
	// A month later, one more month is due at the far end.
	later := t0.AddDate(0, 1, 0)
	if res := f.pass(t, Options{Base: service.Base{Clock: service.At(later)}}); !slices.Equal(res.Created, []string{"public.consumer_inbox_p202612"}) {
		t.Fatalf("a month later created %v", res.Created)
	}

	// Each partition got the parent's index on the key.
	var idx int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_index WHERE indrelid = 'public.consumer_inbox_p202608'::regclass`).Scan(&idx); err != nil || idx != 1 {
		t.Fatalf("indexes on a new partition: %d, %v", idx, err)
	}
}

func TestInsertBeyondCoverageFails(t *testing.T) {
	t.Parallel()
	f := setup(t, parentDDL, policyText("0"))
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox VALUES ('c', 'inside', NULL, $1)`, res.CoveredUntil.Add(-time.Second))
	_, err := f.pool.Exec(context.Background(), `INSERT INTO public.consumer_inbox VALUES ('c', 'beyond', NULL, $1)`, *res.CoveredUntil)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Fatalf("insert beyond coverage: %v, want a check violation (no partition for the row)", err)
	}
}

func TestPremakeFillsGaps(t *testing.T) {
	t.Parallel()
	f := setup(t, parentDDL+`
CREATE TABLE public.consumer_inbox_p202606 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-06-01 00:00:00+00') TO ('2026-07-01 00:00:00+00');
-- made by hand, another name, half a month
CREATE TABLE public.inbox_hand PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-08-01 00:00:00+00') TO ('2026-08-16 00:00:00+00');
CREATE TABLE public.consumer_inbox_p202610 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00');`, policyText("0"))
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	wantNames(t, f.names(t),
		"consumer_inbox_p202606 [2026-06-01, 2026-07-01)",
		"consumer_inbox_p202607 [2026-07-01, 2026-08-01)",
		"inbox_hand [2026-08-01, 2026-08-16)",
		"consumer_inbox_p202608 [2026-08-16, 2026-09-01)",
		"consumer_inbox_p202609 [2026-09-01, 2026-10-01)",
		"consumer_inbox_p202610 [2026-10-01, 2026-11-01)",
		"consumer_inbox_p202611 [2026-11-01, 2026-12-01)")
	if len(res.Created) != 4 {
		t.Fatalf("created %v", res.Created)
	}
}

func TestCoverageStopsAtAGap(t *testing.T) {
	parts := []Partition{
		{Lower: ptr(t0.AddDate(0, 0, -20)), Upper: ptr(t0.AddDate(0, 0, 10))},
		{Lower: ptr(t0.AddDate(0, 0, 10)), Upper: ptr(t0.AddDate(0, 0, 40))},
		{Lower: ptr(t0.AddDate(0, 0, 50)), Upper: nil},
	}
	if got := coveredUntil(parts, t0); !got.Equal(t0.AddDate(0, 0, 40)) {
		t.Fatalf("covered until %v", got)
	}
	if got := coveredUntil(parts, t0.AddDate(0, 0, 55)); got != nil {
		t.Fatalf("a MAXVALUE partition covers everything, got %v", got)
	}
	if got := coveredUntil(parts, t0.AddDate(0, 0, 45)); !got.Equal(t0.AddDate(0, 0, 45)) {
		t.Fatalf("uncovered now: %v", got)
	}
	parts[1].DetachPending = true
	if got := coveredUntil(parts, t0); !got.Equal(t0.AddDate(0, 0, 10)) {
		t.Fatalf("a pending detach takes no rows: covered until %v", got)
	}
}

func ptr[T any](v T) *T { return &v }

func TestParseBound(t *testing.T) {
	for _, c := range []struct {
		in           string
		lower, upper string
		err          bool
	}{
		{in: "FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-02-01 00:00:00+00')", lower: "2026-01-01T00:00:00Z", upper: "2026-02-01T00:00:00Z"},
		{in: "FOR VALUES FROM ('2026-01-01 00:00:00') TO ('2026-02-01 12:30:00.5')", lower: "2026-01-01T00:00:00Z", upper: "2026-02-01T12:30:00.5Z"},
		{in: "FOR VALUES FROM (MINVALUE) TO ('2026-02-01 00:00:00+00')", lower: "∞", upper: "2026-02-01T00:00:00Z"},
		{in: "FOR VALUES FROM ('2026-02-01 00:00:00+00') TO (MAXVALUE)", lower: "2026-02-01T00:00:00Z", upper: "∞"},
		{in: "DEFAULT", err: true},
		{in: "FOR VALUES IN ('a')", err: true},
		{in: "FOR VALUES FROM ('yesterday') TO ('2026-02-01 00:00:00+00')", err: true},
	} {
		lo, up, err := parseBound(c.in)
		if c.err {
			if err == nil {
				t.Errorf("%s: no error", c.in)
			}
			continue
		}
		f := func(x *time.Time) string {
			if x == nil {
				return "∞"
			}
			return x.Format(time.RFC3339Nano)
		}
		if err != nil || f(lo) != c.lower || f(up) != c.upper {
			t.Errorf("%s: %s %s %v", c.in, f(lo), f(up), err)
		}
	}
}

// insertRows puts n rows of consumer in the month of at.
func (f fixture) insertRows(t *testing.T, consumer string, n int, at time.Time) {
	t.Helper()
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, event_time, remember_until)
SELECT $1, $1 || '-' || i, $2::timestamptz - interval '30 days', $2::timestamptz + i * interval '1 minute' FROM generate_series(1, $3) i`, consumer, at, n)
}

const mayDDL = parentDDL + `
CREATE TABLE public.consumer_inbox_p202605 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-05-01 00:00:00+00') TO ('2026-06-01 00:00:00+00');`

// setupMay is the inbox with May 2026's partition, the months after it
// made by a pass on 20 May, and 10 rows of consumer "a" on 10 May.
func setupMay(t *testing.T) fixture {
	t.Helper()
	f := setup(t, mayDDL, policyText("0"))
	f.pass(t, Options{Base: service.Base{Clock: service.At(time.Date(2026, 5, 20, 0, 0, 0, 0, time.UTC))}})
	f.insertRows(t, "a", 10, may10)
	return f
}

func TestHoldOnOneScopeKeepsThePartition(t *testing.T) {
	t.Parallel()
	f := setupMay(t)
	ctx := context.Background()
	f.insertRows(t, "b", 10, may10)
	f.insertRows(t, "b", 5, time.Date(2026, 6, 10, 0, 0, 0, 0, time.UTC))

	id := f.legalHold(t, "a")
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, nil)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}, Metrics: m})
	if len(res.Detached) != 0 || len(res.Blocked) != 1 || res.Blocked[0].Reason != "hold" || res.Blocked[0].Partition != "public.consumer_inbox_p202605" {
		t.Fatalf("with a hold: detached %v, blocked %+v", res.Detached, res.Blocked)
	}
	if got := m.Blocked.Value("public.consumer_inbox", "hold"); got != 1 {
		t.Fatalf("blocked{reason=hold} = %v", got)
	}
	// Rows of the other scope in the covered partition are kept too.
	if n := f.count(t, "public.consumer_inbox", "consumer = 'b' AND remember_until < '2026-06-01'"); n != 10 {
		t.Fatalf("rows of b kept: %d", n)
	}
	if res.CleanupLag != 0 {
		t.Fatalf("a held partition is not lag: %v", res.CleanupLag)
	}

	if err := holds.ReleaseHold(ctx, f.pool, id); err != nil {
		t.Fatal(err)
	}
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}, Metrics: m})
	if !slices.Equal(res.Detached, []string{"public.consumer_inbox_p202605"}) || !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) {
		t.Fatalf("after release: detached %v dropped %v blocked %+v", res.Detached, res.Dropped, res.Blocked)
	}
	if f.exists(t, "public.consumer_inbox_p202605") {
		t.Fatal("the partition still exists")
	}
	if n := f.count(t, "public.consumer_inbox", "true"); n != 5 {
		t.Fatalf("rows left: %d, want the 5 of June", n)
	}
	if got := m.Blocked.Value("public.consumer_inbox", "hold"); got != 0 {
		t.Fatalf("blocked{reason=hold} after release = %v", got)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues("public.consumer_inbox")); got != 1 {
		t.Fatalf("dropped metric %v", got)
	}
}

func TestReplayKeepsThePartition(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	ctx := context.Background()
	f.insertRows(t, "a", 3, may10)
	from, to := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)
	id, err := holds.StartReplay(ctx, f.pool, f.table, holds.ReplaySpec{Scope: "a", From: from, To: to, Owner: "test", Force: true})
	if err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if len(res.Blocked) != 1 || res.Blocked[0].Reason != "replay" {
		t.Fatalf("blocked %+v", res.Blocked)
	}
	if err := holds.FinishReplay(ctx, f.pool, id); err != nil {
		t.Fatal(err)
	}
	if res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}}); len(res.Dropped) != 1 {
		t.Fatalf("after the replay: %+v", res)
	}
}

func TestEmptyPartitionUnderScopedHoldGoes(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	f.legalHold(t, "a")
	f.insertRows(t, "b", 3, may10)
	if res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}}); len(res.Dropped) != 1 {
		t.Fatalf("a partition with no held row must go: %+v", res)
	}
}

func TestDetachedRetentionWithPinnedClock(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("7d"))
	f.insertRows(t, "a", 3, may10)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if !slices.Equal(res.Detached, []string{"public.consumer_inbox_p202605"}) || len(res.Dropped) != 0 || len(res.Waiting) != 1 {
		t.Fatalf("first pass: %+v", res)
	}
	// Detached, still a table, no longer seen through the parent.
	if !f.exists(t, "public.consumer_inbox_p202605") || f.count(t, "public.consumer_inbox", "true") != 0 || f.count(t, "public.consumer_inbox_p202605", "true") != 3 {
		t.Fatal("the detached partition should exist apart from the parent, rows intact")
	}
	if res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0.Add(7*24*time.Hour - time.Second))}}); len(res.Dropped) != 0 {
		t.Fatalf("dropped before its retention: %+v", res.Dropped)
	}
	if res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0.Add(7 * 24 * time.Hour))}}); !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) {
		t.Fatalf("not dropped after its retention: %+v", res)
	}
	if f.exists(t, "public.consumer_inbox_p202605") {
		t.Fatal("still exists")
	}
	var detached, dropped time.Time
	if err := f.pool.QueryRow(context.Background(), `SELECT detached_at, dropped_at FROM inboxkeeper.partitions WHERE partition_name = 'consumer_inbox_p202605'`).Scan(&detached, &dropped); err != nil {
		t.Fatal(err)
	}
	if !detached.Equal(t0) || !dropped.Equal(t0.Add(7*24*time.Hour)) {
		t.Fatalf("record: detached %v dropped %v", detached, dropped)
	}
}

func TestHoldAddedAfterDetachKeepsTheTable(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("1d"))
	f.insertRows(t, "a", 3, may10)
	f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if _, err := holds.AddHold(context.Background(), f.pool, f.table, holds.HoldSpec{Reason: "incident", Owner: "test"}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0.AddDate(0, 0, 2))}})
	if len(res.Dropped) != 0 || len(res.Blocked) != 1 || !res.Blocked[0].Detached || res.Blocked[0].Reason != "hold" {
		t.Fatalf("a hold on detached rows must keep them: %+v", res)
	}
	if !f.exists(t, "public.consumer_inbox_p202605") {
		t.Fatal("dropped under a hold")
	}
}

// twoDueMonths is a table whose April (a's 3 rows) and May (b's 3 rows)
// are both due for retirement at t0, premade, with no retention after the
// detach.
func twoDueMonths(t *testing.T) fixture {
	t.Helper()
	f := setup(t, mayDDL+`
CREATE TABLE public.consumer_inbox_p202604 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-04-01 00:00:00+00') TO ('2026-05-01 00:00:00+00');`, policyText("0"))
	f.insertRows(t, "a", 3, time.Date(2026, 4, 10, 0, 0, 0, 0, time.UTC))
	f.insertRows(t, "b", 3, may10)
	if _, err := f.manager(Options{Base: service.Base{Clock: service.At(t0)}}).Ensure(context.Background()); err != nil { // premake only
		t.Fatal(err)
	}
	return f
}

// While one detach stays pending, a due partition that a hold covers says
// "hold", not that it waits for the detach: status, the metric and an
// alert on reason="hold" must see the hold.
func TestHeldPartitionBehindAPendingDetach(t *testing.T) {
	t.Parallel()
	f := twoDueMonths(t)
	ctx := context.Background()
	b := "b"
	if _, err := holds.AddHold(ctx, f.pool, f.table, holds.HoldSpec{Scope: &b, Reason: "incident", Owner: "test"}); err != nil {
		t.Fatal(err)
	}
	rtx := pgtest.Lock(t, pgtest.Connect(t, f.url), "SELECT count(*) FROM public.consumer_inbox")
	defer func() { _ = rtx.Rollback(ctx) }()
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0), MaxRetries: 1}})
	if len(res.Blocked) != 2 || res.Blocked[0].Reason != "lock_timeout" || res.Blocked[1].Partition != "public.consumer_inbox_p202605" || res.Blocked[1].Reason != "hold" {
		t.Fatalf("a held partition behind a pending detach: %+v", res.Blocked)
	}
}

// A reader that began before the detach keeps DETACH CONCURRENTLY waiting
// in its second phase; the lock timeout ends the wait with the detach
// pending, and the next pass finishes it with FINALIZE.
func TestInterruptedDetachIsFinished(t *testing.T) {
	t.Parallel()
	f := twoDueMonths(t)
	ctx := context.Background()

	rtx := pgtest.Lock(t, pgtest.Connect(t, f.url), "SELECT count(*) FROM public.consumer_inbox")
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0), MaxRetries: 1}})
	if len(res.Blocked) != 2 || res.Blocked[0].Reason != "lock_timeout" || res.Blocked[0].Partition != "public.consumer_inbox_p202604" ||
		res.Blocked[1].Reason != "lock_timeout" || !strings.Contains(res.Blocked[1].Detail, "waits for the interrupted detach of public.consumer_inbox_p202604") {
		t.Fatalf("with a reader open: %+v", res)
	}
	var pending bool
	if err := f.pool.QueryRow(ctx, `SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = 'public.consumer_inbox_p202604'::regclass`).Scan(&pending); err != nil || !pending {
		t.Fatalf("the detach should be pending: %v %v", pending, err)
	}
	// Inserts into the parent never waited meanwhile; they do not now.
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox VALUES ('c', 'during', NULL, $1)`, t0.AddDate(0, 0, 1))
	if err := rtx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	res = f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	want := []string{"public.consumer_inbox_p202604", "public.consumer_inbox_p202605"}
	if !slices.Equal(res.Detached, want) || !slices.Equal(res.Dropped, want) {
		t.Fatalf("next pass: %+v", res)
	}
}

// A partition detached by a pass that died before it recorded the end of
// the detach is still dropped by a later pass.
func TestDetachRecordedBeforeDeath(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := f.manager(Options{Base: service.Base{Clock: service.At(t0)}})
	m.TestSignals.BeforeDetach = func(p Partition) {
		// The detach happens, by someone else's hand, and this pass dies.
		pgtest.Exec(t, f.pool, fmt.Sprintf("ALTER TABLE public.consumer_inbox DETACH PARTITION %s", p.Ident()))
		cancel()
	}
	m.RunPass(ctx)
	if !f.exists(t, "public.consumer_inbox_p202605") {
		t.Fatal("the table should still exist")
	}
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) {
		t.Fatalf("next pass: %+v", res)
	}
}

func TestHandMadePartitionsWithOtherNames(t *testing.T) {
	t.Parallel()
	// The recommended layout with partitions made by hand, named as the
	// manager would not name them.
	f := setup(t, inbox.PartitionedDDL+`
CREATE TABLE public.consumer_inbox_p1 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2020-01-01') TO ('2026-07-01');
CREATE TABLE public.consumer_inbox_p2 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-07-01') TO ('2030-01-01');`, `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
    partitions: {by: month, max_expiry: 30d, detached_retention: 0}
`)
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
VALUES ('c', 'old', '\x00', now(), now(), '2026-06-30'), ('c', 'new', '\x00', now(), now(), '2026-07-02')`)
	// p1 runs to 2026-07-01 and p2 to 2030: nothing to make, nothing due.
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if len(res.Created) != 0 || len(res.Detached) != 0 {
		t.Fatalf("before July: %+v", res)
	}
	if want := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Sub(t0); res.Coverage != want {
		t.Fatalf("coverage %v, want %v", res.Coverage, want)
	}
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC))}})
	if !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p1"}) {
		t.Fatalf("on July 1st: %+v", res)
	}
	if n := f.count(t, "public.consumer_inbox", "true"); n != 1 {
		t.Fatalf("rows left %d", n)
	}
}

// Two instances working at once (an overlapping cron run) make each month
// once and retire each partition once, and neither fails.
func TestTwoInstances(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	f.insertRows(t, "a", 3, may10)
	var wg sync.WaitGroup
	results := make([][]TableResult, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _ = f.manager(Options{Base: service.Base{Clock: service.At(t0)}}).RunPass(context.Background())
		}()
	}
	wg.Wait()
	created, dropped := 0, 0
	for i, r := range results {
		if len(r) != 1 || r[0].Err != nil {
			t.Fatalf("instance %d: %+v", i, r)
		}
		created += len(r[0].Created)
		dropped += len(r[0].Dropped)
	}
	wantNames(t, f.names(t), premadeAtT0...)
	if created != 6 || dropped != 1 {
		t.Fatalf("created %d (want 6) and dropped %d (want 1) across instances", created, dropped)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	f.insertRows(t, "a", 3, may10)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0), DryRun: true}})
	// With no retention after the detach, the pass drops what it detaches:
	// the dry run says so (it listed nothing to drop).
	if len(res.Created) != 6 || !slices.Equal(res.Detached, []string{"public.consumer_inbox_p202605"}) ||
		!slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) {
		t.Fatalf("dry run: %+v", res)
	}
	wantNames(t, f.names(t), "consumer_inbox_p202605 [2026-05-01, 2026-06-01)")
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if !slices.Equal(res.Detached, []string{"public.consumer_inbox_p202605"}) || !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) {
		t.Fatalf("the pass the dry run described: %+v", res)
	}
}

func TestCatalogRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.plain (consumer text, message_id text, remember_until timestamptz);
CREATE TABLE public.by_list (consumer text, message_id text, remember_until timestamptz) PARTITION BY LIST (consumer);
CREATE TABLE public.other_col (consumer text, message_id text, remember_until timestamptz, t2 timestamptz) PARTITION BY RANGE (t2);
CREATE TABLE public.with_default (consumer text, message_id text, remember_until timestamptz) PARTITION BY RANGE (remember_until);
CREATE INDEX ON public.with_default (consumer, message_id);
CREATE TABLE public.with_default_d PARTITION OF public.with_default DEFAULT;
CREATE TABLE public.no_key_index (consumer text, message_id text, remember_until timestamptz) PARTITION BY RANGE (remember_until);
CREATE TABLE public."aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" (consumer text, message_id text, remember_until timestamptz) PARTITION BY RANGE (remember_until);
CREATE TABLE public.unmanaged (consumer text, message_id text, remember_until timestamptz) PARTITION BY RANGE (remember_until);`)
	for _, c := range []struct {
		table, partitions, want string
	}{
		{"public.plain", "{by: month, max_expiry: 1d}", "the table is not partitioned"},
		{"public.by_list", "{by: month, max_expiry: 1d}", "not by range"},
		{"public.other_col", "{by: month, max_expiry: 1d}", `partitioned on column "t2"`},
		{"public.with_default", "{by: month, max_expiry: 1d}", "DEFAULT partition (public.with_default_d)"},
		{"public.no_key_index", "{by: month, max_expiry: 1d}", `CREATE INDEX ON "public"."no_key_index" ("consumer", "message_id")`},
		{`public."aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"`, "{by: month, max_expiry: 1d}", "too long"},
		{"public.unmanaged", "", "add a partitions section"},
	} {
		pol := "tables:\n  - table: " + c.table + "\n    key: [consumer, message_id]\n    expires_at: remember_until\n"
		if c.partitions != "" {
			pol += "    partitions: " + c.partitions + "\n"
		}
		p, err := policy.Parse([]byte(pol), "test.yaml")
		if err != nil {
			t.Fatalf("%s: %v", c.table, err)
		}
		_, err = catalog.Resolve(ctx, pool, p.Tables[0])
		if !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.table, err, c.want)
		}
	}
}

// A timestamp-without-time-zone expiry column gets UTC bounds.
func TestTimestampWithoutTimeZone(t *testing.T) {
	t.Parallel()
	f := setup(t, `
CREATE TABLE public.consumer_inbox (consumer text, message_id text, event_time timestamp, remember_until timestamp NOT NULL) PARTITION BY RANGE (remember_until);
CREATE INDEX ON public.consumer_inbox (consumer, message_id);`, policyText("0"))
	f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	var bound string
	if err := f.pool.QueryRow(context.Background(), `SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'consumer_inbox_p202607'`).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	if bound != "FOR VALUES FROM ('2026-07-01 00:00:00') TO ('2026-08-01 00:00:00')" {
		t.Fatalf("bound %s", bound)
	}
}

// The daemon's role is a member of the role that owns the parent, as the
// README asks: it can create, detach and drop, and the partitions it makes
// belong to the parent's owner.
func TestAsMemberOfTheOwningRole(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	ctx := context.Background()
	db := pgtest.CurrentDatabase(t, f.pool)
	owner, daemon := "own_"+db, "ik_"+db
	pgtest.Exec(t, f.pool, fmt.Sprintf(`
CREATE ROLE %[1]s NOLOGIN;
CREATE ROLE %[2]s LOGIN IN ROLE %[1]s;
ALTER TABLE public.consumer_inbox OWNER TO %[1]s;
ALTER TABLE public.consumer_inbox_p202605 OWNER TO %[1]s;
GRANT USAGE, CREATE ON SCHEMA public TO %[1]s;
GRANT USAGE ON SCHEMA inboxkeeper TO %[2]s;
GRANT SELECT ON inboxkeeper.holds, inboxkeeper.replays TO %[2]s;
GRANT SELECT, INSERT, UPDATE, DELETE ON inboxkeeper.partitions TO %[2]s;
GRANT INSERT ON inboxkeeper.fence TO %[2]s;`, owner, daemon))
	t.Cleanup(func() {
		pgtest.Exec(t, f.pool, fmt.Sprintf("DROP TABLE public.consumer_inbox; DROP OWNED BY %[1]s, %[2]s; DROP ROLE %[2]s; DROP ROLE %[1]s", owner, daemon))
	})
	pool := f.poolAs(t, daemon)
	f.insertRows(t, "a", 3, may10)
	res, err := New(pool, []*catalog.Table{f.table}, Options{Base: service.Base{Clock: service.At(t0)}}).RunPass(ctx)
	if err != nil || res[0].Err != nil {
		t.Fatalf("as %s: %v %+v", daemon, err, res)
	}
	if len(res[0].Created) != 6 || len(res[0].Dropped) != 1 {
		t.Fatalf("as %s: %+v", daemon, res[0])
	}
	var owners []string
	rows, err := f.pool.Query(ctx, `SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'public.consumer_inbox'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	if owners, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || !slices.Equal(owners, []string{owner}) {
		t.Fatalf("partition owners %v (%v), want %s", owners, err, owner)
	}
}

// A policy that keeps a permanent business key: the keys of a retired
// month are copied out in the transaction that drops it, and stay.
// keysDDL and keysPolicy are a partitioned inbox with tiers and permanent
// keys, and a month of it in May 2026.
const (
	keysDDL = `
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    business_key   text,
    payload_hash   bytea,
    payload        jsonb,
    event_time     timestamptz,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL
) PARTITION BY RANGE (remember_until);
CREATE INDEX ON public.consumer_inbox (consumer, message_id);
CREATE INDEX ON public.consumer_inbox (first_seen_at);
CREATE TABLE public.consumer_inbox_p202605 PARTITION OF public.consumer_inbox FOR VALUES FROM ('2026-05-01 00:00:00+00') TO ('2026-06-01 00:00:00+00');`
	keysPolicy = `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    first_seen: first_seen_at
    expires_at: remember_until
    partitions: {by: month, max_expiry: 30d, detached_retention: 1d}
    tiers:
      hot_for: 72h
      anchor: first_seen_at
      payload_columns: [payload]
      permanent_key: {columns: [consumer, business_key], hash: payload_hash}
`
)

func TestPermanentKeysSurviveRetirement(t *testing.T) {
	t.Parallel()
	f := setup(t, keysDDL, keysPolicy)
	ctx := context.Background()
	if _, err := tiering.EnsureKeyTable(ctx, f.pool, f.table); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, business_key, payload_hash, first_seen_at, remember_until)
SELECT 'payments', 'm-' || i, 'payout-' || i, '\x01', '2026-04-01', '2026-05-10' FROM generate_series(1, 5) i`)
	keys := func() int64 { return f.count(t, tiering.KeyOf(f.table).Ident, "true") }
	pgtest.Exec(t, f.pool, `UPDATE public.consumer_inbox SET payload = '{"secret": 1}'`)

	// Demotion in place on a partitioned inbox: matched on (tableoid, ctid).
	dres, err := tiering.New(f.pool, []*catalog.Table{f.table}, tiering.Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))}}}).RunPass(ctx)
	if err != nil || dres[0].Err != nil || dres[0].Demoted != 5 {
		t.Fatalf("demotion of the partitioned inbox: %+v %v", dres, err)
	}
	if n := f.count(t, "public.consumer_inbox", "payload IS NOT NULL"); n != 0 {
		t.Fatalf("%d payloads left after demotion", n)
	}

	opts := Options{Base: service.Base{Clock: service.At(t0)}}
	if res := f.pass(t, opts); len(res.Detached) != 1 || len(res.Dropped) != 0 {
		t.Fatalf("first pass: %+v", res)
	}
	if n := keys(); n != 0 {
		t.Fatalf("%d keys copied before the drop", n)
	}
	opts.Clock = service.At(t0.Add(24 * time.Hour))
	if res := f.pass(t, opts); len(res.Dropped) != 1 {
		t.Fatalf("second pass: %+v", res)
	}
	if n := keys(); n != 5 {
		t.Fatalf("%d permanent keys after the drop, want 5", n)
	}
	var hash []byte
	var firstSeen time.Time
	if err := f.pool.QueryRow(ctx, "SELECT payload_hash, first_seen FROM "+tiering.KeyOf(f.table).Ident+" WHERE business_key = 'payout-3'").Scan(&hash, &firstSeen); err != nil || len(hash) != 1 || hash[0] != 1 {
		t.Fatalf("key payout-3: %x %v %v", hash, firstSeen, err)
	}
	var kept int64
	if err := f.pool.QueryRow(ctx, "SELECT keys_copied FROM inboxkeeper.partitions WHERE partition_name = 'consumer_inbox_p202605'").Scan(&kept); err != nil || kept != 5 {
		t.Fatalf("record says %d keys copied (%v)", kept, err)
	}
}

// Quoted, mixed-case and SQL-looking names: the parent, its schema, the
// expiry column and the partitions made from them are data, never SQL.
func TestHostileNames(t *testing.T) {
	t.Parallel()
	f := setup(t, `
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema"."In""box; drop table x" ("Consumer" text NOT NULL, "Message Id" text NOT NULL, "Remember Until" timestamptz NOT NULL)
    PARTITION BY RANGE ("Remember Until");
CREATE INDEX ON "Odd Schema"."In""box; drop table x" ("Consumer", "Message Id");
CREATE TABLE "Odd Schema"."old ""May""" PARTITION OF "Odd Schema"."In""box; drop table x" FOR VALUES FROM ('2026-05-01 00:00:00+00') TO ('2026-06-01 00:00:00+00');
INSERT INTO "Odd Schema"."In""box; drop table x" VALUES ('it''s; drop table x', 'm', '2026-05-03');
CREATE TABLE public.x (id int);`, `tables:
  - table: '"Odd Schema"."In""box; drop table x"'
    key: [Consumer, Message Id]
    scope: Consumer
    expires_at: Remember Until
    partitions: {by: month, max_expiry: 10d, premake: 1, detached_retention: 0}
`)
	id := f.legalHold(t, "it's; drop table x")
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if len(res.Created) != 2 || len(res.Blocked) != 1 || res.Blocked[0].Reason != "hold" {
		t.Fatalf("with a hold: %+v", res)
	}
	if !f.exists(t, `"Odd Schema"."In""box; drop table x_p202606"`) || !f.exists(t, "public.x") {
		t.Fatal("the June partition is missing, or public.x was dropped")
	}
	if err := holds.ReleaseHold(context.Background(), f.pool, id); err != nil {
		t.Fatal(err)
	}
	res = f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}})
	if !slices.Equal(res.Dropped, []string{`"Odd Schema"."old ""May"""`}) || !f.exists(t, "public.x") {
		t.Fatalf("after release: %+v", res)
	}
}

// windowGate is a throttle whose WAL window has no room for a writer until
// room is closed: its signals are clear (Admit lets anything through), its
// standby is behind.
type windowGate struct {
	room   chan struct{}
	asked  chan struct{} // closed at the first PaceWriter
	once   sync.Once
	window float64 // 0: 1 MiB
	calls  atomic.Int32
}

func (g *windowGate) Admit(context.Context, service.Sizer) (int, error) { return 0, nil }
func (g *windowGate) Watch(uint32, time.Time) (func(), func() bool) {
	return func() {}, func() bool { return false }
}
func (g *windowGate) Wrote(float64) {}
func (g *windowGate) PaceWriter(ctx context.Context) (service.WriterPace, error) {
	g.once.Do(func() { close(g.asked) })
	g.calls.Add(1)
	select {
	case <-g.room:
		return service.WriterPace{Rate: 1 << 20, Window: cmp.Or(g.window, 1<<20), Standby: "s", Measured: true}, nil
	case <-ctx.Done():
		return service.WriterPace{}, &service.HeldError{Reason: "WAL window", Err: ctx.Err()}
	}
}
func (g *windowGate) Overrun() string { return "" }

// A partition's detach and drop write WAL too (the catalog pages'
// images, some hundred kB a statement): they wait for room in the
// standbys' WAL window as a batch does, not only for the throttle's
// signals. The months ahead are made first, without waiting.
func TestDDLWaitsForTheWALWindow(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	f.insertRows(t, "a", 3, may10)
	g := &windowGate{room: make(chan struct{}), asked: make(chan struct{})}
	done := make(chan TableResult, 1)
	go func() { done <- f.pass(t, Options{Base: service.Base{Clock: service.At(t0), Throttle: g}}) }()
	select {
	case <-g.asked:
	case res := <-done:
		t.Fatalf("the pass ended without asking the WAL window: %+v", res)
	case <-time.After(30 * time.Second):
		t.Fatal("the DDL never asked the WAL window")
	}
	if !f.exists(t, "public.consumer_inbox_p202605") || f.count(t, "public.consumer_inbox", "remember_until < '2026-06-01'") != 3 {
		t.Fatal("the expired month was detached while the window had no room")
	}
	close(g.room)
	select {
	case res := <-done:
		if len(res.Detached) != 1 {
			t.Fatalf("detached %v once the window had room, want the expired month", res.Detached)
		}
		if len(res.Created) != 6 {
			t.Fatalf("created %v, want the 6 months ahead", res.Created)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the pass did not end once the window had room")
	}
}

// While a standby streams, a month's permanent keys are copied out ahead
// of its drop in slices of its heap, each admitted by the throttle as a
// writer and sized to half the standby's WAL window once the first
// measured what a page's keys write: not in the one statement of the
// drop's transaction, which no window could admit. Every key arrives, and
// the record counts them all.
func TestPermanentKeysCopiedInPacedSlices(t *testing.T) {
	t.Parallel()
	f := setup(t, keysDDL, keysPolicy)
	ctx := context.Background()
	if _, err := tiering.EnsureKeyTable(ctx, f.pool, f.table); err != nil {
		t.Fatal(err)
	}
	const rows = 20000
	pgtest.Exec(t, f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, business_key, payload_hash, first_seen_at, remember_until)
SELECT 'payments', 'm-' || i, 'payout-' || i, '\x01', '2026-04-01', '2026-05-10' FROM generate_series(1, $1::int) i`, rows)
	g := &windowGate{room: make(chan struct{}), asked: make(chan struct{}), window: 64 << 10}
	close(g.room)
	opts := Options{Base: service.Base{Clock: service.At(t0), Throttle: g}}
	if res := f.pass(t, opts); len(res.Detached) != 1 {
		t.Fatalf("first pass: %+v", res)
	}
	before := g.calls.Load()
	opts.Clock = service.At(t0.Add(24 * time.Hour))
	if res := f.pass(t, opts); len(res.Dropped) != 1 {
		t.Fatalf("second pass: %+v", res)
	}
	// The partition's 20,000 rows fill some 200 pages; the first slice is
	// 64 pages, the next ones half of a 64 KiB window's worth.
	if slices := g.calls.Load() - before - 1; slices < 4 {
		t.Errorf("the keys were copied in %d slices, want at least 4 (the drop's own DDL asked once more)", slices)
	}
	if n := f.count(t, tiering.KeyOf(f.table).Ident, "true"); n != rows {
		t.Fatalf("%d permanent keys after the drop, want %d", n, rows)
	}
	var kept int64
	if err := f.pool.QueryRow(ctx, "SELECT keys_copied FROM inboxkeeper.partitions WHERE partition_name = 'consumer_inbox_p202605'").Scan(&kept); err != nil || kept != rows {
		t.Fatalf("record says %d keys copied (%v), want %d", kept, err, rows)
	}
}

// The months ahead are made whatever the throttle says: a missing month
// makes the application's inserts fail, and creating one writes a few kB
// of catalog. Behind a standby that applied nothing, premake waited for
// ever, and with it a `once`, whatever its RUN_TIME. A due partition's
// detach still waits for the throttle, until the pass's context ends.
func TestPremakeDoesNotWaitForTheThrottle(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	f.insertRows(t, "a", 3, may10)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res, err := f.manager(Options{Base: service.Base{Clock: service.At(t0), Throttle: gatetest.Held{Reason: "replica_lag"}}}).RunPass(ctx)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) || len(res) != 1 {
		t.Fatalf("%v, %+v", err, res)
	}
	if len(res[0].Created) != 6 {
		t.Errorf("created %v behind a throttle that admits nothing; want the 6 months ahead", res[0].Created)
	}
	if len(res[0].Detached) != 0 || !f.exists(t, "public.consumer_inbox_p202605") {
		t.Errorf("detached %v behind a throttle that admits nothing", res[0].Detached)
	}
}
