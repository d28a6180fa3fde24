// Command expiry benchmarks the inboxkeeper deleter against one unbounded
// DELETE, side by side in one run on identical tables: on a shared machine
// only ratios mean anything, absolute times do not.
//
//	go run ./bench/expiry                     # 2M rows (1M expired), then 5M for memory
//	go run ./bench/expiry -reps 3 -batch 10000
//
// It builds cmd/inboxkeeper, starts a durable throwaway PostgreSQL (so WAL
// figures are real), fills two identical inbox tables a and b, and runs
// `inboxkeeper once` on a and `DELETE FROM b WHERE remember_until <= now()`
// on b, each right after a CHECKPOINT. It prints wall time, rows/s, WAL
// bytes and CPU seconds (server and daemon) of both, their ratios, and the
// daemon's peak RSS; then the peak RSS of a daemon run over -flat-rows
// expired rows of a narrow table, to show that memory does not grow with the
// backlog. Other INBOXKEEPER_* variables in the environment reach the daemon
// (e.g. INBOXKEEPER_BATCH_SIZE_MAX) and are listed in the report. It exits
// non-zero when a run does not delete exactly the expired rows; a missed goal
// is printed (GOAL MISSED), not fatal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/pgcluster"
)

// The goals of the issue.
const (
	goalThroughput = 0.5 // daemon rows/s over unbounded DELETE rows/s, at least
	goalRSSMB      = 64  // daemon peak RSS, under
	goalFlat       = 1.5 // peak RSS at -flat-rows over peak RSS at rows/2, at most
)

type options struct {
	rows, batch, flatRows, reps int
	keep                        bool
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("expiry", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 2_000_000, "rows in each of the tables a and b; half of them expired")
	fs.IntVar(&o.batch, "batch", 5000, "the daemon's INBOXKEEPER_BATCH_SIZE (its starting size if it adapts)")
	fs.IntVar(&o.flatRows, "flat-rows", 5_000_000, "expired rows of the memory-flatness run; 0 skips it")
	fs.IntVar(&o.reps, "reps", 1, "repetitions, alternating whether the daemon or the DELETE goes first")
	fs.BoolVar(&o.keep, "keep", false, "leave the cluster running and print its URL")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.rows < 2 || o.batch < 1 || o.flatRows < 0 || o.reps < 1 || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "bench/expiry: want -rows >= 2, -batch >= 1, -flat-rows >= 0, -reps >= 1 and no arguments")
		return 2
	}
	return benchdata.Run("bench/expiry", func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	o       options
	dir     string // temporary: the binary and the policy files
	bin     string
	url     string
	dataDir string
	pool    *pgxpool.Pool
	started time.Time
}

// result is one measured deletion.
type result struct {
	wall    time.Duration
	cpu     time.Duration // server and daemon
	wal     int64         // bytes
	rss     int64         // bytes; the daemon only
	batches int           // the daemon only, from its log; 0 when not found
}

