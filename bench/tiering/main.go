// Command tiering benchmarks demotion against deletion, side by
// side in one run on tables of the same rows: on a shared machine only
// ratios mean anything, absolute times do not.
//
//	go run ./bench/tiering               # 1M wide rows per table
//	go run ./bench/tiering -rows 200000
//
// It starts a durable throwaway PostgreSQL (so WAL figures are real) and
// fills three tables with the same rows, every one of them due both for
// demotion and for deletion:
//
//   - wide: the inbox with a ~300-byte payload column. The expiry deleter
//     deletes every row: the baseline, "a delete".
//   - side + side_payload: the recommended layout, identity in side and the
//     payload in a side table keyed by the identity. Demotion deletes the
//     side-table rows.
//   - inplace: the wide inbox with a nullable payload and the recommended
//     partial index. Demotion sets the payload to NULL.
//
// Each run starts right after a CHECKPOINT and uses the daemon's own code
// (expiry.Deleter, tiering.Demoter) with a fixed batch size. It prints wall
// time and WAL per row of each, and the ratios demotion / deletion. The
// goal for the side-table layout is a ratio of at most 1.5. It exits
// non-zero when a run does not do exactly what it should; a missed goal is
// printed (GOAL MISSED), not fatal.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// goalSide is the goal: side-table demotion costs at most this many
// times a delete, in time and in WAL per row.
const goalSide = 1.5

