// Command citus benchmarks the inboxkeeper deleter on a Citus distributed
// table against one unbounded DELETE through the coordinator,
// side by side in one run on identical copies: on a shared machine only
// the ratio means anything, absolute times do not.
//
//	go run ./bench/citus                        # 2M rows (1M expired), 32 shards on 2 workers
//	go run ./bench/citus -shards 8 -batch 20000 -reps 3
//	go run ./bench/citus -explain               # also EXPLAIN ANALYZE one batch's statements
//
// It builds cmd/inboxkeeper and starts a durable throwaway Citus cluster (a
// coordinator and -workers workers, so WAL figures are real). For each rep
// and method it creates a fresh database, distributes the inbox table on
// consumer over -shards shards and fills it through the coordinator with
// the same rows every time: 1,000 consumers, a ~300-byte payload, expiry
// rising with insertion order (the append-ordered layout of bench/expiry),
// the first half expired. After VACUUM ANALYZE and a CHECKPOINT on every
// node it runs the method: `inboxkeeper once`, or `DELETE FROM inbox WHERE
// remember_until <= now()` through the coordinator. The order of the two
// is reversed every other rep. It prints each method's wall time, rows/s
// and WAL per worker, in total and on the coordinator, the throughput
// ratio and whether the goal (>= 0.5) is met, per rep and over the reps
// (min and median). It exits non-zero when a method does not delete
// exactly the expired rows; a missed goal is printed (GOAL MISSED), not
// fatal.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// goal is the issue's: daemon rows/s over unbounded DELETE rows/s, at least.
const goal = 0.5

// consumers is how many distinct distribution values the rows spread over:
// enough that every shard holds many of them at any -shards a test uses.
const consumers = 1000

