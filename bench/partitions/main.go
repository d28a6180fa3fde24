// Command partitions benchmarks retiring an expired month of a partitioned
// inbox: inboxkeeper's partition manager against pg_partman 4.x's
// run_maintenance, side by side in one run on one throwaway cluster (on a
// shared machine only the comparison means anything), and then what it costs
// to forget a month by partition against forgetting it row by row.
//
//	go run ./bench/partitions                          # 1M rows in the expired month, a 10 s reader
//	go run ./bench/partitions -rows 200000 -reader 5s -lock-timeout 50ms
//
// It starts a durable throwaway PostgreSQL (so WAL figures are real) with
// the time zone UTC, and makes two identical tables, range-partitioned by
// month on remember_until as the README recommends: inbox_ik, managed by
// inboxkeeper (policy with a partitions section, detached_retention 0), and
// inbox_pm, managed by pg_partman (create_parent native monthly, retention
// '0 days' so that a month is due once its upper bound has passed, as for
// inboxkeeper; retention_keep_table false). Each gets -rows rows in the
// month two months before the database's now(), an empty month after it,
// and the current and future months. pg_partman 4.x always adds a DEFAULT
// partition; inboxkeeper refuses one (it forbids DETACH CONCURRENTLY).
//
// Then, for each table in turn:
//
//   - a writer inserts single rows into the current month on one connection,
//     continuously, timing each INSERT (synchronous_commit off in its
//     session, so that what is timed is waiting, not the disk flush);
//   - a reader opens a transaction, runs SELECT count(*) on the parent and
//     keeps the transaction open for -reader (and until the retirement has
//     been seen waiting for its locks for half of -reader, when it reached
//     them late): it holds ACCESS SHARE on the parent and every partition,
//     as a long report or a pg_dump would;
//   - retirement starts as soon as the reader holds its locks. inboxkeeper:
//     partitions.Manager.RunPass with lock_timeout -lock-timeout, pass after
//     pass until the expired months are gone (or a deadline). pg_partman:
//     partman.run_maintenance(p_parent_table, p_analyze => false), once.
//
// For each it reports the inserts done from the reader's start until the
// months were retired (or the reader ended, whichever is later), the longest
// insert and the p99, and when the months went relative to the reader's end.
//
// Last, the cost to forget the month: a third copy of the N rows in a
// partitioned table retired by inboxkeeper (detach, then drop), and a fourth
// copy in an ordinary table with an index on remember_until, deleted by
// inboxkeeper's expiry deleter with the daemon's default batch sizing. Each
// runs right after a CHECKPOINT; the report gives wall time and WAL bytes
// (pg_current_wal_insert_lsn before and after) and their ratios.
//
// Goals (printed with the figures): inboxkeeper's inserts never wait longer
// than the lock timeout; forgetting by partition is at least 100x cheaper in
// WAL. A missed goal is printed (GOAL MISSED), not fatal; the command exits
// non-zero when a step fails or a result is wrong (rows left behind).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/partitions"
)

// goalWALRatio: WAL of row deletes over WAL of retiring the partition, at
// least.
const goalWALRatio = 100

// The tables.
const (
	ikTable     = "inbox_ik"    // inboxkeeper, under a reader
	pmTable     = "inbox_pm"    // pg_partman, under a reader
	forgetPart  = "forget_part" // inboxkeeper retires the month: the cost
	forgetRows  = "forget_rows" // the expiry deleter deletes the same rows
	passPause   = 250 * time.Millisecond
	warmInserts = 200 // the writer's inserts before the reader starts
)

type options struct {
	rows        int
	reader      time.Duration
	lockTimeout time.Duration
	benchdata.Common
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	o, ok := parseArgs(args)
	if !ok {
		return 2
	}
	return benchdata.Run("bench/partitions", func(ctx context.Context) error {
		_, err := benchmark(ctx, o, stdout)
		return err
	})
}

func parseArgs(args []string) (options, bool) {
	fs := flag.NewFlagSet("partitions", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 1_000_000, "rows in the expired month of each table")
	fs.DurationVar(&o.reader, "reader", 10*time.Second, "how long the long-running read transaction is held")
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 100*time.Millisecond, "inboxkeeper's lock_timeout for partition DDL (INBOXKEEPER_DDL_LOCK_TIMEOUT)")
	o.Define(fs, 0, "", benchdata.KeepUsage, "")
	ok := benchdata.ParseFlags(fs, args, &o.Common, func() error {
		return benchdata.WantFlags(fs, o.rows < 1 || o.reader < 100*time.Millisecond || o.lockTimeout < time.Millisecond,
			"-rows >= 1, -reader >= 100ms, -lock-timeout >= 1ms")
	})
	return o, ok
}

