package compact_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fillSQL fills the recommended inbox with $1 rows, a tenth of them of
// consumer legal and the others of payments, those for which %s holds
// already expired, the others remembered
// for 30 days more; each row's outcome pads it to about 200 bytes.
const fillSQL = `INSERT INTO public.consumer_inbox
SELECT CASE WHEN i %% 10 = 0 THEN 'legal' ELSE 'payments' END, 'm' || i, sha256(i::text::bytea), repeat('o', 100), now() - interval '10 days', now() - interval '10 days',
       CASE WHEN %s THEN now() - interval '1 day' ELSE now() + interval '30 days' END, 'bk' || i
FROM generate_series(1, $1) i`

// Layouts of the purged rows.
const (
	oldest    = "i <= $1 * 0.8"              // the oldest 80%: the start of the heap is empty, its end full
	scattered = "hashtext(i::text) % 5 <> 0" // 80% at random: every page a fifth full
)

// env is a purged inbox, ready to compact.
type env struct {
	pool  *pgxpool.Pool
	url   string
	table *catalog.Table
}

// newEnv fills rows rows, purges those the layout says (and VACUUMs, as
// the deleter's pass would), and resolves the table, in a database of its
// own.
func newEnv(t *testing.T, rows int, layout string) env {
	t.Helper()
	return newEnvAt(t, pgtest.NewDatabase(t), rows, layout)
}

// newEnvAt is newEnv in the database at url.
func newEnvAt(t *testing.T, url string, rows int, layout string) env {
	t.Helper()
	pgtest.Migrate(t, url)
	pgtest.ExecOn(t, url, inbox.PlainDDL+"; ALTER TABLE public.consumer_inbox SET (autovacuum_enabled = off)")
	ctx := context.Background()
	// Connections as the daemon makes them: they hand a VACUUM's warnings
	// on (dbconn.WatchNotices).
	cfg, err := dbconn.Pool(url, 8)
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolWith(t, cfg)
	if _, err := pool.Exec(ctx, fmt.Sprintf(fillSQL, layout), rows); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pool, "DELETE FROM public.consumer_inbox WHERE remember_until < now()")
	pgtest.Exec(t, pool, "VACUUM (ANALYZE) public.consumer_inbox")
	return env{pool: pool, url: url, table: pgtest.Resolve(t, pool, inbox.PlainPolicy)[0]}
}

// audit is the table's rows, whole, as one digest and a count: equal
// before and after, no row was lost, duplicated or changed.
type audit struct {
	rows   int64
	digest string
}