type options struct {
	benchdata.Common
	rows, batch, shards, workers int
	explain                      bool
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("citus", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 2_000_000, "rows in each copy of the table; half of them expired")
	fs.IntVar(&o.batch, "batch", 5000, "the daemon's INBOXKEEPER_BATCH_SIZE (its starting size; it adapts)")
	fs.IntVar(&o.shards, "shards", 32, "citus.shard_count of the distributed table")
	fs.IntVar(&o.workers, "workers", 2, "Citus workers")
	fs.BoolVar(&o.explain, "explain", false, "after the reps, EXPLAIN ANALYZE one batch's window count and DELETE on a fresh copy (rolled back), then time two committed windows")
	o.Define(fs, 1, benchdata.RepsUsage, "leave the cluster and the databases in place and print the coordinator's URL", "")
	return benchdata.Main(fs, args, &o.Common, func() error {
		return benchdata.WantFlags(fs, o.rows < 2 || o.batch < 1 || o.shards < 1 || o.workers < 1,
			"-rows >= 2, -batch >= 1, -shards >= 1, -workers >= 1")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	benchdata.Bench
	o      options
	policy string
	citus  *pgcluster.Citus
	dbs    int // databases created so far, to name the next
}

// result is one measured deletion.
type result struct {
	wall        time.Duration
	workerWAL   []int64 // bytes, per worker
	coordWAL    int64
	batches     int // the daemon only, from its log; 0 when not found
	fill        time.Duration
	heap, index int64 // over all shards
}

func (r result) totalWAL() int64 {
	var n int64
	for _, w := range r.workerWAL {
		n += w
	}
	return n
}

const daemonName, unboundedName = "inboxkeeper once", "unbounded DELETE"

// unboundedSQL is what a DBA would run through the coordinator instead:
// Citus sends it to every shard at once.
const unboundedSQL = "DELETE FROM inbox WHERE remember_until <= now()"

func benchmark(ctx context.Context, o options, w io.Writer) error {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-bench-citus-")
	if err != nil {
		return err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o}
	b.policy = filepath.Join(b.Dir, "policy.yaml")
	if err := benchdata.WritePolicy(b.policy, "inbox"); err != nil {
		return err
	}

	b.Logf("starting a durable Citus cluster: a coordinator and %d workers", o.workers)
	c, err := pgcluster.StartCitus(ctx, o.workers, pgcluster.Options{Durable: true, Settings: benchdata.ClusterSettings("1GB", map[string]string{
		// WAL is measured per node, for the whole node: an autovacuum of
		// the shards the method just emptied would be charged to it, and
		// would come on its own schedule, not the method's.
		"autovacuum": "off",
	})})
	if err != nil {
		return err
	}
	b.citus = c
	if o.Keep {
		defer fmt.Fprintf(w, "cluster kept: coordinator %s\n", c.Coordinator.URL("postgres"))
	} else {
		defer c.Destroy()
	}

	total, expired := int64(o.rows), int64(o.rows/2)
	benchdata.Header(w, "bench/citus", o.Flags)
	fmt.Fprintf(w, "rows: %d total, %d expired, over %d consumers, in each copy; %d shards on %d workers; daemon batch size %d; %d reps\n",
		total, expired, consumers, o.shards, o.workers, o.batch, o.Reps)
	if extra := benchdata.PassedThrough(b.daemonSettings("")...); len(extra) > 0 {
		fmt.Fprintf(w, "daemon settings from the environment: %s\n", strings.Join(extra, " "))
	}

	var ratios []float64
	for rep := range o.Reps {
		order := []string{daemonName, unboundedName}
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		res := map[string]result{}
		for _, m := range order {
			r, err := b.measure(ctx, m, total, expired)
			if err != nil {
				return fmt.Errorf("rep %d, %s: %w", rep+1, m, err)
			}
			res[m] = r
		}
		ratios = append(ratios, b.report(w, rep, order[0], res, expired))
	}

	sorted := slices.Clone(ratios)
	slices.Sort(sorted)
	met := 0
	for _, r := range ratios {
		if r >= goal {
			met++
		}
	}
	median := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		median = (sorted[len(sorted)/2-1] + median) / 2
	}
	fmt.Fprintf(w, "over %d reps: throughput ratio inboxkeeper/unbounded min %.2f, median %.2f (goal >= %.1f); goal met in %d of %d %s\n",
		o.Reps, sorted[0], median, goal, met, o.Reps, benchdata.Verdict(met == o.Reps))

	if o.explain {
		if err := b.explain(ctx, w, total, expired); err != nil {
			return err
		}
	}
	b.Logf("done")
	return nil
}

// report prints one rep and returns its throughput ratio.
func (b *bench) report(w io.Writer, rep int, first string, res map[string]result, expired int64) float64 {
	fmt.Fprintf(w, "\nrep %d of %d (%s first):\n", rep+1, b.o.Reps, first)
	for _, m := range []string{daemonName, unboundedName} {
		r := res[m]
		fmt.Fprintf(w, "  fill for %s: %.1f s (%.0f rows/s), %.0f MB heap + %.0f MB indexes over the shards\n",
			m, r.fill.Seconds(), float64(b.o.rows)/r.fill.Seconds(), benchdata.MB(r.heap), benchdata.MB(r.index))
	}
	head := fmt.Sprintf("  %-18s %8s %9s", "method", "time", "rows/s")
	for i := range b.o.workers {
		head += fmt.Sprintf(" %10s", fmt.Sprintf("WAL w%d", i+1))
	}
	fmt.Fprintf(w, "%s %11s %11s\n", head, "WAL workers", "WAL coord")
	u := res[unboundedName]
	for _, m := range []string{daemonName, unboundedName} {
		r := res[m]
		line := fmt.Sprintf("  %-18s %7.2fs %9.0f", m, r.wall.Seconds(), float64(expired)/r.wall.Seconds())
		for _, x := range r.workerWAL {
			line += fmt.Sprintf(" %7.1f MB", benchdata.MB(x))
		}
		line += fmt.Sprintf(" %8.1f MB %8.2f MB", benchdata.MB(r.totalWAL()), benchdata.MB(r.coordWAL))
		if m == daemonName && r.batches > 0 {
			line += fmt.Sprintf("  %d batches, avg %d rows", r.batches, expired/int64(r.batches))
		}
		fmt.Fprintln(w, line)
	}
	d := res[daemonName]
	ratio := u.wall.Seconds() / d.wall.Seconds() // same rows: rows/s over rows/s
	fmt.Fprintf(w, "  throughput ratio inboxkeeper/unbounded %.2f (goal >= %.1f) %s\n", ratio, goal, benchdata.Verdict(ratio >= goal))
	fmt.Fprintf(w, "  WAL ratio inboxkeeper/unbounded, workers: %.2f\n", float64(d.totalWAL())/float64(u.totalWAL()))
	return ratio
}

// measure fills a fresh database, runs method m on it, checks that exactly
// the expired rows are gone, and drops it.
func (b *bench) measure(ctx context.Context, m string, total, expired int64) (result, error) {
	db, r, err := b.fill(ctx, total, expired)
	if err != nil {
		return r, err
	}
	coordURL := b.citus.Coordinator.URL(db)
	// The same full-page-write situation for both methods: every node
	// starts right after a checkpoint.
	lsns := make([]string, 0, 1+b.o.workers)
	for _, n := range b.citus.Nodes() {
		lsn, err := onNode(ctx, n.URL(db), func(conn *pgx.Conn) (string, error) { return benchdata.Checkpoint(ctx, conn) })
		if err != nil {
			return r, err
		}
		lsns = append(lsns, lsn)
	}
	b.Logf("%s: %s", db, m)
	switch m {
	case daemonName:
		r.wall, r.batches, err = b.daemon(ctx, coordURL)
	case unboundedName:
		r.wall, err = b.statement(ctx, coordURL, unboundedSQL)
	}
	if err != nil {
		return r, err
	}
	for i, n := range b.citus.Nodes() {
		wal, err := onNode(ctx, n.URL(db), func(conn *pgx.Conn) (int64, error) { return benchdata.WALSince(ctx, conn, lsns[i]) })
		if err != nil {
			return r, err
		}
		if i == 0 {
			r.coordWAL = wal
		} else {
			r.workerWAL = append(r.workerWAL, wal)
		}
	}
	if _, err := onNode(ctx, coordURL, func(conn *pgx.Conn) (struct{}, error) {
		return struct{}{}, benchdata.Verify(ctx, conn, "inbox", total, expired)
	}); err != nil {
		return r, err
	}
	if !b.o.Keep {
		err = b.citus.DropDatabase(ctx, db)
	}
	return r, err
}

// The inbox, distributed on consumer (the key's first column, as Citus
// requires of a primary key). The indexes are built after the load, as
// bench/expiry does: faster, and the same for every copy.
const (
	tableDDL = `CREATE TABLE inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload        text        NOT NULL,
    remember_until timestamptz NOT NULL
)`
	distributeSQL = "SET citus.shard_count = %d; SELECT create_distributed_table('inbox', 'consumer')"

	// fillSQL makes rows $1..$2 of $4, the first $3 expired at $5. Expiry
	// rises with k: expired rows between 100 days and a day before $5,
	// live ones between a day and 30 days after it, so the expected count
	// is exact however long the run takes, and expiries do not repeat
	// (steps of seconds at most millions of rows). Citus evaluates the
	// SELECT on the coordinator and copies its rows to the shards.
	fillSQL = `
INSERT INTO inbox (consumer, message_id, payload, remember_until)
SELECT 'consumer-' || (k %% %d), md5(k::text), left(repeat(md5(k::text), 10), 300),
       CASE WHEN k < $3::bigint
         THEN $5::timestamptz - interval '100 days' + k * (interval '99 days' / $3::bigint)
         ELSE $5::timestamptz + interval '1 day' + (k - $3::bigint) * (interval '29 days' / greatest($4::bigint - $3::bigint, 1)) END
FROM generate_series($1::bigint, $2::bigint) AS k`
)

// fill creates a fresh database with the daemon's control schema and the
// distributed inbox of total rows, expired of them expired, vacuumed and
// analyzed. It returns the database's name and the fill's time and sizes.
func (b *bench) fill(ctx context.Context, total, expired int64) (string, result, error) {
	var r result
	b.dbs++
	db := fmt.Sprintf("citus_bench_%d", b.dbs)
	start := time.Now()
	url, err := b.citus.CreateDatabase(ctx, db)
	if err != nil {
		return "", r, err
	}
	// migrate reads no policy, but the configuration must name one.
	if _, _, err := b.inboxkeeper(ctx, url, "migrate"); err != nil {
		return "", r, err
	}
	b.Logf("%s: filling %d rows over %d shards", db, total, b.o.shards)
	_, err = onNode(ctx, url, func(conn *pgx.Conn) (struct{}, error) {
		var now time.Time
		if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return struct{}{}, err
		}
		if _, err := conn.Exec(ctx, tableDDL); err != nil {
			return struct{}{}, err
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(distributeSQL, b.o.shards)); err != nil {
			return struct{}{}, err
		}
		// Statements of bounded size: the coordinator holds each one's
		// rows before it copies them out.
		const chunk = 250_000
		for lo := int64(0); lo < total; lo += chunk {
			if _, err := conn.Exec(ctx, fmt.Sprintf(fillSQL, consumers), lo, min(lo+chunk, total)-1, expired, total, now); err != nil {
				return struct{}{}, fmt.Errorf("fill: %w", err)
			}
		}
		for _, sql := range []string{
			"SET maintenance_work_mem = '256MB'",
			"ALTER TABLE inbox ADD PRIMARY KEY (consumer, message_id)",
			"CREATE INDEX inbox_remember_until_idx ON inbox (remember_until)",
			"VACUUM (ANALYZE) inbox", // hint bits and visibility map, as on a settled table
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return struct{}{}, fmt.Errorf("%s: %w", sql, err)
			}
		}
		var all int64
		err := conn.QueryRow(ctx, `SELECT citus_relation_size('inbox'), citus_total_relation_size('inbox')`).Scan(&r.heap, &all)
		r.index = all - r.heap
		return struct{}{}, err
	})
	r.fill = time.Since(start)
	return db, r, err
}