// latency summarises the inserts of a period.
type latency struct {
	inserts       int
	max, p99, p50 time.Duration
	over          int // inserts slower than the lock timeout
}

// underReader is one tool's run under the long reader.
type underReader struct {
	tool string
	how  string
	held time.Duration // how long the reader held its locks
	// queued is how long the retirement was seen waiting for the reader's
	// locks before the reader ended: what an insert queued behind it can
	// wait at most.
	queued   time.Duration
	baseline latency // the writer alone, before the reader
	during   latency // from the reader's start until retired (or the reader's end, if later)
	retired  bool
	// after is when the months were gone, measured from the reader's end
	// (negative: before it ended).
	after time.Duration
	notes string
}

// forgetting is the cost to forget the month.
type forgetting struct {
	partTime, rowsTime time.Duration
	partWAL, rowsWAL   int64
	deleted            int64
	batches            int
}

// report is what the benchmark measured; the tiny test checks it.
type report struct {
	o        options
	month    time.Time // the expired month
	partman  string    // pg_partman's version
	ik, pm   underReader
	forget   forgetting
	walRatio float64
}

type bench struct {
	benchdata.Progress
	o       options
	url     string
	dataDir string // the cluster's, for the report (benchdata.SharedMemory)
	pool    *pgxpool.Pool
	month   time.Time // first instant of the expired month
	now     time.Time
}

func benchmark(ctx context.Context, o options, w io.Writer) (*report, error) {
	b := &bench{Progress: benchdata.NewProgress(), o: o}
	c, _, end, err := benchdata.StartCluster(ctx, b.Progress, benchdata.ClusterSettings("1GB", map[string]string{
		// Months in UTC, as inboxkeeper counts them: pg_partman truncates
		// to months in the session's time zone.
		"timezone": "'UTC'",
		// WAL is measured for the whole cluster: no vacuum may run on one
		// table while another is measured.
		"autovacuum": "off",
	}), o.Keep, w)
	if err != nil {
		return nil, err
	}
	defer end()
	b.url, b.dataDir = c.URL("postgres"), c.DataDir
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	if b.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	defer b.pool.Close()
	if err := b.migrate(ctx); err != nil {
		return nil, err
	}
	r := &report{o: o}
	if r.partman, err = b.installPartman(ctx); err != nil {
		return nil, err
	}
	if err := b.pool.QueryRow(ctx, "SELECT now()").Scan(&b.now); err != nil {
		return nil, err
	}
	b.now = b.now.UTC()
	b.month = monthStart(b.now).AddDate(0, -2, 0)
	r.month = b.month

	// The four tables, two fills at a time.
	b.Logf("filling %s and %s with %d rows each in %s", ikTable, pmTable, o.rows, b.month.Format("2006-01"))
	if err := benchdata.Parallel(
		func() error { return b.makeIK(ctx, ikTable, true) },
		func() error { return b.makePM(ctx) },
	); err != nil {
		return nil, err
	}
	b.Logf("filling %s and %s", forgetPart, forgetRows)
	if err := benchdata.Parallel(
		func() error { return b.makeIK(ctx, forgetPart, false) },
		func() error { return b.makeOrdinary(ctx, forgetRows) },
	); err != nil {
		return nil, err
	}
	ik, err := b.resolve(ctx, ikTable, true)
	if err != nil {
		return nil, err
	}
	fp, err := b.resolve(ctx, forgetPart, true)
	if err != nil {
		return nil, err
	}
	fr, err := b.resolve(ctx, forgetRows, false)
	if err != nil {
		return nil, err
	}
	// Premake the current and future months now, so that the measured
	// passes only retire.
	for _, t := range []*catalog.Table{ik, fp} {
		res, err := partitions.New(b.pool, []*catalog.Table{t}, partitions.Options{}).Ensure(ctx)
		if err != nil {
			return nil, err
		}
		if res[0].Err != nil {
			return nil, fmt.Errorf("premake %s: %w", t.Name, res[0].Err)
		}
	}
	if err := b.header(ctx, w, r); err != nil {
		return nil, err
	}

	// Under a long reader.
	if r.ik, err = b.inboxkeeperUnderReader(ctx, ik); err != nil {
		return nil, err
	}
	if r.pm, err = b.partmanUnderReader(ctx); err != nil {
		return nil, err
	}
	b.printUnderReader(w, r)

	// The cost to forget the month.
	if r.forget, err = b.forget(ctx, fp, fr); err != nil {
		return nil, err
	}
	r.walRatio = float64(r.forget.rowsWAL) / float64(max(r.forget.partWAL, 1))
	b.printForget(w, r)
	b.Logf("done")
	return r, nil
}

