package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// TestCountDueBounded: the bounded count of a pass's look says how many
// due rows lie before the newest expiry it reached (below), so that the
// exact count beside it, counting from that expiry on, counts every due row
// once: ties at the bound are not below it, and on a local-time column the
// wall clocks of the hour a clock skips (which PostgreSQL reads as
// instants out of the column's order) fall on one side or the other.
// Under the bound it counts every due row and reads no more.
func TestCountDueBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, `
CREATE TABLE public.local_inbox (
    consumer       text      NOT NULL,
    message_id     text      NOT NULL,
    remember_until timestamp NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ON public.local_inbox (remember_until);`, `tables:
  - table: public.local_inbox
    key: [consumer, message_id]
    expires_at: remember_until
    time_zone: Europe/Berlin
`)
	// Berlin's clocks went from 02:00 to 03:00 on 2026-03-29: 02:30 there is
	// read as 01:30 UTC, the instant of 03:30, and 02:45 as 01:45 UTC, after
	// 03:30's.
	pgtest.Exec(t, f.pool, `INSERT INTO public.local_inbox VALUES
 ('c', 'a', '2026-03-29 00:30'), ('c', 'b', '2026-03-29 01:00'), ('c', 'c', '2026-03-29 01:00'),
 ('c', 'gap', '2026-03-29 02:30'), ('c', 'gap2', '2026-03-29 02:45'), ('c', 'd', '2026-03-29 03:30'),
 ('c', 'e', '2026-03-29 03:30'), ('c', 'f', '2026-03-29 04:00'), ('c', 'late', '2026-03-29 09:00')`)
	now := time.Date(2026, 3, 29, 5, 0, 0, 0, time.UTC) // 07:00 in Berlin: all but "late" due
	const due = 8
	tbl := f.tables[0]
	for _, c := range []struct {
		limit, rows, below int64
		more               bool
		last               time.Time
	}{
		// The first five end on "gap2", the newest (01:45 UTC): the rows
		// before 03:45 Berlin are below it, "gap2" among them.
		{limit: 4, rows: 4, more: true, below: 7, last: time.Date(2026, 3, 29, 1, 45, 0, 0, time.UTC)},
		{limit: 6, rows: 6, more: true, below: 7, last: time.Date(2026, 3, 29, 1, 45, 0, 0, time.UTC)},
		// The first four end on "gap" (01:30 UTC, 03:30 Berlin): the wall
		// clocks before 03:30 are below it, "gap2" among them though it is
		// read as a later instant.
		{limit: 3, rows: 3, more: true, below: 5, last: time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC)},
		// The first three: "a" and the tie at 01:00 Berlin.
		{limit: 2, rows: 2, more: true, below: 1, last: time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)},
		// Every due row, and no more.
		{limit: due, rows: due},
		{limit: 100, rows: due},
	} {
		rows, more, last, below, err := countDueBounded(context.Background(), f.pool, tbl, now, holds.Coverage{}, batchloop.NegInf, c.limit)
		if err != nil {
			t.Fatal(err)
		}
		if rows != c.rows || more != c.more || below != c.below {
			t.Errorf("limit %d: %d rows (more %v), %d below the last, want %d (more %v), %d below", c.limit, rows, more, below, c.rows, c.more, c.below)
		}
		if c.more && (!last.Valid || !last.Time.Equal(c.last)) {
			t.Errorf("limit %d: last %v, want %v", c.limit, last, c.last)
		}
		// The exact count beside the look: below, and from the last on.
		if c.more {
			rest, _, err := countDueUpTo(context.Background(), f.pool, tbl, now, holds.Coverage{}, last, DueCap)
			if err != nil {
				t.Fatal(err)
			}
			if below+rest != due {
				t.Errorf("limit %d: %d below and %d from the last on, want %d due rows in all", c.limit, below, rest, due)
			}
		}
	}
}

// TestMeasureReadsTheStatistics: the look's live and dead tuples are the
// ones pg_stat_user_tables shows (read by the functions the view reads
// them with, without planning the view), each in its place.
func TestMeasureReadsTheStatistics(t *testing.T) {
	t.Parallel()
	f := setup(t, inboxDDL+`
ALTER TABLE public.consumer_inbox SET (autovacuum_enabled = off);`, inboxPolicy)
	ctx := context.Background()
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One backend inserts and deletes, then flushes its statistics before
	// it answers (PostgreSQL 15), so that every session reads them.
	for _, sql := range []string{
		`INSERT INTO public.consumer_inbox (consumer, message_id, remember_until) SELECT 'c', i::text, now() FROM generate_series(1, 300) i`,
		`DELETE FROM public.consumer_inbox WHERE message_id::int <= 100`,
		`SELECT pg_stat_force_next_flush()`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	conn.Release()
	var live, dead int64
	if err := f.pool.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'public.consumer_inbox'::regclass`).Scan(&live, &dead); err != nil {
		t.Fatal(err)
	}
	if live != 200 || dead != 100 {
		t.Fatalf("pg_stat_user_tables says %d live and %d dead tuples, want 200 and 100: the statistics were not flushed", live, dead)
	}
	d := New(f.pool, f.tables, Options{})
	var res TableResult
	if err := d.readTx(ctx, func(tx pgx.Tx) error {
		return d.measure(ctx, tx, f.tables[0], time.Now(), holds.Coverage{}, &res)
	}); err != nil {
		t.Fatal(err)
	}
	if res.LiveTuples != live || res.DeadTuples != dead {
		t.Errorf("measured %d live and %d dead tuples, want %d and %d (pg_stat_user_tables)", res.LiveTuples, res.DeadTuples, live, dead)
	}
}

// FallingDueRate counts the rows falling due over the next minute as rows
// a second over the part of the minute rows reach into: a writer at 200
// rows/s whose rows expire 30 s after they are written leaves the last
// half of the minute empty (those rows are not written yet), and is still
// 200 rows/s falling due, not 100; where rows reach past the minute (a
// 2 min expiry), the whole minute counts.
func TestFallingDueRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name string
		rows int // the last rows of a writer at 200 a second, the newest written now
		ttl  string
	}{{"a 30 s expiry", 6000, "30 seconds"}, {"a 2 min expiry", 24000, "2 minutes"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool, _ := pgtest.NewMigratedPool(t, pgtest.ShortInboxDDL)
			tbl := pgtest.Resolve(t, pool, pgtest.ShortInboxPolicy)[0]
			pgtest.Exec(t, pool, `INSERT INTO public.consumer_inbox (consumer, message_id, remember_until)
SELECT 'c', 'm' || i, now() + $1::interval - i * interval '5 milliseconds' FROM generate_series(0, $2 - 1) i`, c.ttl, c.rows)
			rate, err := FallingDueRate(ctx, pool, tbl)
			if err != nil {
				t.Fatal(err)
			}
			if rate < 180 || rate > 220 {
				t.Errorf("%.1f rows/s falling due, want 200", rate)
			}
		})
	}
}

// The table done line's rows_per_second is the throughput over the last
// minute: a first pass, after a start or a set (a new Deleter), has no
// minute behind it, and its own burst is left out rather than said as if
// it were that.
func TestRateNotBeforeAMinute(t *testing.T) {
	d := &Deleter{rates: map[string]*deleteRate{}}
	tbl := &catalog.Table{Name: "public.consumer_inbox"}
	d.markRate(tbl)
	if v, ok := d.rate(tbl, 12000); ok {
		t.Errorf("a first pass's rate %.0f rows/s is reported as the minute's throughput", v)
	}
}
