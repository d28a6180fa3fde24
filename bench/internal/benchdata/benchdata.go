// Package benchdata is what the benchmarks share: their command line, the
// cluster they start, the inbox they fill, the binary they run, and how
// they judge a goal.
package benchdata

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is satisfied by *pgxpool.Conn, *pgx.Conn and *pgxpool.Pool.
type DB interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// inboxDDL is a typical inbox table. Autovacuum is off on the benchmark
// tables because WAL is measured for the whole cluster: a vacuum of one
// table during a measurement of another would be charged to it.
const inboxDDL = `
DROP TABLE IF EXISTS %[1]s;
CREATE TABLE %[1]s (
    consumer       text        NOT NULL,
    message_id     uuid        NOT NULL,
    payload_hash   bytea       NOT NULL,
    outcome        text        NOT NULL,
    event_time     timestamptz NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL%[2]s
) WITH (autovacuum_enabled = off)`

// insertSQL makes rows $1..$2 of a table of $4 rows whose first $3 are
// expired at $5. Rows come in first_seen_at order; %[3]s is how long row k
// is remembered, between 30 and 60 days (horizonSQL), so with more than one
// horizon expiry order is not insertion order.
// Expired rows were first seen 161 to 61 days before $5 and so expired at
// least a day ago; live rows were first seen in the last 29 days and expire
// a day from now at the earliest: the expected count is exact, however long
// the run takes.
const insertSQL = `
INSERT INTO %[1]s
SELECT (ARRAY['billing', 'payments', 'shipping', 'email'])[1 + k %% 4],
       md5(k::text)::uuid,
       sha256(k::text::bytea),
       'applied',
       f - interval '5 minutes',
       f,
       f + %[3]s%[2]s
FROM generate_series($1::bigint, $2::bigint) AS k,
LATERAL (SELECT CASE WHEN k < $3::bigint
  THEN $5::timestamptz - interval '161 days' + k * (interval '100 days' / $3::bigint)
  ELSE $5::timestamptz - interval '29 days' + (k - $3::bigint) * (interval '29 days' / greatest($4::bigint - $3::bigint, 1)) END) AS s(f)`

// horizonSQL is how long row k is remembered. Horizons 0 is the classic
// inbox: consumer k%4 remembers a message 30, 45, 50 or 60 days. Horizons 1
// is append-ordered (30 days for all: expiry rises with insertion order);
// h > 1 interleaves h horizons evenly spread from 30 to 60 days.
func horizonSQL(horizons int) string {
	switch horizons {
	case 0:
		return "(ARRAY[30, 45, 50, 60])[1 + k % 4] * interval '1 day'"
	case 1:
		return "interval '30 days'"
	}
	return fmt.Sprintf("(interval '30 days' + (k %% %d) * (interval '30 days' / %d))", horizons, horizons-1)
}

// Fill (re)creates table with n rows, the first `expired` of them expired at
// t0, with a ~300-byte payload column when payload is set; then indexes,
// vacuums and analyzes it. The indexes are built after the load because
// that is much faster; every table gets the same treatment.
func Fill(ctx context.Context, db DB, table string, payload bool, n, expired int64, t0 time.Time) error {
	return FillHorizons(ctx, db, table, payload, n, expired, t0, 0)
}

// FillHorizons is Fill with rows remembered for one of horizons durations
// (see horizonSQL).
func FillHorizons(ctx context.Context, db DB, table string, payload bool, n, expired int64, t0 time.Time, horizons int) error {
	return fillRows(ctx, db, table, payload, n, func(val string, lo, hi int64) error {
		_, err := db.Exec(ctx, fmt.Sprintf(insertSQL, table, val, horizonSQL(horizons)), lo, hi, expired, n, t0)
		return err
	})
}