// migrate creates inboxkeeper's control schema (the partition manager
// records its detaches there).
func (b *bench) migrate(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = migrations.Migrate(ctx, conn)
	return err
}

func (b *bench) installPartman(ctx context.Context) (string, error) {
	var major int
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&major); err != nil {
		return "", err
	}
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman"); err != nil {
		return "", fmt.Errorf("install pg_partman: %w (Debian: apt-get install postgresql-%d-partman; .ci/run installs it)", err, major)
	}
	var v string
	err := b.pool.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'pg_partman'").Scan(&v)
	if err == nil && !strings.HasPrefix(v, "4.") {
		err = fmt.Errorf("pg_partman %s is installed; this benchmark drives the 4.x API (create_parent with p_type 'native', run_maintenance as a function)", v)
	}
	return v, err
}

// columns is the column list of the recommended layout, taken from
// inbox.PartitionedDDL: every table of the benchmark has the columns the
// project recommends, whatever it is partitioned by.
var columns = func() string {
	_, rest, ok := strings.Cut(inbox.PartitionedDDL, "CREATE TABLE public.consumer_inbox ")
	list, _, ok2 := strings.Cut(rest, " PARTITION BY")
	if !ok || !ok2 || !strings.HasPrefix(list, "(") || !strings.HasSuffix(list, ")") {
		panic("bench/partitions: inbox.PartitionedDDL has no CREATE TABLE public.consumer_inbox (...) PARTITION BY")
	}
	return list
}()

// fillSQL makes rows $1..$2 of $3, with remember_until spread evenly over
// [$4, $5): the same rows in every table.
const fillSQL = `
INSERT INTO public.%s (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until)
SELECT (ARRAY['billing', 'payments', 'shipping', 'email'])[1 + k %% 4],
       md5(k::text),
       sha256(k::text::bytea),
       'applied',
       r - interval '30 days 5 minutes',
       r - interval '30 days',
       r
FROM generate_series($1::bigint, $2::bigint) AS k,
LATERAL (SELECT $4::timestamptz + ($5::timestamptz - $4::timestamptz) * (k::float8 / $3::bigint)) AS s(r)`

// fill loads the rows, then indexes, vacuums and analyzes table. Indexes
// built after the load (faster); on a partitioned parent they cascade to
// every partition, DEFAULT included.
func (b *bench) fill(ctx context.Context, conn *pgxpool.Conn, table string, ordinary bool) error {
	if _, err := conn.Exec(ctx, "SET maintenance_work_mem = '256MB'"); err != nil {
		return err
	}
	n := int64(b.o.rows)
	const chunk = 500_000
	for lo := int64(0); lo < n; lo += chunk {
		if _, err := conn.Exec(ctx, fmt.Sprintf(fillSQL, table), lo, min(lo+chunk, n)-1, n, b.month, nextMonth(b.month)); err != nil {
			return fmt.Errorf("fill %s: %w", table, err)
		}
	}
	key := "CREATE INDEX %[1]s_key_idx ON public.%[1]s (consumer, message_id)"
	if ordinary {
		key = "ALTER TABLE public.%[1]s ADD PRIMARY KEY (consumer, message_id)"
	}
	for _, sql := range []string{
		key,
		"CREATE INDEX %[1]s_remember_until_idx ON public.%[1]s (remember_until)",
		"VACUUM (ANALYZE) public.%[1]s",
	} {
		if _, err := conn.Exec(ctx, fmt.Sprintf(sql, table)); err != nil {
			return fmt.Errorf("%s: %w", fmt.Sprintf(sql, table), err)
		}
	}
	return nil
}

// create makes table with ddl on a session of its own, runs setup (if
// any) on it, and fills the table there (fill: ordinary says how).
func (b *bench) create(ctx context.Context, table, ddl string, ordinary bool, setup func(*pgxpool.Conn) error) error {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create %s: %w", table, err)
	}
	if setup != nil {
		if err := setup(conn); err != nil {
			return err
		}
	}
	return b.fill(ctx, conn, table, ordinary)
}

