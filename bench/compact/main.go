// Command compact benchmarks giving a purged inbox's disk back:
// `inboxkeeper compact` against pg_repack and VACUUM FULL on identical
// tables, each while a writer inserts a few hundred rows a second and an
// apply-capped standby streams the WAL, and against no compaction at all
// (the writer's baseline), side by side in one run (on a shared machine
// only the comparison means anything).
//
//	go run ./bench/compact                        # 2M rows, 80% purged
//	go run ./bench/compact -rows 200000 -reps 3 -purge random
//	go run ./bench/compact -methods inboxkeeper,none -wal-rate 0 -baseline /tmp/inboxkeeper-main
//
// -wal-rate, -batch-size and -batch-pause set the daemon's variables;
// -methods runs only some of the methods (inboxkeeper and none always);
// -baseline runs another build of the daemon as one more method.
//
// It builds cmd/inboxkeeper, starts a durable primary and a streaming
// standby whose apply a governor caps at -apply-rate MB/s (as bench/throttle
// does: standby.Governor), fills one table per method with the same rows,
// deletes the -purged share of them (the oldest, as a backlog's purge does,
// or -purge random) and VACUUMs each, as the deleter's pass leaves it. Then,
// per rep and method, in an order that turns from rep to rep, each right
// after a CHECKPOINT with the standby caught up:
//
//	inboxkeeper: inboxkeeper compact --table T, with the standby listed
//	             (INBOXKEEPER_REPLICA_URLS) and -max-lag as its
//	             MAX_REPLICA_LAG, -lock-timeout as its LOCK_TIMEOUT
//	pg_repack:   pg_repack --no-order -t T (its defaults otherwise)
//	vacuum full: VACUUM FULL T
//	none:        nothing, for as long as inboxkeeper last took (30 s in a
//	             first rep that runs it first): its writer's latencies are
//	             the baseline
//
// The writer inserts -writer-rate rows a second into the method's table,
// each its own transaction (synchronous_commit on), from two seconds
// before the method starts until it ends; its longest insert and p99 are
// those that began while the method ran. A standby.Sampler measures the
// standby's heartbeat lag all the time; a method's peak runs until the
// standby caught up again. WAL is the whole cluster's. The final size is
// the heap's (pg_relation_size) over its live size: the heap a packed copy
// of the rows takes (CREATE TABLE AS, measured after the method and not
// counted in its WAL), with inboxkeeper's own estimate beside it. CPU is
// the primary's processes' (the writer's and the sampler's backends
// included, as in none's). The
// audit compares, before and after, the count and a digest of every row
// the writer did not write, and counts the writer's rows: it must be
// exact, or the program fails.
//
// The goals: inboxkeeper's table ends within 1.3 x its live size (and
// within 10% of pg_repack's heap over its live size), its writer's longest insert within the lock
// timeout and its p99 within 1.25 x the baseline's, and the standby within
// 1.5 x MAX_REPLICA_LAG. A missed goal is printed (GOAL MISSED), not fatal.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/standby"
)

// The goals.
const (
	goalSize    = 1.3  // final heap over live size
	goalRepack  = 1.1  // over pg_repack's final heap over its live size
	goalP99     = 1.25 // writer's p99 over the baseline's
	goalLag     = 1.5  // peak lag over MAX_REPLICA_LAG
	warmUp      = 2 * time.Second
	ikMethod    = "inboxkeeper"
	noneMethod  = "none"
	repackName  = "pg_repack"
	vacuumFullN = "vacuum full"
	baselineM   = "baseline"
)

// allMethods are the methods -methods chooses from (baseline: with
// -baseline).
var allMethods = []string{ikMethod, repackName, vacuumFullN, noneMethod}