// fillRows creates table, has insert add rows lo to hi (val is the payload
// column's value expression, or empty) in chunks of bounded size, in
// first_seen_at order, then indexes, vacuums and analyzes it.
func fillRows(ctx context.Context, db DB, table string, payload bool, n int64, insert func(val string, lo, hi int64) error) error {
	col, val := "", ""
	if payload {
		col, val = ",\n    payload        text        NOT NULL", ",\n       left(repeat(md5(k::text), 10), 300)"
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(inboxDDL, table, col)+"; SET maintenance_work_mem = '256MB'"); err != nil {
		return fmt.Errorf("create %s: %w", table, err)
	}
	const chunk = 500_000
	for lo := int64(0); lo < n; lo += chunk {
		if err := insert(val, lo, min(lo+chunk, n)-1); err != nil {
			return fmt.Errorf("fill %s: %w", table, err)
		}
	}
	for _, sql := range []string{
		"ALTER TABLE %[1]s ADD PRIMARY KEY (consumer, message_id)",
		"CREATE INDEX %[1]s_remember_until_idx ON %[1]s (remember_until)",
		"VACUUM (ANALYZE) %[1]s", // hint bits and visibility map, as on a settled table
	} {
		if _, err := db.Exec(ctx, fmt.Sprintf(sql, table)); err != nil {
			return fmt.Errorf("%s: %w", fmt.Sprintf(sql, table), err)
		}
	}
	return nil
}

// scatteredSQL fills the scattered layouts, which spread the due rows
// over the heap, where expiry order is not heap order. Rows
// come in insertion (first_seen_at) order; row k is remembered for horizon
// j = (k * p) % horizons ($3, $4), p a multiplier coprime with horizons near
// 0.618 x horizons, so neighbouring rows get unrelated horizons; %[3]s says
// when it was first seen and how long it is remembered, (f, h), and %[4]s
// which rows the table holds. Each layout keeps no row whose expiry lies
// within a day after $5, so that the rows expired at $5 are exactly the
// ones expired for the whole run.
const scatteredSQL = `
INSERT INTO %[1]s
SELECT (ARRAY['billing', 'payments', 'shipping', 'email'])[1 + k %% 4],
       md5(k::text)::uuid, sha256(k::text::bytea), 'applied',
       f - interval '5 minutes', f, f + h%[2]s
FROM generate_series($1::bigint, $2::bigint) AS k,
LATERAL (SELECT (k * $3::bigint) %% $4::bigint) AS c(j),
LATERAL (SELECT %[3]s) AS s(f, h)%[4]s`

// uniform: every page holds expired and live rows, and expiry order is
// unrelated to heap order. Rows were first seen over 20 days, from 200 to
// 180 days before $5 ($6 rows); half the horizons are short (10 to 179 days:
// expired a day or more before $5, over 180 days), half long (201 to 400
// days: a day or more after $5). With horizons 2 expiry follows insertion
// order among the expired rows: evenly spread, but clustered.
const uniformFH = `$5::timestamptz - interval '200 days' + k * (interval '20 days' / $6::bigint),
  CASE WHEN j < $4 / 2 THEN interval '10 days' + j * (interval '169 days' / greatest($4 / 2 - 1, 1))
  ELSE interval '201 days' + (j - $4 / 2) * (interval '199 days' / greatest($4 - $4 / 2 - 1, 1)) END`

// steady-state: a table of 60 days of rows (first seen from 60 days before
// $5 to $5) with horizons of 30 to 60 days, as a daemon leaves it when its
// last pass ran $7 before $5: the rows that expired before then are gone;
// the due rows are the ones that expired since, and lie scattered over the
// older half of the heap. The heap is compact, as after a VACUUM FULL: the
// space of the rows deleted before holds no newer rows.
const (
	steadyFH = `$5::timestamptz - interval '60 days' + k * (interval '60 days' / $6::bigint),
  interval '30 days' + j * (interval '30 days' / greatest($4 - 1, 1))`
	steadyWhere = `
WHERE f + h > $5::timestamptz - $7::interval
  AND NOT (f + h > $5::timestamptz AND f + h <= $5::timestamptz + interval '1 day')`
)

// Layout is a physical arrangement of an inbox for FillLayout.
type Layout struct {
	// Kind is "horizons" (FillHorizons: the first half of the heap
	// expired), "uniform" or "steady-state" (scattered: scatteredSQL,
	// uniformFH, steadyFH).
	Kind     string
	Horizons int
	// Gap is how long before t0 the last pass ran (steady-state).
	Gap time.Duration
}