func benchmark(ctx context.Context, o options, w io.Writer) error {
	b := &bench{o: o, started: time.Now()}
	var err error
	if b.dir, err = os.MkdirTemp("", "inboxkeeper-bench-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.dir)
	b.logf("building cmd/inboxkeeper")
	if b.bin, err = benchdata.BuildBinary(ctx, b.dir); err != nil {
		return err
	}

	b.logf("starting a durable PostgreSQL")
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true, Settings: map[string]string{
		"shared_buffers": "'2GB'", "max_wal_size": "'8GB'", "checkpoint_timeout": "'30min'",
	}})
	if err != nil {
		return err
	}
	b.url, b.dataDir = c.URL("postgres"), c.DataDir
	if o.keep {
		defer fmt.Fprintf(w, "cluster kept: %s (data directory %s)\n", b.url, c.DataDir)
	} else {
		defer c.Destroy()
	}
	if b.pool, err = pgxpool.New(ctx, b.url); err != nil {
		return err
	}
	defer b.pool.Close()
	// migrate reads no policy, but the configuration must name one.
	if _, err := b.inboxkeeper(ctx, filepath.Join(b.dir, "none.yaml"), "migrate"); err != nil {
		return err
	}

	total, expired := int64(o.rows), int64(o.rows/2)
	var throughput, walRatio, cpuRatio []float64
	var rss1M int64
	for rep := range o.reps {
		if err := b.fillPair(ctx, total, expired); err != nil {
			return err
		}
		if rep == 0 {
			var heap, idx int64
			if err := b.pool.QueryRow(ctx, `SELECT pg_relation_size('a'), pg_indexes_size('a')`).Scan(&heap, &idx); err != nil {
				return err
			}
			fmt.Fprintf(w, "rows: %d total, %d expired; batch size %d; tables a and b each %.0f MB heap + %.0f MB indexes\n",
				total, expired, o.batch, benchdata.MB(heap), benchdata.MB(idx))
			if extra := passedThrough(); len(extra) > 0 {
				fmt.Fprintf(w, "daemon settings from the environment: %s\n", strings.Join(extra, " "))
			}
		}
		// Alternate the order: the second run finds shared buffers and the
		// OS cache as the first one left them.
		var d, u result
		daemon := func() (err error) { d, err = b.daemon(ctx, "a", total, expired); return err }
		unbounded := func() (err error) { u, err = b.unbounded(ctx, "b", total, expired); return err }
		first, second, order := daemon, unbounded, "daemon first"
		if rep%2 == 1 {
			first, second, order = unbounded, daemon, "DELETE first"
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
		rd, ru := float64(expired)/d.wall.Seconds(), float64(expired)/u.wall.Seconds()
		throughput = append(throughput, rd/ru)
		walRatio = append(walRatio, float64(d.wal)/float64(u.wal))
		cpuRatio = append(cpuRatio, d.cpu.Seconds()/u.cpu.Seconds())
		rss1M = max(rss1M, d.rss)
		fmt.Fprintf(w, "rep %d of %d (%s):\n", rep+1, o.reps, order)
		fmt.Fprintf(w, "  daemon (inboxkeeper once): %6.1f s %8.0f rows/s  WAL %5.0f MB  CPU %5.1f s  peak RSS %.1f MB  %s\n",
			d.wall.Seconds(), rd, benchdata.MB(d.wal), d.cpu.Seconds(), benchdata.MB(d.rss), batches(d, expired))
		fmt.Fprintf(w, "  unbounded DELETE:          %6.1f s %8.0f rows/s  WAL %5.0f MB  CPU %5.1f s\n", u.wall.Seconds(), ru, benchdata.MB(u.wal), u.cpu.Seconds())
		fmt.Fprintf(w, "  daemon/unbounded: throughput %.2f, WAL %.2f, CPU %.2f\n", rd/ru, float64(d.wal)/float64(u.wal), d.cpu.Seconds()/u.cpu.Seconds())
	}
	of := ""
	if o.reps > 1 {
		of = fmt.Sprintf(" (median of %d reps)", o.reps)
	}
	tr := median(throughput)
	fmt.Fprintf(w, "throughput ratio daemon/unbounded: %.2f%s (goal >= %.1f) %s\n", tr, of, goalThroughput, benchdata.Verdict(tr >= goalThroughput))
	fmt.Fprintf(w, "WAL ratio daemon/unbounded: %.2f%s\n", median(walRatio), of)
	// CPU seconds are less disturbed than wall time by other load on the
	// machine, so they say whether a bad throughput ratio is noise.
	fmt.Fprintf(w, "CPU ratio daemon/unbounded: %.2f%s (server and daemon CPU seconds)\n", median(cpuRatio), of)

	peak := rss1M
	if o.flatRows > 0 {
		n := int64(o.flatRows)
		if err := b.fill(ctx, "flat", false, n, n, b.now(ctx)); err != nil {
			return err
		}
		f, err := b.daemon(ctx, "flat", n, n)
		if err != nil {
			return err
		}
		peak = max(peak, f.rss)
		ratio := float64(f.rss) / float64(rss1M)
		fmt.Fprintf(w, "daemon on %d expired narrow rows: %.1f s, peak RSS %.1f MB  %s\n", n, f.wall.Seconds(), benchdata.MB(f.rss), batches(f, n))
		fmt.Fprintf(w, "peak RSS: %.1f MB at %d expired rows, %.1f MB at %d; ratio %.2f (flat within %.1fx) %s\n",
			benchdata.MB(rss1M), expired, benchdata.MB(f.rss), n, ratio, goalFlat, benchdata.Verdict(ratio <= goalFlat))
	} else {
		fmt.Fprintln(w, "peak RSS flatness: skipped (-flat-rows 0)")
	}
	fmt.Fprintf(w, "daemon peak RSS: %.1f MB (goal < %d MB) %s\n", benchdata.MB(peak), goalRSSMB, benchdata.Verdict(benchdata.MB(peak) < goalRSSMB))
	b.logf("done")
	return nil
}