type options struct {
	benchdata.Common // -baseline: another inboxkeeper binary, run as the method "baseline"
	rows             int
	purged           float64
	purge            string // oldest | random
	writerRate       int
	applyRate        float64
	maxLag           time.Duration
	lockTimeout      time.Duration
	batchPause       time.Duration // 0: the daemon's default
	batchSize        int           // 0: the daemon's default
	walRate          string        // "": the daemon's default
	methods          []string      // the methods to run, in allMethods' order (then baseline)
	only             string
	payload          bool
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("compact", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 2_000_000, "rows in each table before the purge")
	fs.Float64Var(&o.purged, "purged", 0.8, "the share of the rows purged before the compaction")
	fs.StringVar(&o.purge, "purge", "oldest", "which rows the purge deleted: oldest (the start of the heap) or random")
	fs.IntVar(&o.writerRate, "writer-rate", 300, "rows a second the writer inserts during each method")
	fs.Float64Var(&o.applyRate, "apply-rate", 8, "MB/s of WAL the standby may apply; 0 does not slow it")
	fs.DurationVar(&o.maxLag, "max-lag", time.Second, "inboxkeeper's INBOXKEEPER_MAX_REPLICA_LAG")
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 500*time.Millisecond, "inboxkeeper's INBOXKEEPER_LOCK_TIMEOUT: the bound on the writer's longest insert")
	fs.DurationVar(&o.batchPause, "batch-pause", 0, "inboxkeeper's INBOXKEEPER_BATCH_PAUSE between the moves' batches (0: its default): the lever that trades time for the writer's latency")
	fs.StringVar(&o.walRate, "wal-rate", "", "inboxkeeper's INBOXKEEPER_COMPACT_WAL_RATE, the most WAL a second its moves write (\"\": its default, 512kB; 0: the throttle alone)")
	fs.IntVar(&o.batchSize, "batch-size", 0, "inboxkeeper's INBOXKEEPER_BATCH_SIZE_MAX, the largest batch of moves, which the first one and the smallest follow down (0: its default)")
	fs.StringVar(&o.only, "methods", strings.Join(allMethods, ","), "the methods to run, comma-separated; inboxkeeper and none are always run")
	fs.BoolVar(&o.payload, "payload", false, "tables with a ~300-byte payload column")
	o.Define(fs, 1, "repetitions; the methods' order turns from rep to rep", "leave both clusters running and print their URLs",
		"another inboxkeeper binary (e.g. main's build) run as one more method, \""+baselineM+"\", the same way, in the same reps")
	return benchdata.Main(fs, args, &o.Common, func() error {
		o.methods = []string{}
		for _, m := range allMethods {
			if m == ikMethod || m == noneMethod || slices.Contains(strings.Split(o.only, ","), m) {
				o.methods = append(o.methods, m)
			}
		}
		if o.Baseline != "" {
			o.methods = append(o.methods, baselineM)
		}
		return benchdata.WantFlags(fs, o.batchSize < 0 || o.rows < 10 || o.purged <= 0 || o.purged >= 1 || (o.purge != "oldest" && o.purge != "random") ||
			o.writerRate <= 0 || o.applyRate < 0 || o.maxLag <= 0 || o.lockTimeout <= 0 || o.batchPause < 0,
			"-batch-size >= 0, -rows >= 10, 0 < -purged < 1, -purge oldest|random, -writer-rate > 0, -apply-rate >= 0, -max-lag > 0, -lock-timeout > 0, -batch-pause >= 0")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	benchdata.Bench
	o          options
	primary    *pgcluster.Cluster
	url        string
	standbyURL string
	pool       *pgxpool.Pool
	standby    *pgxpool.Pool
	lag        *standby.Sampler
	gov        *standby.Governor // nil while replay runs free (-apply-rate 0)
	baseline   float64
	// ikWall is how long inboxkeeper's last run took: how long none's
	// writer runs alone (30 s before any).
	ikWall time.Duration
}

// outcome is one method's run on one table.
type outcome struct {
	method                 string
	heapBefore, heap, live int64 // bytes: the purged heap, the final heap, a packed copy's
	estimate               int64 // inboxkeeper's estimate of the live size
	wall                   time.Duration
	cpu                    time.Duration // the primary's processes', during the method
	wal                    int64
	peak                   standby.Peaks
	inserts                int
	longest, p99           time.Duration
}

func benchmark(ctx context.Context, o options, w io.Writer) error {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-bench-compact-")
	if err != nil {
		return err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o}
	pair, end, err := benchdata.StartPair(ctx, b.Progress, benchdata.ClusterSettings("1GB", nil), o.Keep, w)
	if err != nil {
		return err
	}
	defer end()
	b.primary, b.url, b.standbyURL, b.pool, b.standby = pair.Primary, pair.URL, pair.StandbyURL, pair.PrimaryPool, pair.StandbyPool
	if _, err := b.inboxkeeper(ctx, "", "migrate"); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, "CREATE EXTENSION pg_repack"); err != nil {
		return fmt.Errorf("%w (Debian: apt-get install postgresql-15-repack; .ci/run installs it)", err)
	}
	if o.applyRate > 0 {
		b.gov = standby.CapApply(ctx, b.standbyURL, o.applyRate*(1<<20), b.Logf)
		defer b.gov.Stop() // replay runs free again before -keep leaves it
	}
	if b.lag, err = standby.StartSampler(ctx, b.url, b.standbyURL, b.Logf); err != nil {
		return err
	}
	defer b.lag.Stop()
	if err := b.idleBaseline(ctx); err != nil {
		return err
	}

	benchdata.Header(w, "bench/compact", o.Flags)
	slowed := "nothing (-apply-rate 0)"
	if o.applyRate > 0 {
		slowed = fmt.Sprintf("apply capped at %g MB/s of WAL", o.applyRate)
	}
	fmt.Fprintf(w, "standby: %s (baseline lag %.2f s); writer: %d inserts/s; inboxkeeper: MAX_REPLICA_LAG %s, LOCK_TIMEOUT %s\n",
		slowed, b.baseline, o.writerRate, o.maxLag, o.lockTimeout)
	expired := int64(float64(o.rows) * o.purged)
	for rep := range o.Reps {
		// The order turns from rep to rep, none included, so that a moment
		// of the shared machine's load falls on each in turn.
		methods := o.methods
		order := append(slices.Clone(methods[rep%len(methods):]), methods[:rep%len(methods)]...)
		outs, err := b.rep(ctx, rep, order, int64(o.rows), expired)
		if err != nil {
			return err
		}
		report(w, o, rep, outs)
	}
	if n := b.lag.Errors(); n > 0 {
		fmt.Fprintf(w, "the sampler had %d failed reads or writes (see stderr)\n", n)
	}
	b.Logf("done")
	return nil
}