// FillLayout (re)creates table with n generated rows in layout l, indexed,
// vacuumed and analyzed like FillHorizons, and returns the rows it holds and
// how many of them are expired at t0 (and for the whole run). For the
// "horizons" kind they are n and expired; the scattered kinds ignore
// expired: their layout decides.
func FillLayout(ctx context.Context, db DB, table string, payload bool, n, expired int64, t0 time.Time, l Layout) (rows, due int64, err error) {
	if l.Kind == "horizons" {
		return n, expired, FillHorizons(ctx, db, table, payload, n, expired, t0, l.Horizons)
	}
	fh, where, args := uniformFH, "", []any{nil, nil, spreadMultiplier(l.Horizons), int64(l.Horizons), t0, n}
	if l.Kind == "steady-state" {
		fh, where, args = steadyFH, steadyWhere, append(args, l.Gap)
	} else if l.Kind != "uniform" {
		return 0, 0, fmt.Errorf("unknown layout kind %q", l.Kind)
	}
	err = fillRows(ctx, db, table, payload, n, func(val string, lo, hi int64) error {
		args[0], args[1] = lo, hi
		_, err := db.Exec(ctx, fmt.Sprintf(scatteredSQL, table, val, fh, where), args...)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	err = db.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(*) FILTER (WHERE remember_until <= $1) FROM %s", table), t0).Scan(&rows, &due)
	return rows, due, err
}

// spreadMultiplier is the multiplier coprime with h nearest above 0.618 x h
// (1 for h < 3): k -> (k * p) % h visits every horizon and puts unrelated
// ones side by side.
func spreadMultiplier(h int) int64 {
	if h < 3 {
		return 1
	}
	gcd := func(a, b int) int {
		for b != 0 {
			a, b = b, a%b
		}
		return a
	}
	p := int(0.618*float64(h)) + 1
	for gcd(p, h) != 1 {
		p++
	}
	return int64(p)
}

// Table is a table for FillAll to fill.
type Table struct {
	Name    string
	Payload bool // with the ~300-byte payload column (Fill)
}

// FillAll fills tables side by side with the same rows (Fill): n of them,
// the first expired of them expired at t0. Each gets a session of its own,
// as Fill sets maintenance_work_mem for the session.
func FillAll(ctx context.Context, pool *pgxpool.Pool, p Progress, tables []Table, n, expired int64, t0 time.Time) error {
	fills := make([]func() error, len(tables))
	for i, t := range tables {
		fills[i] = func() error {
			p.Logf("filling %s with %d rows", t.Name, n)
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			return Fill(ctx, conn, t.Name, t.Payload, n, expired, t0)
		}
	}
	return Parallel(fills...)
}

// Parallel runs fns at once and returns their errors, joined: a benchmark
// fills its tables side by side, as a long fill is most of its run time.
func Parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Verify fails unless exactly the expired rows of table are gone.
func Verify(ctx context.Context, db DB, table string, n, expired int64) error {
	var left, rows int64
	err := db.QueryRow(ctx, "SELECT count(*) FILTER (WHERE remember_until <= now()), count(*) FROM "+table).Scan(&left, &rows)
	if err != nil {
		return err
	}
	if left != 0 || rows != n-expired {
		return fmt.Errorf("%s after the run: %d expired rows left (want 0), %d rows in all (want %d)", table, left, rows, n-expired)
	}
	return nil
}

// BuildBinary builds cmd/inboxkeeper into dir and returns its path.
func BuildBinary(ctx context.Context, dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "inboxkeeper")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/inboxkeeper")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/inboxkeeper: %w\n%s", err, out)
	}
	return bin, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in or above the working directory; run from inside the repository")
		}
		dir = parent
	}
}

// Verdict is how a report states a goal.
func Verdict(ok bool) string {
	if ok {
		return "GOAL MET"
	}
	return "GOAL MISSED"
}

// MB is bytes in MiB.
func MB(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// Checkpoint makes a measurement start with the same full-page-write
// situation as the one it is compared with, and returns the WAL position
// after it: the insert position, not the write position, so that nothing
// inserted but not yet written is missed.
func Checkpoint(ctx context.Context, db DB) (string, error) {
	if _, err := db.Exec(ctx, "CHECKPOINT"); err != nil {
		return "", err
	}
	return InsertLSN(ctx, db)
}

// InsertLSN is the WAL insert position, for WALSince.
func InsertLSN(ctx context.Context, db DB) (string, error) {
	var lsn string
	err := db.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
	return lsn, err
}

// WALSince is the WAL inserted since lsn, by every session.
func WALSince(ctx context.Context, db DB, lsn string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", lsn).Scan(&n)
	return n, err
}

// Run runs a benchmark until it ends or SIGINT/SIGTERM, and returns the
// exit status: 1 with "<name>: FAILED: <error>" on stderr when it failed.
func Run(name string, bench func(ctx context.Context) error) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench(ctx); err != nil {
		fmt.Fprintln(os.Stderr, name+": FAILED:", err)
		return 1
	}
	return 0
}