// parentDDL makes table a parent partitioned by month on remember_until,
// with the recommended columns and no partitions.
func parentDDL(table string) string {
	return fmt.Sprintf("CREATE TABLE public.%s %s PARTITION BY RANGE (remember_until)", table, columns)
}

// makeIK makes a parent for inboxkeeper with the expired month (and, with
// emptyMonth, the empty month after it, as pg_partman's table has) made by
// hand under inboxkeeper's names; Ensure premakes the rest.
func (b *bench) makeIK(ctx context.Context, table string, emptyMonth bool) error {
	sql := parentDDL(table)
	months := []time.Time{b.month}
	if emptyMonth {
		months = append(months, nextMonth(b.month))
	}
	for _, m := range months {
		sql += fmt.Sprintf(";\nCREATE TABLE public.%s PARTITION OF public.%s FOR VALUES FROM ('%s') TO ('%s')",
			ikPartition(table, m), table, m.Format(time.RFC3339), nextMonth(m).Format(time.RFC3339))
	}
	return b.create(ctx, table, sql, false, nil)
}

// makePM makes the same parent and hands it to pg_partman, starting at the
// expired month, with four months premade (its default) and retention set
// so that a month is due once its upper bound has passed.
func (b *bench) makePM(ctx context.Context) error {
	return b.create(ctx, pmTable, parentDDL(pmTable), false, func(conn *pgxpool.Conn) error {
		if _, err := conn.Exec(ctx, `SELECT partman.create_parent(p_parent_table => $1, p_control => 'remember_until',
  p_type => 'native', p_interval => 'monthly', p_premake => 4, p_start_partition => $2)`,
			"public."+pmTable, b.month.Format("2006-01-02 15:04:05+00")); err != nil {
			return fmt.Errorf("pg_partman create_parent: %w", err)
		}
		tag, err := conn.Exec(ctx, `UPDATE partman.part_config SET retention = '0 days', retention_keep_table = false
WHERE parent_table = $1`, "public."+pmTable)
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("pg_partman: set retention (%d rows): %v", tag.RowsAffected(), err)
		}
		return nil
	})
}

// makeOrdinary makes an ordinary table of the same rows.
func (b *bench) makeOrdinary(ctx context.Context, table string) error {
	return b.create(ctx, table, fmt.Sprintf("CREATE TABLE public.%s %s", table, columns), true, nil)
}

// resolve checks table against the catalog as the daemon does, from a
// policy parsed like the daemon's.
func (b *bench) resolve(ctx context.Context, table string, partitioned bool) (*catalog.Table, error) {
	yaml := fmt.Sprintf("tables:\n  - table: public.%s\n    key: [consumer, message_id]\n    scope: consumer\n    event_time: event_time\n    expires_at: remember_until\n", table)
	if partitioned {
		yaml += "    partitions:\n      by: month\n      premake: 3\n      max_expiry: 30d\n      detached_retention: 0\n"
	}
	p, err := policy.Parse([]byte(yaml), table+".yaml")
	if err != nil {
		return nil, err
	}
	return catalog.Resolve(ctx, b.pool, p.Tables[0])
}

// ikPartition is inboxkeeper's name for month m of table.
func ikPartition(table string, m time.Time) string {
	return catalog.PartitionName(table, m.Format("200601"))
}

// pmPartition is pg_partman 4.x's name for month m of table (datetime
// string YYYY_MM for monthly sets).
func pmPartition(table string, m time.Time) string { return table + "_p" + m.Format("2006_01") }

// due are the names of the months both tools must retire: the full one and
// the empty one after it.
func (b *bench) due(name func(string, time.Time) string, table string) []string {
	return []string{name(table, b.month), name(table, nextMonth(b.month))}
}