// waitReplay waits until the standby has replayed what the primary has
// written so far and the sampler reads a lag under lagBelow.
func (b *bench) waitReplay(ctx context.Context, lagBelow float64) error {
	if err := standby.WaitCaughtUp(ctx, b.url, b.standbyURL, 20*time.Minute); err != nil {
		return err
	}
	for b.lag.Latest() >= lagBelow {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(standby.SampleEvery):
		}
	}
	return nil
}

// idleBaseline reads two idle seconds of lag: what caught up looks like.
func (b *bench) idleBaseline(ctx context.Context) (err error) {
	b.baseline, _, _, err = b.lag.Idle(ctx)
	return err
}

// rep fills a table per method, purges them, and runs the methods in
// order (none for as long as inboxkeeper last took).
func (b *bench) rep(ctx context.Context, rep int, order []string, n, expired int64) ([]outcome, error) {
	var t0 time.Time
	if err := b.pool.QueryRow(ctx, "SELECT now()").Scan(&t0); err != nil {
		return nil, err
	}
	methods := b.o.methods
	tables := make([]benchdata.Table, len(methods))
	for i := range methods {
		tables[i] = benchdata.Table{Name: fmt.Sprintf("t%d", i), Payload: b.o.payload}
	}
	if err := benchdata.FillAll(ctx, b.pool, b.Progress, tables, n, expired, t0); err != nil {
		return nil, err
	}
	purge := "remember_until <= now()"
	if b.o.purge == "random" {
		purge = fmt.Sprintf("abs(hashtext(message_id::text) %% 1000) < %d", int(1000*b.o.purged))
	}
	var fns []func() error
	for _, t := range tables {
		fns = append(fns, func() error {
			_, err := b.pool.Exec(ctx, "DELETE FROM "+t.Name+" WHERE "+purge)
			return err
		})
	}
	b.Logf("rep %d: purging", rep+1)
	if err := benchdata.Parallel(fns...); err != nil {
		return nil, err
	}
	// One VACUUM after the other, once every DELETE has committed: one
	// that ran beside another table's DELETE could remove nothing that
	// DELETE's snapshot still saw, and the compaction's first VACUUM would
	// do the purge's work (and its WAL) inside the measurement.
	for _, t := range tables {
		if _, err := b.pool.Exec(ctx, "VACUUM (ANALYZE) "+t.Name); err != nil {
			return nil, err
		}
	}
	var outs []outcome
	for _, m := range order {
		table := tables[slices.Index(methods, m)].Name
		out, err := b.measure(ctx, m, table, b.ikWall)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m, err)
		}
		if m == ikMethod {
			b.ikWall = out.wall
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// measure runs one method on table with the writer on it, and measures it.
func (b *bench) measure(ctx context.Context, method, table string, ikWall time.Duration) (outcome, error) {
	out := outcome{method: method}
	if err := b.pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass)", table).Scan(&out.heapBefore); err != nil {
		return out, err
	}
	before, err := b.audit(ctx, table)
	if err != nil {
		return out, err
	}
	lsn, err := benchdata.Checkpoint(ctx, b.pool)
	if err != nil {
		return out, err
	}
	if err := b.waitReplay(ctx, b.baseline+0.1); err != nil {
		return out, err
	}
	b.Logf("%s on %s", method, table)
	stop := make(chan struct{})
	stopWriter := sync.OnceFunc(func() { close(stop) })
	wr := &writer{}
	writerDone := make(chan error, 1)
	go func() { writerDone <- wr.run(ctx, stop, b.url, table, b.o.writerRate) }()
	if err := sleep(ctx, warmUp); err != nil {
		stopWriter()
		return out, err
	}
	b.lag.Take()
	if b.gov != nil {
		b.gov.Take()
	}
	if lsn, err = benchdata.InsertLSN(ctx, b.pool); err != nil {
		stopWriter()
		return out, err
	}
	cpu0, err := serverCPU(b.primary.DataDir)
	if err != nil {
		stopWriter()
		return out, err
	}
	start := time.Now()
	err = b.method(ctx, method, table, ikWall)
	out.wall = time.Since(start)
	end := time.Now()
	if cpu1, cerr := serverCPU(b.primary.DataDir); err == nil {
		out.cpu, err = cpu1-cpu0, cerr
	}
	stopWriter()
	if werr := <-writerDone; err == nil {
		err = werr
	}
	if err != nil {
		return out, err
	}
	if out.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return out, err
	}
	if err := b.waitReplay(ctx, b.baseline+0.1); err != nil {
		return out, err
	}
	out.peak = b.lag.Take()
	out.inserts, out.longest, out.p99 = wr.during(start, end)
	if err := b.sizes(ctx, table, &out); err != nil {
		return out, err
	}
	after, err := b.audit(ctx, table)
	if err != nil {
		return out, err
	}
	if after.rows != before.rows || after.digest != before.digest || after.written != int64(wr.count()) {
		return out, fmt.Errorf("audit of %s: %d rows (digest %s) before, %d (digest %s) after; the writer's rows %d, acknowledged %d",
			table, before.rows, before.digest, after.rows, after.digest, after.written, wr.count())
	}
	b.Logf("%s: %.1f s, heap %.0f -> %.0f MB (live %.0f MB), %.0f MB of WAL, peak lag %.2f s, writer longest %s",
		method, out.wall.Seconds(), benchdata.MB(out.heapBefore), benchdata.MB(out.heap), benchdata.MB(out.live), benchdata.MB(out.wal), out.peak.Lag, out.longest)
	return out, nil
}