// fillPair makes a and b from the same deterministic rows, one session each,
// so they have the same physical layout.
// fill (re)creates table with the shared benchmark inbox.
func (b *bench) verify(ctx context.Context, table string, n, expired int64) error {
	return benchdata.Verify(ctx, b.pool, table, n, expired)
}

func (b *bench) fill(ctx context.Context, table string, payload bool, n, expired int64, t0 time.Time) error {
	b.logf("filling %s with %d rows", table, n)
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return benchdata.Fill(ctx, conn, table, payload, n, expired, t0)
}

func (b *bench) fillPair(ctx context.Context, n, expired int64) error {
	t0 := b.now(ctx)
	err := parallel(
		func() error { return b.fill(ctx, "a", true, n, expired, t0) },
		func() error { return b.fill(ctx, "b", true, n, expired, t0) })
	if err != nil {
		return err
	}
	var sa, sb int64
	if err := b.pool.QueryRow(ctx, `SELECT pg_relation_size('a'), pg_relation_size('b')`).Scan(&sa, &sb); err != nil {
		return err
	}
	if sa != sb {
		return fmt.Errorf("tables a and b should be identical but have %d and %d bytes", sa, sb)
	}
	return nil
}

// daemon runs `inboxkeeper once` on table after a checkpoint.
func (b *bench) daemon(ctx context.Context, table string, n, expired int64) (result, error) {
	b.logf("inboxkeeper once on %s", table)
	policy := filepath.Join(b.dir, table+".yaml")
	yaml := fmt.Sprintf("tables:\n  - table: public.%s\n    key: [consumer, message_id]\n    expires_at: remember_until\n", table)
	if err := os.WriteFile(policy, []byte(yaml), 0o644); err != nil {
		return result{}, err
	}
	lsn, err := benchdata.Checkpoint(ctx, b.pool)
	if err != nil {
		return result{}, err
	}
	cpu, err := b.serverCPU()
	if err != nil {
		return result{}, err
	}
	r, err := b.inboxkeeper(ctx, policy, "once")
	if err != nil {
		return r, err
	}
	cpu2, err := b.serverCPU()
	if err != nil {
		return r, err
	}
	r.cpu += cpu2 - cpu
	if r.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return r, err
	}
	return r, b.verify(ctx, table, n, expired)
}

// unbounded deletes every expired row of table in one statement, after a
// checkpoint, as the daemon's run is.
func (b *bench) unbounded(ctx context.Context, table string, n, expired int64) (result, error) {
	b.logf("unbounded DELETE on %s", table)
	lsn, err := benchdata.Checkpoint(ctx, b.pool)
	if err != nil {
		return result{}, err
	}
	cpu, err := b.serverCPU()
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	tag, err := b.pool.Exec(ctx, "DELETE FROM "+table+" WHERE remember_until <= now()")
	r := result{wall: time.Since(start)}
	if err != nil {
		return r, fmt.Errorf("unbounded DELETE: %w", err)
	}
	cpu2, err := b.serverCPU()
	if err != nil {
		return r, err
	}
	r.cpu = cpu2 - cpu
	if tag.RowsAffected() != expired {
		return r, fmt.Errorf("unbounded DELETE on %s deleted %d rows, want %d", table, tag.RowsAffected(), expired)
	}
	if r.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return r, err
	}
	return r, b.verify(ctx, table, n, expired)
}