func (b *bench) header(ctx context.Context, w io.Writer, r *report) error {
	var size, ikParts, pmParts int64
	var pmDefault bool
	err := b.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass),
  (SELECT count(*) FROM pg_inherits WHERE inhparent = $2::regclass),
  (SELECT count(*) FROM pg_inherits WHERE inhparent = $3::regclass),
  (SELECT partdefid <> 0 FROM pg_partitioned_table WHERE partrelid = $3::regclass)`,
		"public."+ikPartition(ikTable, b.month), "public."+ikTable, "public."+pmTable).Scan(&size, &ikParts, &pmParts, &pmDefault)
	if err != nil {
		return err
	}
	for _, n := range append(b.due(ikPartition, ikTable), b.due(pmPartition, pmTable)...) {
		var ok bool
		if err := b.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "public."+n).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("partition %s should exist before the run (%v)", n, err)
		}
	}
	def := ""
	if pmDefault {
		def = ", one of them DEFAULT (pg_partman 4.x always makes one)"
	}
	benchdata.Header(w, "bench/partitions", b.o.Flags)
	benchdata.SharedMemory(w, b.dataDir)
	fmt.Fprintf(w, "rows: %d in the expired month %s (now is %s), %.1f MB with indexes, in each of 4 tables\n",
		b.o.rows, b.month.Format("2006-01"), b.now.Format("2006-01-02"), benchdata.MB(size))
	fmt.Fprintf(w, "partitions: %s %d (no DEFAULT); %s %d%s; pg_partman %s\n", ikTable, ikParts, pmTable, pmParts, def, r.partman)
	fmt.Fprintf(w, "reader: a transaction that ran SELECT count(*) on the parent, held %s; inboxkeeper lock_timeout %s\n", b.o.reader, b.o.lockTimeout)
	return nil
}

// gone reports whether none of the tables exist any more.
func (b *bench) gone(ctx context.Context, names []string) (bool, error) {
	for _, n := range names {
		var exists bool
		if err := b.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "public."+n).Scan(&exists); err != nil {
			return false, err
		}
		if exists {
			return false, nil
		}
	}
	return true, nil
}

// retirement is what a retire function returns.
type retirement struct {
	at      time.Time // when the months were gone; zero if not
	retired bool
	notes   string
	err     error
}

func (b *bench) inboxkeeperUnderReader(ctx context.Context, t *catalog.Table) (underReader, error) {
	b.Logf("%s: writer, reader, inboxkeeper passes", ikTable)
	reg := prometheus.NewRegistry()
	metrics := partitions.NewMetrics(reg, nil)
	metrics.Errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "errors_total", Help: "DDL errors by kind"}, []string{"table", "kind"})
	m := partitions.New(b.pool, []*catalog.Table{t}, partitions.Options{
		Base:    service.Base{LockTimeout: b.o.lockTimeout, Logger: slog.New(slog.DiscardHandler)},
		Metrics: metrics,
	})
	due := b.due(ikPartition, ikTable)
	retire := func(ctx context.Context) (r retirement) {
		deadline := time.Now().Add(b.o.reader + 60*time.Second)
		passes := 0
		defer func() {
			timeouts := testutil.ToFloat64(metrics.Errors.WithLabelValues(t.Name, "lock_timeout")) +
				testutil.ToFloat64(metrics.Errors.WithLabelValues(t.Name, "lock_wait"))
			r.notes = fmt.Sprintf("%d pass(es), %.0f DDL statements gave up on lock_timeout, %.0f detached, %.0f dropped",
				passes, timeouts, testutil.ToFloat64(metrics.Detached.WithLabelValues(t.Name)), testutil.ToFloat64(metrics.Dropped.WithLabelValues(t.Name)))
		}()
		for {
			res, err := m.RunPass(ctx)
			passes++
			if err == nil && len(res) == 1 {
				err = res[0].Err
			}
			if err != nil {
				r.err = fmt.Errorf("inboxkeeper pass %d: %w", passes, err)
				return r
			}
			done, err := b.gone(ctx, due)
			if err != nil {
				r.err = err
				return r
			}
			if done {
				r.at, r.retired = time.Now(), true
				return r
			}
			if time.Now().After(deadline) {
				return r
			}
			if err := retry.Sleep(ctx, passPause); err != nil {
				r.err = err
				return r
			}
		}
	}
	u, err := b.underReader(ctx, ikTable, retire)
	u.tool = "inboxkeeper"
	u.how = fmt.Sprintf("RunPass in a loop: DETACH ... CONCURRENTLY, DROP; lock_timeout %s, retried with backoff", b.o.lockTimeout)
	return u, err
}

func (b *bench) partmanUnderReader(ctx context.Context) (underReader, error) {
	b.Logf("%s: writer, reader, pg_partman run_maintenance", pmTable)
	due := b.due(pmPartition, pmTable)
	retire := func(ctx context.Context) retirement {
		var r retirement
		// No lock_timeout: pg_partman is run as its documentation says.
		ctx, cancel := context.WithTimeout(ctx, b.o.reader+60*time.Second)
		defer cancel()
		start := time.Now()
		_, err := b.pool.Exec(ctx, "SELECT partman.run_maintenance(p_parent_table => $1, p_analyze => false)", "public."+pmTable)
		end := time.Now()
		if err != nil {
			r.err = fmt.Errorf("pg_partman run_maintenance: %w", err)
			return r
		}
		r.notes = fmt.Sprintf("one call, %.1f s", end.Sub(start).Seconds())
		if r.retired, r.err = b.gone(context.WithoutCancel(ctx), due); r.retired {
			r.at = end
		}
		return r
	}
	u, err := b.underReader(ctx, pmTable, retire)
	u.tool = "pg_partman"
	u.how = "run_maintenance(p_parent_table, p_analyze => false) once: DROP TABLE of each due partition, no lock_timeout"
	return u, err
}

// underReader runs the writer, the reader and retire on table, and measures.
func (b *bench) underReader(ctx context.Context, table string, retire func(context.Context) retirement) (underReader, error) {
	var u underReader
	wr, err := startWriter(ctx, b.url, table)
	if err != nil {
		return u, err
	}
	defer wr.stop()
	select {
	case <-wr.warm:
	case <-wr.done:
		return u, fmt.Errorf("writer on %s: %w", table, wr.err)
	case <-ctx.Done():
		return u, ctx.Err()
	}

	reader, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return u, err
	}
	defer reader.Close(context.WithoutCancel(ctx))
	tx, err := reader.Begin(ctx)
	if err != nil {
		return u, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var n int64
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM public."+table).Scan(&n); err != nil {
		return u, fmt.Errorf("reader: %w", err)
	}
	readerStart := time.Now()

	retired := make(chan retirement, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	blocked := b.blockedBy(rctx, reader.PgConn().PID())
	go func() { retired <- retire(rctx) }()

	// The workload: the reader keeps its transaction open for -reader, and
	// until the retirement has waited for its locks for half of -reader. On
	// a loaded machine pg_partman's maintenance once reached its DROP only
	// after the reader had ended (2.2 s of PL/pgSQL at a load average of
	// 20), and the run measured a writer that had nothing to queue behind;
	// under two busy-loops it reached it just before the end of a 2 s hold,
	// and the writer queued behind it for 12.9 ms.
	if err := retry.Sleep(ctx, b.o.reader); err != nil {
		return u, err
	}
	var blockedAt time.Time
	select {
	case blockedAt = <-blocked:
	case <-time.After(time.Minute):
		return u, fmt.Errorf("%s: the retirement did not wait for the reader's locks within %s of -reader", table, time.Minute)
	case <-ctx.Done():
		return u, ctx.Err()
	}
	if rest := time.Until(blockedAt.Add(b.o.reader / 2)); rest > 0 {
		if err := retry.Sleep(ctx, rest); err != nil {
			return u, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return u, fmt.Errorf("reader: commit: %w", err)
	}
	readerEnd := time.Now()
	u.held, u.queued = readerEnd.Sub(readerStart), readerEnd.Sub(blockedAt)

	var r retirement
	select {
	case r = <-retired:
	case <-ctx.Done():
		return u, ctx.Err()
	}
	if r.err != nil {
		return u, r.err
	}
	end := readerEnd
	if r.retired {
		u.retired, u.after = true, r.at.Sub(readerEnd)
		end = later(end, r.at)
	}
	u.notes = r.notes
	samples, err := wr.stop()
	if err != nil {
		return u, fmt.Errorf("writer on %s: %w", table, err)
	}
	// An insert belongs to the reader's period when it was still running
	// at its start: one issued a moment before the reader's SELECT
	// returned can be the one that queues behind the DDL for the whole
	// hold (the writer has one insert in flight at a time).
	u.baseline = summarise(samples, func(s sample) bool { return !s.start.Add(s.took).After(readerStart) }, b.o.lockTimeout)
	u.during = summarise(samples, func(s sample) bool { return s.start.Add(s.took).After(readerStart) && s.start.Before(end) }, b.o.lockTimeout)
	if u.during.inserts == 0 {
		return u, fmt.Errorf("the writer on %s inserted nothing while the reader held its transaction", table)
	}
	return u, nil
}

// blockedBy returns a channel that receives the time a session was first
// seen waiting for a lock the backend pid holds (polled every 10 ms until
// ctx ends).
func (b *bench) blockedBy(ctx context.Context, pid uint32) <-chan time.Time {
	seen := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			var waiting bool
			err := b.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))", int32(pid)).Scan(&waiting)
			if err == nil && waiting {
				seen <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return seen
}

// writer inserts single rows into the current month of a table on one
// connection until stopped, timing each INSERT.
type writer struct {
	conn    *pgx.Conn
	cancel  context.CancelFunc
	warm    chan struct{} // closed after warmInserts inserts
	done    chan struct{}
	samples []sample
	err     error
	once    sync.Once
}

type sample struct {
	start time.Time
	took  time.Duration
}

func startWriter(ctx context.Context, url, table string) (*writer, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	// Time the waiting, not the WAL flush of every commit.
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &writer{conn: conn, cancel: cancel, warm: make(chan struct{}), done: make(chan struct{})}
	sql := fmt.Sprintf(`INSERT INTO public.%s (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until)