// method runs one way of giving the space back.
func (b *bench) method(ctx context.Context, method, table string, ikWall time.Duration) error {
	switch method {
	case ikMethod:
		_, err := b.inboxkeeper(ctx, table, "compact", "--table", "public."+table)
		return err
	case baselineM:
		_, err := b.run(ctx, b.o.Baseline, table, "compact", "--table", "public."+table)
		return err
	case repackName:
		// Over TCP as the cluster's superuser; its defaults otherwise.
		u, err := pgx.ParseConfig(b.url)
		if err != nil {
			return err
		}
		_, err = benchdata.RunBinary(ctx, filepath.Join(b.primary.BinDir, "pg_repack"), os.Environ(),
			"-h", u.Host, "-p", fmt.Sprint(u.Port), "-U", u.User, "-d", u.Database, "--no-order", "-t", "public."+table)
		return err
	case vacuumFullN:
		_, err := b.pool.Exec(ctx, "VACUUM FULL "+table)
		return err
	}
	if ikWall == 0 {
		ikWall = 30 * time.Second
	}
	return sleep(ctx, ikWall)
}

// inboxkeeper runs the built binary on table (a policy of its own; "": none
// needed) with the standby listed, at info level.
func (b *bench) inboxkeeper(ctx context.Context, table string, args ...string) (benchdata.Process, error) {
	return b.run(ctx, b.Bin, table, args...)
}