func (b *bench) now(ctx context.Context) time.Time {
	var t time.Time
	if err := b.pool.QueryRow(ctx, "SELECT now()").Scan(&t); err != nil {
		return time.Now() // only a reference point; the data stays consistent
	}
	return t
}

// ownVariables are the daemon settings the benchmark sets itself.
var ownVariables = []string{"INBOXKEEPER_DATABASE_URL", "INBOXKEEPER_POLICY_FILE", "INBOXKEEPER_BATCH_SIZE", "INBOXKEEPER_METRICS_ADDR"}

// passedThrough lists the other INBOXKEEPER_* variables of the environment:
// they reach the daemon (to try e.g. INBOXKEEPER_BATCH_SIZE_MAX), so the
// report must show them. Connection strings are shown by name only.
func passedThrough() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "INBOXKEEPER_") || slices.Contains(ownVariables, name) || name == "INBOXKEEPER_TEST_DATABASE_URL" {
			continue
		}
		if strings.Contains(name, "URL") {
			kv = name + "=(set)"
		}
		out = append(out, kv)
	}
	return out
}

// inboxkeeper runs the built binary and measures wall time and peak RSS.
func (b *bench) inboxkeeper(ctx context.Context, policy string, args ...string) (result, error) {
	cmd := exec.CommandContext(ctx, b.bin, args...)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(ownVariables, name) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "INBOXKEEPER_DATABASE_URL="+b.url, "INBOXKEEPER_POLICY_FILE="+policy,
		"INBOXKEEPER_BATCH_SIZE="+strconv.Itoa(b.o.batch), "INBOXKEEPER_METRICS_ADDR=")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	r := result{wall: time.Since(start), cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
	if err != nil {
		return r, fmt.Errorf("inboxkeeper %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.rss = int64(ru.Maxrss) * 1024 // KiB on Linux
	}
	if m := doneBatches.FindStringSubmatch(out.String()); m != nil {
		r.batches, _ = strconv.Atoi(m[1])
	}
	return r, nil
}

// doneBatches finds the batch count in the daemon's "table done" log line
// (text or JSON): the daemon may adapt its batch size, so the count shows
// what a run really did.
var doneBatches = regexp.MustCompile(`expiry: table done.*?\bbatches"?[=:](\d+)`)

func batches(r result, rows int64) string {
	if r.batches == 0 {
		return ""
	}
	return fmt.Sprintf("%d batches, avg %d rows", r.batches, rows/int64(r.batches))
}

// serverCPU is the CPU time the cluster has used so far: the postmaster and
// its live children, plus, in the postmaster's cutime and cstime, every child
// that has exited, such as the daemon's backends. It reads Linux's /proc
// and assumes 100 clock ticks a second.
func (b *bench) serverCPU() (time.Duration, error) {
	pid, err := os.ReadFile(filepath.Join(b.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("server CPU time: %w", err)
	}
	pm, _, _ := strings.Cut(string(pid), "\n")
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, path := range stats {
		data, err := os.ReadFile(path)
		i := strings.LastIndexByte(string(data), ')')
		if err != nil || i < 0 {
			continue // gone meanwhile
		}
		f := strings.Fields(string(data[i+1:])) // f[0] is field 3 of proc(5)
		if len(f) < 15 {
			continue
		}
		n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
		switch {
		case path == "/proc/"+pm+"/stat":
			ticks += n(11) + n(12) + n(13) + n(14) // utime stime cutime cstime
		case f[1] == pm:
			ticks += n(11) + n(12)
		}
	}
	if ticks == 0 {
		return 0, errors.New("server CPU time: cannot read /proc/<pid>/stat of the postmaster " + pm)
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