VALUES ('writer', $1::text, sha256(convert_to($1::text, 'UTF8')), 'applied', now(), now(), now() + interval '1 hour')`, table)
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			start := time.Now()
			_, err := conn.Exec(wctx, sql, fmt.Sprintf("writer-%d", i))
			if wctx.Err() != nil {
				return
			}
			if err != nil {
				w.err = err
				return
			}
			w.samples = append(w.samples, sample{start, time.Since(start)})
			if i+1 == warmInserts {
				close(w.warm)
			}
		}
	}()
	return w, nil
}

// stop ends the writer and returns its samples; an insert in flight is
// cancelled and not counted.
func (w *writer) stop() ([]sample, error) {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.conn.Close(context.Background())
	})
	return w.samples, w.err
}

// summarise the inserts for which in is true.
func summarise(samples []sample, in func(sample) bool, lockTimeout time.Duration) latency {
	var ds []time.Duration
	var l latency
	for _, s := range samples {
		if !in(s) {
			continue
		}
		ds = append(ds, s.took)
		if s.took > lockTimeout {
			l.over++
		}
	}
	if len(ds) == 0 {
		return l
	}
	slices.Sort(ds)
	l.inserts = len(ds)
	l.max = ds[len(ds)-1]
	l.p99 = percentile(ds, 0.99)
	l.p50 = percentile(ds, 0.50)
	return l
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func (b *bench) printUnderReader(w io.Writer, r *report) {
	fmt.Fprintln(w)
	fmt.Fprintf(w, "retiring %s and the empty month after it while the reader holds its transaction and the writer inserts\n", b.month.Format("2006-01"))
	fmt.Fprintf(w, "(inserts still running at the reader's start or issued after it, until the months were gone or the reader ended, whichever is later)\n")
	fmt.Fprintf(w, "  %-12s %8s %12s %10s %10s %14s %8s  %s\n", "tool", "inserts", "longest wait", "p99", "p50", "> lock_timeout", "retired", "when")
	for _, u := range []underReader{r.ik, r.pm} {
		when := "not within the deadline"
		if u.retired {
			when = fmt.Sprintf("%+.2f s after the reader ended", u.after.Seconds())
		}
		fmt.Fprintf(w, "  %-12s %8d %12s %10s %10s %14d %8s  %s\n", u.tool, u.during.inserts, ms(u.during.max), ms(u.during.p99), ms(u.during.p50),
			u.during.over, yesNo(u.retired), when)
	}
	for _, u := range []underReader{r.ik, r.pm} {
		fmt.Fprintf(w, "  %s: %s; %s\n", u.tool, u.how, u.notes)
		fmt.Fprintf(w, "  %s: the writer alone before the reader: %d inserts, longest %s, p99 %s; reader held %.1f s, the retirement seen waiting for it the last %.1f s\n",
			u.tool, u.baseline.inserts, ms(u.baseline.max), ms(u.baseline.p99), u.held.Seconds(), u.queued.Seconds())
	}
	fmt.Fprintf(w, "goal: inboxkeeper's inserts never wait longer than the lock timeout: longest %s, lock_timeout %s %s\n",
		ms(r.ik.during.max), b.o.lockTimeout, benchdata.Verdict(r.ik.during.max <= b.o.lockTimeout))
	fmt.Fprintf(w, "longest insert wait, pg_partman / inboxkeeper: %.0fx (pg_partman's longest is %.0f%% of the reader's hold, %.0f%% of the time its DROP was seen waiting)\n",
		float64(r.pm.during.max)/float64(max(r.ik.during.max, time.Microsecond)), 100*r.pm.during.max.Seconds()/r.pm.held.Seconds(),
		100*r.pm.during.max.Seconds()/r.pm.queued.Seconds())
}

// forget measures retiring the month of forgetPart against deleting the same
// rows from forgetRows, each right after a checkpoint.
func (b *bench) forget(ctx context.Context, part, rows *catalog.Table) (f forgetting, err error) {
	b.Logf("%s: inboxkeeper retires the month", forgetPart)
	var res []partitions.TableResult
	f.partTime, f.partWAL, err = benchdata.Measure(ctx, b.pool, func() (err error) {
		res, err = partitions.New(b.pool, []*catalog.Table{part}, partitions.Options{Base: service.Base{LockTimeout: b.o.lockTimeout}}).RunPass(ctx)
		if err == nil {
			err = res[0].Err
		}
		return err
	})
	if err != nil {
		return f, fmt.Errorf("inboxkeeper on %s: %w", forgetPart, err)
	}
	want := "public." + ikPartition(forgetPart, b.month)
	if !slices.Equal(res[0].Detached, []string{want}) || !slices.Equal(res[0].Dropped, []string{want}) {
		return f, fmt.Errorf("inboxkeeper on %s: detached %v and dropped %v, want %s for both (blocked: %+v)", forgetPart, res[0].Detached, res[0].Dropped, want, res[0].Blocked)
	}

	b.Logf("%s: the expiry deleter deletes the same rows", forgetRows)
	d := expiry.New(b.pool, []*catalog.Table{rows}, expiry.Options{Settings: batchloop.Settings{
		BatchSize: 5000, // the daemon's defaults
		Sizing:    &expiry.Sizing{Min: 100, Max: 50000, Target: 200 * time.Millisecond},
	}})
	var dres []expiry.TableResult
	f.rowsTime, f.rowsWAL, err = benchdata.Measure(ctx, b.pool, func() (err error) {
		dres, err = d.RunPass(ctx)
		if err == nil {
			err = dres[0].Err
		}
		return err
	})
	if err != nil {
		return f, fmt.Errorf("expiry deleter on %s: %w", forgetRows, err)
	}
	f.deleted, f.batches = dres[0].Deleted, dres[0].Batches
	var left int64
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM public."+forgetRows).Scan(&left); err != nil {
		return f, err
	}
	if f.deleted != int64(b.o.rows) || left != 0 {
		return f, fmt.Errorf("expiry deleter on %s deleted %d rows and left %d, want %d and 0", forgetRows, f.deleted, left, b.o.rows)
	}
	return f, nil
}

func (b *bench) printForget(w io.Writer, r *report) {
	f := r.forget
	fmt.Fprintln(w)
	fmt.Fprintf(w, "forgetting the month's %d rows (each right after a CHECKPOINT)\n", b.o.rows)
	fmt.Fprintf(w, "  %-60s %9s %12s\n", "method", "time", "WAL")
	fmt.Fprintf(w, "  %-60s %8.3fs %12s\n", "by partition: inboxkeeper pass (DETACH CONCURRENTLY, DROP)", f.partTime.Seconds(), fmtBytes(f.partWAL))
	fmt.Fprintf(w, "  %-60s %8.3fs %12s\n", fmt.Sprintf("by rows: inboxkeeper expiry deleter (%d batches)", f.batches), f.rowsTime.Seconds(), fmtBytes(f.rowsWAL))
	fmt.Fprintf(w, "by rows / by partition: time %.0fx, WAL %.0fx\n", f.rowsTime.Seconds()/f.partTime.Seconds(), r.walRatio)
	fmt.Fprintf(w, "goal: forgetting by partition at least %dx cheaper in WAL: %.0fx %s\n", goalWALRatio, r.walRatio, benchdata.Verdict(r.walRatio >= goalWALRatio))
}

func monthStart(x time.Time) time.Time {
	x = x.UTC()
	return time.Date(x.Year(), x.Month(), 1, 0, 0, 0, 0, time.UTC)
}

func nextMonth(x time.Time) time.Time { return x.AddDate(0, 1, 0) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func ms(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", benchdata.MB(n))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