// statement runs sql through the coordinator on a connection opened before
// the clock starts.
func (b *bench) statement(ctx context.Context, url, sql string) (time.Duration, error) {
	return onNode(ctx, url, func(conn *pgx.Conn) (time.Duration, error) {
		start := time.Now()
		if _, err := conn.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("%s: %w", sql, err)
		}
		return time.Since(start), nil
	})
}

// daemon runs `inboxkeeper once` against the coordinator.
func (b *bench) daemon(ctx context.Context, url string) (time.Duration, int, error) {
	wall, out, err := b.inboxkeeper(ctx, url, "once")
	return wall, benchdata.DoneBatches(out), err
}

// daemonSettings are the daemon settings the benchmark sets itself.
func (b *bench) daemonSettings(url string) []string {
	return benchdata.DaemonSettings(url, b.policy, b.o.batch)
}

// inboxkeeper runs the built binary against url and returns its wall time
// and output. The other INBOXKEEPER_* variables of the environment reach it.
func (b *bench) inboxkeeper(ctx context.Context, url string, args ...string) (time.Duration, string, error) {
	p, err := benchdata.RunBinary(ctx, b.Bin, benchdata.DaemonEnv(true, b.daemonSettings(url)...), args...)
	return p.Wall, p.Output, err
}

// onNode runs fn on a new connection to url.
func onNode[T any](ctx context.Context, url string, fn func(*pgx.Conn) (T, error)) (T, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		var zero T
		return zero, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}