type options struct {
	benchdata.Common
	rows, batch int
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("tiering", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 1_000_000, "rows in each table, all due for demotion and deletion")
	fs.IntVar(&o.batch, "batch", 5000, "rows per batch, for the deleter and the demoter alike")
	o.Define(fs, 0, "", benchdata.KeepUsage, "")
	return benchdata.Main(fs, args, &o.Common, func() error {
		return benchdata.WantFlags(fs, o.rows < 1 || o.batch < 1, "-rows >= 1, -batch >= 1")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	benchdata.Progress
	o    options
	pool *pgxpool.Pool
}

type result struct {
	rows int64
	wall time.Duration
	wal  int64
}

func (r result) perRow() (time.Duration, float64) {
	return r.wall / time.Duration(max(r.rows, 1)), float64(r.wal) / float64(max(r.rows, 1))
}

const policyFile = `tables:
  - table: public.wide
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
  - table: public.side
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
    tiers:
      hot_for: 72h
      anchor: first_seen_at
      payload_table: public.side_payload
  - table: public.inplace
    key: [consumer, message_id]
    scope: consumer
    # In place, demotion leaves rows the deleter is about to delete alone;
    # here they are kept ten years longer, so that all of them are demoted.
    expires_after: {column: remember_until, after: 3650d}
    tiers:
      hot_for: 72h
      anchor: first_seen_at
      payload_columns: [payload]
`

func benchmark(ctx context.Context, o options, w io.Writer) error {
	b := &bench{Progress: benchdata.NewProgress(), o: o}
	c, pool, end, err := benchdata.StartCluster(ctx, b.Progress, benchdata.ClusterSettings("1GB", nil), o.Keep, w)
	if err != nil {
		return err
	}
	defer end()
	b.pool = pool
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	_, err = migrations.Migrate(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return err
	}
	n := int64(o.rows)
	if err := b.fill(ctx, n); err != nil {
		return err
	}
	tables, err := b.resolve(ctx)
	if err != nil {
		return err
	}
	var sizes [3]int64
	if err := b.pool.QueryRow(ctx, `SELECT pg_total_relation_size('wide'), pg_total_relation_size('side'), pg_total_relation_size('side_payload')`).Scan(&sizes[0], &sizes[1], &sizes[2]); err != nil {
		return err
	}
	benchdata.Header(w, "bench/tiering", o.Flags)
	benchdata.SharedMemory(w, c.DataDir)
	fmt.Fprintf(w, "rows: %d per table, all due for demotion and deletion; batch size %d; wide %.0f MB, side %.0f MB + side_payload %.0f MB (indexes included)\n",
		n, o.batch, benchdata.MB(sizes[0]), benchdata.MB(sizes[1]), benchdata.MB(sizes[2]))

	del, err := b.measure(ctx, "delete, wide rows (expiry deleter)", w, func() (int64, error) {
		res, err := expiry.New(b.pool, tables[:1], expiry.Options{Settings: batchloop.Settings{BatchSize: o.batch}}).RunPass(ctx)
		if err != nil {
			return 0, err
		}
		return res[0].Deleted, res[0].Err
	})
	if err != nil {
		return err
	}
	demote := func(t *catalog.Table) func() (int64, error) {
		return func() (int64, error) {
			res, err := tiering.New(b.pool, []*catalog.Table{t}, tiering.Options{Settings: batchloop.Settings{BatchSize: o.batch}}).RunPass(ctx)
			if err != nil {
				return 0, err
			}
			return res[0].Demoted, res[0].Err
		}
	}
	side, err := b.measure(ctx, "demote, side table (recommended)", w, demote(tables[1]))
	if err != nil {
		return err
	}
	inplace, err := b.measure(ctx, "demote, in place (UPDATE ... NULL)", w, demote(tables[2]))
	if err != nil {
		return err
	}
	for name, r := range map[string]result{"delete": del, "side-table demotion": side, "in-place demotion": inplace} {
		if r.rows != n {
			return fmt.Errorf("%s handled %d rows, want %d", name, r.rows, n)
		}
	}
	if err := b.verify(ctx); err != nil {
		return err
	}
	ratio := func(name string, r result) (float64, float64) {
		dt, dw := del.perRow()
		rt, rw := r.perRow()
		tr, wr := float64(rt)/float64(dt), rw/dw
		fmt.Fprintf(w, "%s / delete: time %.2f, WAL %.2f\n", name, tr, wr)
		return tr, wr
	}
	st, sw := ratio("side-table demotion", side)
	ratio("in-place demotion", inplace)
	fmt.Fprintf(w, "side-table demotion costs at most %.1fx a delete (time and WAL per row): %s\n", goalSide, benchdata.Verdict(st <= goalSide && sw <= goalSide))
	b.Logf("done")
	return nil
}

// fill makes the three tables from the same deterministic rows, every one
// of them expired and first seen long before the hot window.
func (b *bench) fill(ctx context.Context, n int64) error {
	tables := []benchdata.Table{{Name: "wide", Payload: true}, {Name: "side"}, {Name: "inplace", Payload: true}}
	if err := benchdata.FillAll(ctx, b.pool, b.Progress, tables, n, n, time.Now()); err != nil {
		return err
	}
	b.Logf("making the side table and the in-place index")
	for _, sql := range []string{
		// The side table: the same payload as wide's, keyed by the identity.
		`CREATE TABLE side_payload WITH (autovacuum_enabled = off) AS
SELECT s.consumer, s.message_id, s.first_seen_at, w.payload FROM side s JOIN wide w USING (consumer, message_id)`,
		`ALTER TABLE side_payload ADD PRIMARY KEY (consumer, message_id)`,
		`CREATE INDEX side_payload_first_seen_at_idx ON side_payload (first_seen_at)`,
		`VACUUM (ANALYZE) side_payload`,
		`ALTER TABLE inplace ALTER COLUMN payload DROP NOT NULL`,
		`CREATE INDEX inplace_hot_idx ON inplace (first_seen_at) WHERE payload IS NOT NULL`,
		`VACUUM (ANALYZE) inplace`,
	} {
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

func (b *bench) resolve(ctx context.Context) ([]*catalog.Table, error) {
	p, err := policy.Parse([]byte(policyFile), "bench.yaml")
	if err != nil {
		return nil, err
	}
	var out []*catalog.Table
	for _, pt := range p.Tables {
		t, err := catalog.Resolve(ctx, b.pool, pt)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// measure runs fn right after a CHECKPOINT and reports its time and WAL.
func (b *bench) measure(ctx context.Context, name string, w io.Writer, fn func() (int64, error)) (result, error) {
	b.Logf("%s", name)
	var r result
	var err error
	r.wall, r.wal, err = benchdata.Measure(ctx, b.pool, func() (err error) {
		r.rows, err = fn()
		return err
	})
	if err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	t, wal := r.perRow()
	fmt.Fprintf(w, "  %-38s %7.2f s %9.0f rows/s  WAL %6.0f MB  %6.2f µs/row  %6.0f WAL bytes/row\n", name+":",
		r.wall.Seconds(), float64(r.rows)/r.wall.Seconds(), benchdata.MB(r.wal), float64(t.Nanoseconds())/1000, wal)
	return r, nil
}

func (b *bench) verify(ctx context.Context) error {
	var wide, payloads, hot, side, inplace int64
	err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM wide), (SELECT count(*) FROM side_payload),
       (SELECT count(*) FROM inplace WHERE payload IS NOT NULL), (SELECT count(*) FROM side), (SELECT count(*) FROM inplace)`).Scan(&wide, &payloads, &hot, &side, &inplace)
	if err != nil {
		return err
	}
	if wide != 0 || payloads != 0 || hot != 0 || side != int64(b.o.rows) || inplace != int64(b.o.rows) {
		return fmt.Errorf("after the runs: wide %d rows (want 0), side_payload %d (want 0), inplace %d with payload (want 0), side %d and inplace %d rows (want %d each)",
			wide, payloads, hot, side, inplace, b.o.rows)
	}
	return nil
}