func (e env) audit(t *testing.T) audit {
	t.Helper()
	var a audit
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(md5(string_agg(r::text, E'\n' ORDER BY consumer, message_id)), '')
FROM public.consumer_inbox r`).Scan(&a.rows, &a.digest); err != nil {
		t.Fatal(err)
	}
	return a
}

func (e env) heap(t *testing.T) int64 {
	t.Helper()
	return pgtest.Value[int64](t, e.pool, "SELECT pg_relation_size('public.consumer_inbox')")
}

func (e env) compactor(opts compact.Options) *compact.Compactor {
	opts.Force = true
	if opts.BatchSize == 0 {
		opts.BatchSize = 500
	}
	return compact.New(e.pool, []*catalog.Table{e.table}, opts)
}

func run(t *testing.T, c *compact.Compactor) compact.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := c.RunPass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d results, want 1", len(rs))
	}
	return rs[0]
}

// TestCompactGivesTheDiskBack compacts a purged inbox of either layout:
// the heap ends within 1.3 x its live size, every row is there, unchanged.
func TestCompactGivesTheDiskBack(t *testing.T) {
	t.Parallel()
	for name, layout := range map[string]string{"oldest purged": oldest, "scattered purge": scattered} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 40000, layout)
			before, heap := e.audit(t), e.heap(t)
			res := run(t, e.compactor(compact.Options{}))
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if after := e.audit(t); after != before {
				t.Errorf("audit after %+v, before %+v", after, before)
			}
			live := res.After.LiveBytes()
			t.Logf("heap %d -> %d bytes, live %d: %.2f x live; moved %d, strays %d, updates %d, batches %d, vacuums %d",
				heap, e.heap(t), live, float64(e.heap(t))/float64(live), res.Moved, res.Strays, res.Updates, res.Batches, res.Vacuums)
			if got := e.heap(t); float64(got) > 1.3*float64(live) {
				t.Errorf("heap %d bytes, more than 1.3 x the live %d", got, live)
			}
			if res.Truncated < heap-e.heap(t) {
				t.Errorf("truncated %d, but the heap shrank by %d", res.Truncated, heap-e.heap(t))
			}
		})
	}
}

// TestDryRunChangesNothing: a dry run says what would come back (the heap
// beyond the live rows' packed size) and touches nothing.
func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 20000, oldest)
	before, heap := e.audit(t), e.heap(t)
	var xmins string
	if err := e.pool.QueryRow(context.Background(), "SELECT md5(string_agg(xmin::text || ctid::text, ',' ORDER BY message_id)) FROM public.consumer_inbox").Scan(&xmins); err != nil {
		t.Fatal(err)
	}
	c := e.compactor(compact.Options{Settings: batchloop.Settings{Base: service.Base{DryRun: true}}})
	res := run(t, c)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.Moved != 0 || res.Vacuums != 0 || e.heap(t) != heap || e.audit(t) != before {
		t.Errorf("a dry run changed something: %+v, heap %d -> %d", res, heap, e.heap(t))
	}
	var again string
	if err := e.pool.QueryRow(context.Background(), "SELECT md5(string_agg(xmin::text || ctid::text, ',' ORDER BY message_id)) FROM public.consumer_inbox").Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again != xmins {
		t.Error("a dry run rewrote rows")
	}
	// 4,000 rows of about 210 bytes need about 105 pages of the 527.
	if got, want := res.WouldGiveBack(), heap-res.Before.LiveBytes(); got != want || res.Before.LivePages < 95 || res.Before.LivePages > 115 {
		t.Errorf("would give back %d bytes (want the heap %d less the live %d, %d pages)", got, heap, res.Before.LiveBytes(), res.Before.LivePages)
	}
}

// TestLockedTableIsLeftForTheNextRun: with a lock on the table that
// conflicts with VACUUM (an index being built, DDL), the compaction moves
// its rows but cannot VACUUM, says so, and never waits for the lock; the
// next run gives the space back.
func TestLockedTableIsLeftForTheNextRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 20000, oldest)
	heap := e.heap(t)
	tx := pgtest.Lock(t, e.pool, "LOCK TABLE public.consumer_inbox IN SHARE UPDATE EXCLUSIVE MODE")
	c := e.compactor(compact.Options{})
	res := run(t, c)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.Truncated != 0 || e.heap(t) != heap || !strings.Contains(res.NotTruncated, "another session held a lock on the table") {
		t.Errorf("truncated %d bytes (heap %d -> %d) under a lock; not truncated: %q", res.Truncated, heap, e.heap(t), res.NotTruncated)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	res = run(t, c)
	if res.Err != nil || res.Truncated == 0 || e.heap(t) >= heap/2 {
		t.Errorf("the next run gave back %d bytes (heap %d -> %d): %v, %q", res.Truncated, heap, e.heap(t), res.Err, res.NotTruncated)
	}
}

// TestDaemonWaitsAfterNothingCameBack: the daemon compacts a table whose
// policy asks once its free space is over the ratio; when a compaction
// gives nothing back (here a legal hold keeps rows at the very end of the
// heap), the next pass leaves the table alone for a while rather than
// sweep and VACUUM it again.
func TestDaemonWaitsAfterNothingCameBack(t *testing.T) {
	t.Parallel()
	// 13 MB: over the 8 MiB the daemon wants to give back at least.
	e := newEnv(t, 60000, oldest)
	// Without a compact section the daemon leaves the table alone.
	c := compact.New(e.pool, []*catalog.Table{e.table}, compact.Options{})
	if len(c.Tables()) != 0 {
		t.Fatalf("the daemon compacts %d tables without a compact section", len(c.Tables()))
	}
	e.table = pgtest.Resolve(t, e.pool, inbox.PlainPolicy+"    compact: {free_ratio: 0.5}\n")[0]
	legal := "legal"
	if _, err := holds.AddHold(context.Background(), e.pool, e.table, holds.HoldSpec{Scope: &legal, Reason: "litigation", Owner: "legal"}); err != nil {
		t.Fatal(err)
	}
	c = compact.New(e.pool, []*catalog.Table{e.table}, compact.Options{Settings: batchloop.Settings{BatchSize: 500}})
	ctx := context.Background()
	first, err := c.RunPass(ctx)
	if err != nil || first[0].Err != nil || first[0].NotRun != "" || first[0].Moved == 0 {
		t.Fatalf("first pass: %+v, %v", first, err)
	}
	if first[0].Truncated > 0 {
		t.Fatalf("the first pass gave back %d bytes: the test needs one that gives nothing back", first[0].Truncated)
	}
	second, err := c.RunPass(ctx)
	if err != nil || !strings.Contains(second[0].NotRun, "the last 1 compactions gave nothing back") || second[0].Moved != 0 {
		t.Errorf("second pass: %+v, %v; want it left alone", second[0], err)
	}
}

// TestCompactKeepsItsWALRate: with a WAL rate (INBOXKEEPER_COMPACT_WAL_RATE)
// the moves write about that much WAL a second, in small batches (50 ms of
// it each); without one the same compaction writes several times as fast
// (so the check can fail).
//
// Not parallel: the WAL is the cluster's, and the package's parallel tests
// wait while it runs.
func TestCompactKeepsItsWALRate(t *testing.T) {
	const rate = 2 << 20
	e := newEnv(t, 40000, oldest)
	th := throttle.New(e.pool, config.Config{}, service.Base{}, nil)
	var lsn string
	if err := e.pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := run(t, e.compactor(compact.Options{Settings: batchloop.Settings{Base: service.Base{Throttle: th}}, WALRate: rate}))
	took := time.Since(start)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	var wal float64
	if err := e.pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", lsn).Scan(&wal); err != nil {
		t.Fatal(err)
	}
	t.Logf("%.1f MB of WAL in %s (%.2f MB/s, the rate %.2f MB/s), %d rows moved in %d batches", wal/(1<<20), took.Round(time.Millisecond),
		wal/(1<<20)/took.Seconds(), float64(rate)/(1<<20), res.Moved, res.Batches)
	if wal < rate {
		t.Fatalf("the compaction wrote %.0f bytes of WAL, too little to judge a rate of %d a second", wal, rate)
	}
	// The VACUUMs' WAL is in the total too, and is not held to the rate.
	if got := wal / took.Seconds(); got > 1.3*rate {
		t.Errorf("%.0f bytes of WAL a second, more than 1.3 x the rate %d", got, rate)
	}
	// A batch writes at most 50 ms of the rate: the moves' WAL came in
	// many batches (counted here against a quarter second each, for the
	// VACUUMs' share of the WAL).
	if least := int(wal / (rate / 4) / 2); res.Batches < least {
		t.Errorf("%d batches for %.0f bytes of WAL, want at least %d: batches of more than a quarter second of the rate", res.Batches, wal, least)
	}
}