// explain shows where a daemon batch spends its time through the
// coordinator, on a fresh copy. A batch on a distributed table is an
// expiry window holding about -batch rows per shard: counted (each shard
// counts its part from its index), then deleted by one range DELETE that
// every shard runs at once (expiry.windowTx). For the record it also
// times the one-node form's bound query (ORDER BY ... OFFSET batch-1 LIMIT
// 2), which each shard must answer with its first batch+1 rows: the reason
// the window replaced it. The statements are the daemon's without the hold
// and replay predicates, which are constant when nothing is held. The
// EXPLAINs run in a transaction that is rolled back; then two windows are
// committed, timed statement by statement.
func (b *bench) explain(ctx context.Context, w io.Writer, total, expired int64) error {
	db, _, err := b.fill(ctx, total, expired)
	if err != nil {
		return err
	}
	b.Logf("%s: EXPLAIN ANALYZE of one batch", db)
	rows := int64(b.o.batch) * int64(b.o.shards)
	bound := fmt.Sprintf(`SELECT remember_until::text, remember_until FROM inbox t
WHERE remember_until <= now() AND remember_until >= '-infinity'
ORDER BY t.remember_until OFFSET %d LIMIT 2`, b.o.batch-1)
	// The window's end: the expiry of its rows-th row (found the slow way;
	// the daemon finds it by counting).
	end := fmt.Sprintf(`SELECT remember_until FROM inbox WHERE remember_until <= now() AND remember_until >= $1 ORDER BY remember_until OFFSET %d LIMIT 1`, rows-1)
	const count = `SELECT count(*) FROM inbox d WHERE remember_until <= now() AND remember_until >= $1 AND remember_until <= $2`
	const del = `DELETE FROM inbox d WHERE remember_until <= now() AND remember_until >= $1 AND remember_until <= $2`
	fmt.Fprintf(w, "\none daemon batch through the coordinator: a window of %d rows (%d a shard; %d expired rows take about %d such batches)\n",
		rows, b.o.batch, expired, (expired+rows-1)/rows)
	lower := time.Time{}
	_, err = onNode(ctx, b.citus.Coordinator.URL(db), func(conn *pgx.Conn) (struct{}, error) {
		if err := conn.QueryRow(ctx, "SELECT min(remember_until) FROM inbox").Scan(&lower); err != nil {
			return struct{}{}, err
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, bound); err != nil {
			return struct{}{}, fmt.Errorf("bound: %w", err)
		}
		fmt.Fprintf(w, "  the one-node form's bound query for %d rows (not used on Citus): %.1f ms\n", b.o.batch, ms(time.Since(start)))
		var upto time.Time
		if err := conn.QueryRow(ctx, end, lower).Scan(&upto); err != nil {
			return struct{}{}, fmt.Errorf("window end: %w", err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			return struct{}{}, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		for _, q := range []struct{ name, sql string }{{"window count", count}, {"window DELETE", del}} {
			start := time.Now()
			rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS off) "+q.sql, lower, upto)
			if err != nil {
				return struct{}{}, fmt.Errorf("EXPLAIN %s: %w", q.name, err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return struct{}{}, fmt.Errorf("EXPLAIN %s: %w", q.name, err)
			}
			fmt.Fprintf(w, "  EXPLAIN ANALYZE, %s (%.1f ms at the client):\n", q.name, ms(time.Since(start)))
			for _, l := range lines {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
		return struct{}{}, tx.Rollback(ctx)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  committed windows, in turn (count, DELETE, COMMIT; synchronous_commit off on the coordinator, as the daemon):\n")
	for i := 1; i <= 2; i++ {
		_, err = onNode(ctx, b.citus.Coordinator.URL(db), func(conn *pgx.Conn) (struct{}, error) {
			var upto time.Time
			if err := conn.QueryRow(ctx, end, lower).Scan(&upto); err != nil {
				return struct{}{}, fmt.Errorf("window end: %w", err)
			}
			var took [3]time.Duration
			start := time.Now()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return struct{}{}, err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', 'off', true)"); err != nil {
				return struct{}{}, err
			}
			var n int64
			if err := tx.QueryRow(ctx, count, lower, upto).Scan(&n); err != nil {
				return struct{}{}, fmt.Errorf("window count: %w", err)
			}
			took[0] = time.Since(start)
			tag, err := tx.Exec(ctx, del, lower, upto)
			if err != nil {
				return struct{}{}, fmt.Errorf("window DELETE: %w", err)
			}
			took[1] = time.Since(start) - took[0]
			if err := tx.Commit(ctx); err != nil {
				return struct{}{}, err
			}
			took[2] = time.Since(start) - took[0] - took[1]
			fmt.Fprintf(w, "    %d. %7.1f ms %7.1f ms %7.1f ms  (%d rows)\n", i, ms(took[0]), ms(took[1]), ms(took[2]), tag.RowsAffected())
			lower = upto
			return struct{}{}, nil
		})
		if err != nil {
			return err
		}
	}
	if !b.o.Keep {
		err = b.citus.DropDatabase(ctx, db)
	}
	return err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