// run is inboxkeeper with the binary bin.
func (b *bench) run(ctx context.Context, bin, table string, args ...string) (benchdata.Process, error) {
	policy := filepath.Join(b.Dir, "none.yaml")
	if table != "" {
		policy = filepath.Join(b.Dir, table+".yaml")
		if err := benchdata.WritePolicy(policy, table); err != nil {
			return benchdata.Process{}, err
		}
	}
	set := append(benchdata.DaemonSettings(b.url, policy, 0), "INBOXKEEPER_REPLICA_URLS="+b.standbyURL,
		"INBOXKEEPER_MAX_REPLICA_LAG="+b.o.maxLag.String(), "INBOXKEEPER_LOCK_TIMEOUT="+b.o.lockTimeout.String())
	if b.o.batchPause > 0 {
		set = append(set, "INBOXKEEPER_BATCH_PAUSE="+b.o.batchPause.String())
	}
	if b.o.walRate != "" {
		set = append(set, "INBOXKEEPER_COMPACT_WAL_RATE="+b.o.walRate)
	}
	if b.o.batchSize > 0 {
		set = append(set, "INBOXKEEPER_BATCH_SIZE_MAX="+strconv.Itoa(b.o.batchSize))
	}
	p, err := benchdata.RunBinary(ctx, bin, benchdata.DaemonEnv(false, set...), args...)
	if err == nil && len(args) > 0 && args[0] == "compact" {
		b.Logf("%s", strings.TrimSpace(lastLine(p.Output)))
	}
	return p, err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// serverCPU is the user and system time the primary's processes have used
// so far: the postmaster's own, its children's that have exited (cutime,
// cstime: pg_repack's backend, a VACUUM's), and each live child's.
func serverCPU(dataDir string) (time.Duration, error) {
	pidFile, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	postmaster := strings.TrimSpace(first)
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, path := range procs {
		data, err := os.ReadFile(path)
		f := benchdata.StatFields(data)
		if err != nil || f == nil {
			continue // gone meanwhile
		}
		self := filepath.Base(filepath.Dir(path)) == postmaster
		if !self && f[1] != postmaster {
			continue
		}
		for i, field := range f[11:15] {
			if i >= 2 && !self {
				break // a child's own children: none
			}
			n, _ := strconv.ParseInt(field, 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// sizes reads the final heap, the heap a packed copy takes, and
// inboxkeeper's estimate of it (after an ANALYZE, as a compaction ends).
func (b *bench) sizes(ctx context.Context, table string, out *outcome) error {
	_, err := b.pool.Exec(ctx, fmt.Sprintf("ANALYZE %[1]s; DROP TABLE IF EXISTS packed; CREATE TABLE packed AS SELECT * FROM %[1]s", table))
	if err == nil {
		err = b.pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass), pg_relation_size('packed')", table).Scan(&out.heap, &out.live)
	}
	if err != nil {
		return err
	}
	tbl, err := resolve(ctx, b.pool, table)
	if err != nil {
		return err
	}
	sp, err := compact.Measure(ctx, b.pool, tbl)
	out.estimate = sp.LiveBytes()
	return err
}

// audited is what the audit compares.
type audited struct {
	rows    int64
	digest  string
	written int64 // the writer's rows
}

func (b *bench) audit(ctx context.Context, table string) (audited, error) {
	var a audited
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE consumer <> 'writer'),
       coalesce(md5(string_agg(r::text, E'\n' ORDER BY consumer, message_id) FILTER (WHERE consumer <> 'writer')), ''),
       count(*) FILTER (WHERE consumer = 'writer') FROM %s r`, table)).Scan(&a.rows, &a.digest, &a.written)
	return a, err
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// writer inserts rows at a fixed rate, each in its own transaction, and
// keeps when each began and how long it took.
type writer struct {
	mu    sync.Mutex
	began []time.Time
	took  []time.Duration
}

// run inserts until stop is closed; an insert under way then ends first,
// so that every row it wrote is one it counts.
func (wr *writer) run(ctx context.Context, stop <-chan struct{}, url, table string, rate int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	sql := fmt.Sprintf(`INSERT INTO %s (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until%s)
SELECT 'writer', gen_random_uuid(), '\x00', 'applied', now(), now(), now() + interval '30 days'%s`, table, payloadCol(ctx, conn, table), payloadVal(ctx, conn, table))
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return nil
		case <-tick.C:
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("writer: %w", err)
		}
		wr.mu.Lock()
		wr.began, wr.took = append(wr.began, start), append(wr.took, time.Since(start))
		wr.mu.Unlock()
	}
}

// payloadCol and payloadVal add the payload column when the table has one.
func payloadCol(ctx context.Context, conn *pgx.Conn, table string) string {
	if hasPayload(ctx, conn, table) {
		return ", payload"
	}
	return ""
}

func payloadVal(ctx context.Context, conn *pgx.Conn, table string) string {
	if hasPayload(ctx, conn, table) {
		return ", repeat('p', 300)"
	}
	return ""
}

func hasPayload(ctx context.Context, conn *pgx.Conn, table string) bool {
	var ok bool
	_ = conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'payload')", table).Scan(&ok)
	return ok
}

func (wr *writer) count() int {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return len(wr.took)
}

// during is the inserts that began in [from, to): how many, the longest
// and the 99th percentile.
func (wr *writer) during(from, to time.Time) (n int, longest, p99 time.Duration) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	var ds []time.Duration
	for i, at := range wr.began {
		if !at.Before(from) && at.Before(to) {
			ds = append(ds, wr.took[i])
		}
	}
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	return len(ds), ds[len(ds)-1], ds[min(len(ds)-1, int(math.Ceil(0.99*float64(len(ds))))-1)]
}

// report prints one rep: a line per method, then the goals.
func report(w io.Writer, o options, rep int, outs []outcome) {
	fmt.Fprintf(w, "rep %d: %d rows, %.0f%% purged (%s); heap after the purge %.0f MB\n", rep+1, o.rows, 100*o.purged, o.purge, benchdata.MB(outs[0].heapBefore))
	fmt.Fprintf(w, "  %-12s %9s %9s %8s %9s %8s %8s %8s %9s %9s\n", "method", "heap MB", "live MB", "size", "wall s", "CPU s", "WAL MB", "lag s", "max ms", "p99 ms")
	by := map[string]outcome{}
	for _, x := range outs {
		by[x.method] = x
		fmt.Fprintf(w, "  %-12s %9.1f %9.1f %7.2fx %9.1f %8.1f %8.0f %8.2f %9.1f %9.2f\n", x.method, benchdata.MB(x.heap), benchdata.MB(x.live),
			float64(x.heap)/float64(x.live), x.wall.Seconds(), x.cpu.Seconds(), benchdata.MB(x.wal), x.peak.Lag, ms(x.longest), ms(x.p99))
	}
	ik, rp, none := by[ikMethod], by[repackName], by[noneMethod]
	fmt.Fprintf(w, "  inboxkeeper's estimate of the live size: %.1f MB (%.2f x the packed copy); writer inserts during inboxkeeper: %d\n",
		benchdata.MB(ik.estimate), float64(ik.estimate)/float64(ik.live), ik.inserts)
	// Against pg_repack's result as a share of its own live size: the
	// writer adds rows for as long as a method runs, and inboxkeeper runs
	// ten times longer.
	size := float64(ik.heap) / float64(ik.live)
	if rp.live > 0 {
		rpSize := float64(rp.heap) / float64(rp.live)
		fmt.Fprintf(w, "  goal size: heap <= %.1f x live: %.2f x: %s; within %.0f%% of pg_repack's %.2f x (%.2f x it): %s\n",
			goalSize, size, benchdata.Verdict(size <= goalSize), 100*(goalRepack-1), rpSize, size/rpSize, benchdata.Verdict(size <= goalRepack*rpSize))
	} else {
		fmt.Fprintf(w, "  goal size: heap <= %.1f x live: %.2f x: %s (pg_repack not run)\n", goalSize, size, benchdata.Verdict(size <= goalSize))
	}
	fmt.Fprintf(w, "  goal writer: longest %.1f ms <= lock timeout %s: %s; p99 %.2f ms <= %.2f x none's %.2f ms: %s\n",
		ms(ik.longest), o.lockTimeout, benchdata.Verdict(ik.longest <= o.lockTimeout), ms(ik.p99), goalP99, ms(none.p99), benchdata.Verdict(float64(ik.p99) <= goalP99*float64(none.p99)))
	if bl, ok := by[baselineM]; ok {
		fmt.Fprintf(w, "  baseline: p99 %.2f ms (%.2f x none's), longest %.1f ms, %.1f s, %.0f MB of WAL; this build's p99 %.2f x the baseline's\n",
			ms(bl.p99), float64(bl.p99)/float64(none.p99), ms(bl.longest), bl.wall.Seconds(), benchdata.MB(bl.wal), float64(ik.p99)/float64(bl.p99))
	}
	bound := goalLag * o.maxLag.Seconds()
	fmt.Fprintf(w, "  goal standby: peak lag %.2f s <= %.1f x %s = %.2f s: %s\n", ik.peak.Lag, goalLag, o.maxLag, bound, benchdata.Verdict(ik.peak.Lag <= bound))
	fmt.Fprintln(w, "  audit: exact (every row the writer did not write unchanged, each of its rows there once)")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// resolve resolves table as WritePolicy's policy names it.
func resolve(ctx context.Context, pool *pgxpool.Pool, table string) (*catalog.Table, error) {
	p, err := policy.Parse([]byte(fmt.Sprintf("tables:\n  - table: public.%s\n    key: [consumer, message_id]\n    expires_at: remember_until\n", table)), table+".yaml")
	if err != nil {
		return nil, err
	}
	return catalog.Resolve(ctx, pool, p.Tables[0])
}
