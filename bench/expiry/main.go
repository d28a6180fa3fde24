// Command expiry benchmarks the inboxkeeper deleter against what a DBA would
// run instead, side by side in one run on identical copies of the same
// table: on a shared machine only ratios mean anything, absolute times do
// not.
//
//	go run ./bench/expiry                     # every layout, 2M rows, then 5M for memory
//	go run ./bench/expiry -reps 3 -batch 10000
//	go run ./bench/expiry -layouts uniform,steady-state -horizons 30 -gap 72h
//
// It builds cmd/inboxkeeper and starts a durable throwaway PostgreSQL (so
// WAL figures are real). For each layout it fills one template database:
// append-ordered (expiry rises with insertion order) and interleaved (100
// retention horizons, so each heap page holds rows of many expiries) have
// their expired half in the first half of the heap; uniform (every page
// holds expired and live rows, expiry order unrelated to heap order) and
// steady-state (60 days of rows with -horizons horizons of 30 to 60 days,
// left by a pass -gap before: the due rows are those expired since, over
// the older half of the heap) scatter them (benchdata.FillLayout). Each
// method then runs on a fresh file copy of it, right after a CHECKPOINT,
// and after one unmeasured warm-up run per layout: `inboxkeeper once`, one
// unbounded `DELETE ... WHERE remember_until <= now()`, and the procedure
// loop a DBA would schedule with pg_cron (`DELETE ... WHERE ctid =
// ANY(ARRAY(SELECT ctid ... ORDER BY remember_until LIMIT n))`, COMMIT per
// batch) at 5,000 and 50,000 rows a batch, plain and with FOR UPDATE SKIP
// LOCKED. The order of the methods is reversed every other rep. It prints
// each method's wall time, rows/s, WAL, CPU seconds (server and daemon) and
// the shared buffers its statements read and dirtied per deleted row
// (pg_stat_statements), the ratios to the unbounded DELETE, the daemon's
// longest batch, whether the goals hold, and the CPU time the hypervisor
// gave other guests during the rep (steal); then the peak RSS of a daemon
// run over -flat-rows expired rows of a narrow table, to show that memory
// does not grow with the backlog. -baseline runs another build of the
// daemon (main's) as one more method, in the same reps; -run-pass adds a
// pass of `inboxkeeper run`, started and warmed before it and timed by the
// daemon's own log, as a sidecar runs it (runpass.go). `inboxkeeper once`
// is timed from exec to exit; the statements alone, on a connection opened
// before them (pg_cron opens one for each run of a job, or starts a
// background worker: left out, in the statements' favour), or with
// -from-exec through psql from exec to exit (as cron runs a script). Other
// INBOXKEEPER_* variables in the environment reach the daemon (e.g.
// INBOXKEEPER_BATCH_SIZE_MAX) and are listed in the report. It exits
// non-zero when a method does not delete exactly the expired rows; a missed
// goal is printed (GOAL MISSED), not fatal.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// The goals of the issue.
const (
	goalWAL   = 1.1 // daemon WAL over unbounded DELETE WAL, at most
	goalRSSMB = 64  // daemon peak RSS, under
	goalFlat  = 1.5 // peak RSS at -flat-rows over peak RSS at rows/2, at most
)

// layout is one physical arrangement of the inbox, with its throughput goal
// (daemon rows/s over unbounded DELETE rows/s, at least).
type layout struct {
	name string
	fill benchdata.Layout // Horizons 0: -horizons
	goal float64
}

// The layouts: the first two have every expired row in the first half of
// the heap; the scattered ones spread them over it.
var layouts = []layout{
	{name: "append-ordered", fill: benchdata.Layout{Kind: "horizons", Horizons: 1}, goal: 0.85},
	{name: "interleaved", fill: benchdata.Layout{Kind: "horizons", Horizons: 100}, goal: 0.85},
	{name: "uniform", fill: benchdata.Layout{Kind: "uniform"}, goal: 0.8},
	{name: "steady-state", fill: benchdata.Layout{Kind: "steady-state"}, goal: 0.8},
}

func layoutName(l layout) string { return l.name }

type options struct {
	benchdata.Common                // -baseline: another build of the daemon, run as a method of its own
	rows, batch, flatRows, horizons int
	gap                             time.Duration
	layouts                         []layout
	payload                         bool          // the layouts' rows carry the ~300-byte payload column
	fromExec                        bool          // time the statements through psql, from exec to exit
	runPass                         bool          // one more method: a pass of inboxkeeper run, timed by the daemon
	relay                           time.Duration // every method through a TCP relay holding bytes this long each way; negative: none
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("expiry", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 2_000_000, "rows in each copy of the table; half of them expired (uniform, steady-state: rows generated, see -gap)")
	fs.IntVar(&o.batch, "batch", 5000, "the daemon's INBOXKEEPER_BATCH_SIZE (its starting size if it adapts)")
	fs.IntVar(&o.flatRows, "flat-rows", 5_000_000, "expired rows of the memory-flatness run; 0 skips it")
	fs.IntVar(&o.horizons, "horizons", 100, "retention horizons of the uniform and steady-state layouts")
	fs.DurationVar(&o.gap, "gap", 7*24*time.Hour, "steady-state: how long before the run the last pass ran (its due rows expired since)")
	names := fs.String("layouts", benchdata.Names(layouts, layoutName), "comma-separated layouts to run")
	fs.BoolVar(&o.payload, "payload", true, "the layouts' rows carry a ~300-byte payload column (about 19 rows a page); false: narrow rows (about 66 a page)")
	fs.BoolVar(&o.fromExec, "from-exec", false, "time the unbounded DELETE and the loops from exec to exit, each through psql on a connection of its own, as cron runs them (inboxkeeper once is always timed so); default: each statement alone, on a connection opened before it")
	fs.DurationVar(&o.relay, "relay", -1, "every method's connections (the daemon's, psql's, the statements') through a local TCP relay that holds what it forwards this long each way, as a network would (0: the hop alone); the report gives the round trip measured through it. Negative: none")
	fs.BoolVar(&o.runPass, "run-pass", false, "one more method, \""+runPassName+"\": a pass of the daemon (inboxkeeper run) started before it and warmed by a pass over an empty table, timed from the pass's start to its end by the daemon's log, as a sidecar runs it")
	o.Define(fs, 1, benchdata.RepsUsage, benchdata.KeepUsage, "another inboxkeeper binary (e.g. main's build) run as one more method, \""+baselineName+"\", in the same reps")
	return benchdata.Main(fs, args, &o.Common, func() error {
		var err error
		if o.layouts, err = benchdata.Pick(layouts, layoutName, *names, "layout"); err != nil {
			return err
		}
		for i, l := range o.layouts {
			if l.fill.Horizons == 0 {
				o.layouts[i].fill.Horizons, o.layouts[i].fill.Gap = o.horizons, o.gap
			}
		}
		return benchdata.WantFlags(fs, o.rows < 2 || o.batch < 1 || o.flatRows < 0 || o.horizons < 2 || o.gap <= 0,
			"-rows >= 2, -batch >= 1, -flat-rows >= 0, -horizons >= 2, -gap > 0")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	benchdata.Bench
	o       options
	methods []method // methods and, with -baseline, the baseline's once, with -run-pass a pass of run
	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool    // the postgres database: copies are made from here
	relay   *benchdata.Relay // -relay: the methods connect through it
}

// result is one measured deletion.
type result struct {
	wall    time.Duration
	cpu     time.Duration // server and daemon
	wal     int64         // bytes
	rss     int64         // bytes; the daemon only
	batches int           // the daemon only, from its log; 0 when not found
	longest time.Duration // the daemon's longest batch, from its log; 0 when not found
	swept   int           // the daemon's sweep batches, from its log; -1 when not found
	// Shared buffers the method's statements read (hits and reads) and
	// dirtied, from pg_stat_statements: heap and index pages visited.
	pages, dirtied int64
}

// method deletes the expired rows of table inbox in database db.
type method struct {
	name string
	run  func(ctx context.Context, b *bench, db string) (result, error)
}

const daemonName, unboundedName, baselineName = "inboxkeeper once", "unbounded DELETE", "baseline once"

var methods = []method{
	{daemonName, func(ctx context.Context, b *bench, db string) (result, error) { return b.daemon(ctx, db, "inbox") }},
	{unboundedName, func(ctx context.Context, b *bench, db string) (result, error) {
		return b.statement(ctx, db, "DELETE FROM inbox WHERE remember_until <= now()")
	}},
	loop(5000, false), loop(50000, false), loop(5000, true), loop(50000, true),
}

// loopProcedure is the DBA's loop: batches by ctid in expiry order, with a
// COMMIT after each, until a batch comes back short. It has no keyset, as
// such procedures usually do not.
const loopProcedure = `
CREATE PROCEDURE delete_loop(n int, skip_locked boolean) LANGUAGE plpgsql AS $$
DECLARE deleted bigint;
BEGIN
  LOOP
    IF skip_locked THEN
      WITH victims AS (SELECT ctid FROM inbox WHERE remember_until <= now()
                       ORDER BY remember_until LIMIT n FOR UPDATE SKIP LOCKED)
      DELETE FROM inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM victims));
    ELSE
      DELETE FROM inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM inbox WHERE remember_until <= now()
                                                 ORDER BY remember_until LIMIT n));
    END IF;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    COMMIT;
    EXIT WHEN deleted < n;
  END LOOP;
END $$`

func loop(n int, skipLocked bool) method {
	name := fmt.Sprintf("loop %d", n)
	if skipLocked {
		name += " SKIP LOCKED"
	}
	return method{name, func(ctx context.Context, b *bench, db string) (result, error) {
		return b.statement(ctx, db, fmt.Sprintf("CALL delete_loop(%d, %t)", n, skipLocked))
	}}
}

func benchmark(ctx context.Context, o options, w io.Writer) error {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-bench-")
	if err != nil {
		return err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o}
	b.methods = methods
	if o.Baseline != "" {
		// The same harness and copies, another build: main's daemon
		// against this one's, rep by rep, right after it (right before
		// it in the reps run in reverse). Last in the list, the baseline
		// won every rep on append-ordered even where it ran the same
		// passes as this build (three runs of 2026-12-03); side
		// by side, taking turns, the two meet the same conditions.
		b.methods = slices.Insert(slices.Clone(methods), 1, method{baselineName, func(ctx context.Context, b *bench, db string) (result, error) {
			if err := benchdata.MigrateAs(ctx, o.Baseline, b.cluster.URL(db), filepath.Join(b.Dir, "none.yaml")); err != nil {
				return result{}, err
			}
			return b.daemonBin(ctx, o.Baseline, db, "inbox")
		}})
	}
	if o.runPass {
		b.methods = append(slices.Clone(b.methods), method{runPassName, func(ctx context.Context, b *bench, db string) (result, error) {
			return b.runPass(ctx, db)
		}})
	}

	// pg_stat_statements counts the pages each method's statements read and
	// dirty (a CALL counts the statements it runs).
	c, pool, end, err := benchdata.StartCluster(ctx, b.Progress, benchdata.ClusterSettings("2GB",
		map[string]string{"shared_preload_libraries": "'pg_stat_statements'"}), o.Keep, w)
	if err != nil {
		return err
	}
	defer end()
	b.cluster, b.pool = c, pool
	if _, err := b.pool.Exec(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
		return err
	}

	total, expired := int64(o.rows), int64(o.rows/2)
	benchdata.Header(w, "bench/expiry", o.Flags)
	benchdata.SharedMemory(w, c.DataDir)
	fmt.Fprintf(w, "rows: %d generated in each copy; daemon batch size %d; %d reps\n", total, o.batch, o.Reps)
	if extra := benchdata.PassedThrough(b.daemonSettings("", "")...); len(extra) > 0 {
		fmt.Fprintf(w, "daemon settings from the environment: %s\n", strings.Join(extra, " "))
	}
	fmt.Fprintf(w, "pages: shared buffers read or hit per deleted row, and dirtied per deleted row (pg_stat_statements)\n")
	if o.relay >= 0 {
		server, err := url.Parse(c.URL("postgres"))
		if err != nil {
			return err
		}
		if b.relay, err = benchdata.StartRelay(server.Host, o.relay); err != nil {
			return err
		}
		defer b.relay.Close()
		if b.methodURL("postgres") == c.URL("postgres") {
			return fmt.Errorf("relay: the cluster's URL %s does not name %s", c.URL("postgres"), server.Host)
		}
		rt, err := benchdata.RoundTrip(ctx, b.methodURL("postgres"), 200)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		direct, err := benchdata.RoundTrip(ctx, c.URL("postgres"), 200)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "relay: every method connects through a TCP relay holding what it forwards %s each way: a SELECT 1 round trip %s through it, %s direct (medians of 200)\n",
			o.relay, rt.Round(time.Microsecond), direct.Round(time.Microsecond))
	}
	if o.fromExec {
		fmt.Fprintf(w, "timing: every method from exec to exit; the unbounded DELETE and the loops through %s, each on a connection of its own (-from-exec)\n", b.psql())
	} else {
		fmt.Fprintf(w, "timing: inboxkeeper once from exec to exit; the unbounded DELETE and the loops as statements alone, on a connection opened before them\n")
	}
	if o.runPass {
		fmt.Fprintf(w, "timing: %s from the pass's start to its end, by the daemon's log (INTERVAL %s, a pass over an empty table before it)\n", runPassName, runPassInterval)
	}
	var rss1M int64
	for _, l := range o.layouts {
		rss, err := b.layout(ctx, w, l, total, expired)
		if err != nil {
			return err
		}
		rss1M = max(rss1M, rss)
	}

	peak := rss1M
	if o.flatRows > 0 {
		n := int64(o.flatRows)
		if _, _, err := b.prepare(ctx, "flat", benchdata.Layout{Kind: "horizons"}, false, n, n); err != nil {
			return err
		}
		f, err := b.daemon(ctx, "flat", "inbox")
		if err != nil {
			return err
		}
		if err := b.inDB(ctx, "flat", func(conn *pgx.Conn) error { return benchdata.Verify(ctx, conn, "inbox", n, n) }); err != nil {
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
	b.Logf("done")
	return nil
}

// layout fills the layout's template and runs every method on a copy of it,
// -reps times. It returns the daemon's peak RSS.
func (b *bench) layout(ctx context.Context, w io.Writer, l layout, total, expired int64) (int64, error) {
	tpl := "tpl_" + strings.ReplaceAll(l.name, "-", "_")
	total, expired, err := b.prepare(ctx, tpl, l.fill, b.o.payload, total, expired)
	if err != nil {
		return 0, err
	}
	var heap, idx int64
	err = b.inDB(ctx, tpl, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT pg_relation_size('inbox'), pg_indexes_size('inbox')`).Scan(&heap, &idx)
	})
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(w, "\nlayout %s: %d rows, %d expired; %.0f MB heap (%.0f rows a page) + %.0f MB indexes\n", l.name, total, expired,
		benchdata.MB(heap), float64(total)/float64(max(1, heap/8192)), benchdata.MB(idx))
	// One unmeasured run first: the first deletion after the template was
	// filled measured up to twice the CPU of later ones, whatever the
	// method, and the first method of rep 1 would carry that alone.
	if err := b.copyDB(ctx, tpl, "run"); err != nil {
		return 0, err
	}
	b.Logf("%s: warm-up (unbounded DELETE, not measured)", l.name)
	if _, err := methods[1].run(ctx, b, "run"); err != nil {
		return 0, err
	}
	var rss int64
	met := map[string]int{}
	for rep := range b.o.Reps {
		order := slices.Clone(b.methods)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		res := map[string]result{}
		steal := benchdata.Steal()
		for _, m := range order {
			db := "run"
			if err := b.copyDB(ctx, tpl, db); err != nil {
				return 0, err
			}
			b.Logf("%s: %s", l.name, m.name)
			r, err := m.run(ctx, b, db)
			if err == nil {
				err = b.inDB(ctx, db, func(conn *pgx.Conn) error { return benchdata.Verify(ctx, conn, "inbox", total, expired) })
			}
			if err != nil {
				return 0, fmt.Errorf("%s, %s: %w", l.name, m.name, err)
			}
			res[m.name] = r
		}
		u := res[unboundedName]
		ur := float64(expired) / u.wall.Seconds()
		fmt.Fprintf(w, "%s, rep %d of %d (%s first):\n", l.name, rep+1, b.o.Reps, order[0].name)
		fmt.Fprintf(w, "  %-26s %7s %10s %8s %7s %10s %6s %6s %7s\n", "method", "time", "rows/s", "WAL", "CPU", "throughput", "WAL", "pages", "dirtied")
		bestLoop, bestName := 0.0, ""
		for _, m := range b.methods {
			r := res[m.name]
			rate := float64(expired) / r.wall.Seconds()
			extra := ""
			if m.name == daemonName || m.name == baselineName || m.name == runPassName {
				extra = fmt.Sprintf("  peak RSS %.1f MB  %s", benchdata.MB(r.rss), batches(r, expired))
			}
			if m.name == daemonName {
				rss = max(rss, r.rss) // this build's: the baseline's is not judged
			}
			fmt.Fprintf(w, "  %-26s %6.2fs %10.0f %5.0f MB %6.1fs %10.2f %6.2f %6.2f %7.2f%s\n", m.name, r.wall.Seconds(), rate,
				benchdata.MB(r.wal), r.cpu.Seconds(), rate/ur, float64(r.wal)/float64(u.wal),
				perRow(r.pages, expired), perRow(r.dirtied, expired), extra)
			if strings.HasPrefix(m.name, "loop") && rate/ur > bestLoop {
				bestLoop, bestName = rate/ur, m.name
			}
		}
		d := res[daemonName]
		tr, wr := float64(expired)/d.wall.Seconds()/ur, float64(d.wal)/float64(u.wal)
		target := batchTarget()
		goals := []struct {
			name string
			ok   bool
			text string
		}{
			{"throughput", tr >= l.goal, fmt.Sprintf("throughput ratio inboxkeeper/unbounded %.2f (goal >= %.2f)", tr, l.goal)},
			{"ahead", tr > bestLoop, fmt.Sprintf("ahead of the best loop (%s, %.2f): %.2fx", bestName, bestLoop, tr/bestLoop)},
			{"wal", wr <= goalWAL, fmt.Sprintf("WAL ratio %.2f (goal <= %.1f)", wr, goalWAL)},
			{"batch", d.longest <= 2*target, fmt.Sprintf("longest batch %s (goal <= 2 x BATCH_TARGET = %s)", d.longest.Round(time.Millisecond), 2*target)},
		}
		for _, g := range goals {
			if g.ok {
				met[g.name]++
			}
			fmt.Fprintf(w, "  %s %s\n", g.text, benchdata.Verdict(g.ok))
		}
		// CPU seconds are less disturbed than wall time by other load on a
		// shared machine: they say whether a missed goal is noise. The
		// daemon's include its own process; the others have none.
		if base, ok := res[baselineName]; ok {
			br := float64(expired) / base.wall.Seconds() / ur
			fmt.Fprintf(w, "  baseline (%s): throughput ratio %.2f, ahead of the best loop %.2fx, longest batch %s; this build ÷ baseline %.2f\n",
				b.o.Baseline, br, br/bestLoop, base.longest.Round(time.Millisecond), tr/br)
		}
		if p, ok := res[runPassName]; ok {
			pr := float64(expired) / p.wall.Seconds() / ur
			if pr >= l.goal {
				met["run pass throughput"]++
			}
			if pr > bestLoop {
				met["run pass ahead"]++
			}
			if p.longest <= 2*target {
				met["run pass batch"]++
			}
			fmt.Fprintf(w, "  %s: throughput ratio %.2f (goal >= %.2f), ahead of the best loop %.2fx, longest batch %s; once ÷ run pass %.2f\n",
				runPassName, pr, l.goal, pr/bestLoop, p.longest.Round(time.Millisecond), tr/pr)
		}
		lc := slices.MinFunc(methods[2:], func(a, b method) int { return cmp.Compare(res[a.name].cpu, res[b.name].cpu) })
		fmt.Fprintf(w, "  CPU seconds: inboxkeeper %.2f, unbounded %.2f (ratio %.2f), least of the loops %.2f (%s, ratio %.2f)\n",
			d.cpu.Seconds(), u.cpu.Seconds(), d.cpu.Seconds()/u.cpu.Seconds(), res[lc.name].cpu.Seconds(), lc.name,
			d.cpu.Seconds()/res[lc.name].cpu.Seconds())
		if share, ok := steal(); ok {
			// A rep whose figures all drop says why here.
			fmt.Fprintf(w, "  CPU steal: %.1f%% of the machine's CPU time during the rep (/proc/stat: the hypervisor running other guests)\n", 100*share)
		}
	}
	fmt.Fprintf(w, "%s over %d reps: throughput goal met %d, ahead of the best loop %d, WAL goal met %d, batch goal met %d\n",
		l.name, b.o.Reps, met["throughput"], met["ahead"], met["wal"], met["batch"])
	if b.o.runPass {
		fmt.Fprintf(w, "%s over %d reps, %s: throughput goal met %d, ahead of the best loop %d, batch goal met %d\n",
			l.name, b.o.Reps, runPassName, met["run pass throughput"], met["run pass ahead"], met["run pass batch"])
	}
	if b.o.Keep {
		return rss, nil
	}
	_, err = b.pool.Exec(ctx, "DROP DATABASE "+tpl)
	return rss, err
}

func perRow(n, rows int64) float64 {
	if rows == 0 {
		return 0
	}
	return float64(n) / float64(rows)
}

// batchTarget is the daemon's BATCH_TARGET: from the environment, which
// reaches the daemon, or its default.
func batchTarget() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("INBOXKEEPER_BATCH_TARGET")); err == nil && d > 0 {
		return d
	}
	return 200 * time.Millisecond
}

// prepare (re)creates database db with the control schema, the loop
// procedure, pg_stat_statements and a table inbox of n rows in layout l
// (expired of them expired, for the horizons kind); it returns the rows
// the table holds and how many of them are expired.
func (b *bench) prepare(ctx context.Context, db string, l benchdata.Layout, payload bool, n, expired int64) (rows, due int64, err error) {
	if _, err := b.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		return 0, 0, err
	}
	if _, err := b.pool.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return 0, 0, err
	}
	// migrate reads no policy, but the configuration must name one.
	if _, err := b.inboxkeeper(ctx, b.Bin, db, filepath.Join(b.Dir, "none.yaml"), "migrate"); err != nil {
		return 0, 0, err
	}
	b.Logf("filling %s with %d rows", db, n)
	err = b.inDB(ctx, db, func(conn *pgx.Conn) error {
		var err error
		if rows, due, err = benchdata.FillLayout(ctx, conn, "inbox", payload, n, expired, b.now(ctx), l); err != nil {
			return err
		}
		_, err = conn.Exec(ctx, loopProcedure+"; CREATE EXTENSION pg_stat_statements")
		return err
	})
	return rows, due, err
}

// copyDB makes db a file copy of tpl: the same pages, so every method
// starts from the same physical layout.
func (b *bench) copyDB(ctx context.Context, tpl, db string) error {
	if _, err := b.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY", db, tpl))
	return err
}

// methodURL is the URL the methods connect to db with: through the relay
// with -relay.
func (b *bench) methodURL(db string) string {
	if b.relay == nil {
		return b.cluster.URL(db)
	}
	return b.relay.URL(b.cluster.URL(db))
}

func (b *bench) inDB(ctx context.Context, db string, fn func(*pgx.Conn) error) error {
	return b.connectTo(ctx, b.cluster.URL(db), fn)
}

// inMethodDB is inDB on the methods' URL (methodURL).
func (b *bench) inMethodDB(ctx context.Context, db string, fn func(*pgx.Conn) error) error {
	return b.connectTo(ctx, b.methodURL(db), fn)
}

func (b *bench) connectTo(ctx context.Context, u string, fn func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}

// daemon runs `inboxkeeper once` on table in db after a checkpoint.
func (b *bench) daemon(ctx context.Context, db, table string) (result, error) {
	return b.daemonBin(ctx, b.Bin, db, table)
}

// daemonBin is daemon with the binary bin.
func (b *bench) daemonBin(ctx context.Context, bin, db, table string) (result, error) {
	policy := filepath.Join(b.Dir, db+".yaml")
	if err := benchdata.WritePolicy(policy, table); err != nil {
		return result{}, err
	}
	lsn, cpu, err := b.before(ctx)
	if err != nil {
		return result{}, err
	}
	r, err := b.inboxkeeper(ctx, bin, db, policy, "once")
	if err != nil {
		return r, err
	}
	b.awaitBackendsGone(db)
	cpu2, err := b.serverCPU()
	if err != nil {
		return r, err
	}
	r.cpu += cpu2 - cpu
	if r.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return r, err
	}
	r.pages, r.dirtied, err = b.pages(ctx, db)
	return r, err
}

// before is what a measurement through b.pool starts from: a checkpoint's
// WAL position, pg_stat_statements emptied, and the server's CPU time so
// far.
func (b *bench) before(ctx context.Context) (lsn string, cpu time.Duration, err error) {
	if lsn, err = benchdata.Checkpoint(ctx, b.pool); err != nil {
		return "", 0, err
	}
	if err := b.resetPages(ctx); err != nil {
		return "", 0, err
	}
	cpu, err = b.serverCPU()
	return lsn, cpu, err
}

// resetPages empties pg_stat_statements before a measurement.
func (b *bench) resetPages(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// pages is the shared buffers read (hits and reads) and dirtied by the
// statements run in db since resetPages.
func (b *bench) pages(ctx context.Context, db string) (read, dirtied int64, err error) {
	err = b.pool.QueryRow(ctx, `SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint, coalesce(sum(shared_blks_dirtied), 0)::bigint
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1`, db).Scan(&read, &dirtied)
	return read, dirtied, err
}

// statement runs sql in db after a checkpoint, on a connection opened
// before it, or with -from-exec through psql.
func (b *bench) statement(ctx context.Context, db, sql string) (result, error) {
	if b.o.fromExec {
		return b.statementExec(ctx, db, sql)
	}
	var r result
	err := b.inMethodDB(ctx, db, func(conn *pgx.Conn) error {
		lsn, err := benchdata.Checkpoint(ctx, conn)
		if err != nil {
			return err
		}
		if err := b.resetPages(ctx); err != nil {
			return err
		}
		cpu, err := b.serverCPU()
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		r.wall = time.Since(start)
		cpu2, err := b.serverCPU()
		if err != nil {
			return err
		}
		r.cpu = cpu2 - cpu
		if r.wal, err = benchdata.WALSince(ctx, conn, lsn); err != nil {
			return err
		}
		r.pages, r.dirtied, err = b.pages(ctx, db)
		return err
	})
	return r, err
}

// psql is the cluster's psql.
func (b *bench) psql() string { return filepath.Join(b.cluster.BinDir, "psql") }

// statementExec runs sql in db after a checkpoint, through psql, timed from
// exec to exit as the daemon's once is: what cron pays for the statement,
// with psql's start and its connection.
func (b *bench) statementExec(ctx context.Context, db, sql string) (result, error) {
	var r result
	lsn, cpu, err := b.before(ctx)
	if err != nil {
		return r, err
	}
	cmd := exec.CommandContext(ctx, b.psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", b.methodURL(db), "-c", sql)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r.wall = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("psql -c %q: %w: %s", sql, err, out)
	}
	b.awaitBackendsGone(db)
	cpu2, err := b.serverCPU()
	if err != nil {
		return r, err
	}
	r.cpu = cpu2 - cpu + cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if r.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return r, err
	}
	r.pages, r.dirtied, err = b.pages(ctx, db)
	return r, err
}

func (b *bench) now(ctx context.Context) time.Time {
	var t time.Time
	if err := b.pool.QueryRow(ctx, "SELECT now()").Scan(&t); err != nil {
		return time.Now() // only a reference point; the data stays consistent
	}
	return t
}

// daemonSettings are the daemon settings the benchmark sets itself.
func (b *bench) daemonSettings(db, policy string) []string {
	// No VACUUM after the pass (the daemon's, at a tenth of the table
	// dead): the unbounded DELETE and the loops leave their dead tuples to
	// autovacuum too, and a VACUUM of half the heap is not deleting.
	return append(benchdata.DaemonSettings(b.methodURL(db), policy, b.o.batch), "INBOXKEEPER_VACUUM_DEAD_RATIO=0")
}

// inboxkeeper runs the built binary and measures wall time and peak RSS.
// The other INBOXKEEPER_* variables of the environment reach it.
func (b *bench) inboxkeeper(ctx context.Context, bin, db, policy string, args ...string) (result, error) {
	p, err := benchdata.RunBinary(ctx, bin, benchdata.DaemonEnv(true, b.daemonSettings(db, policy)...), args...)
	return result{wall: p.Wall, cpu: p.CPU, rss: p.RSS, batches: benchdata.DoneBatches(p.Output), longest: benchdata.LongestBatch(p.Output),
		swept: sweptBatches(p.Output)}, err
}

// sweptBatchesRE finds how many batches of the pass swept the heap
// (expiry/sweep.go) in the daemon's "table done" log line.
var sweptBatchesRE = regexp.MustCompile(`expiry: table done.*?\bsweep_batches"?[=:]"?([0-9]+)`)

// sweptBatches is how many batches the daemon's log says swept, -1 when it
// does not say (a daemon from before the sweep).
func sweptBatches(output string) int {
	m := sweptBatchesRE.FindStringSubmatch(output)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func batches(r result, rows int64) string {
	if r.batches == 0 {
		return ""
	}
	how := ""
	switch {
	case r.swept > 0:
		how = ", swept"
	case r.swept == 0:
		how = ", expiry order"
	}
	return fmt.Sprintf("%d batches, avg %d rows%s", r.batches, rows/int64(r.batches), how)
}

// awaitBackendsGone waits, for at most 5 s, until no backend of db is left
// among the processes: a client that exits does not wait for its backend,
// whose CPU time reaches the postmaster's (serverCPU) only once it has been
// reaped. Read at once after psql exited, the unbounded DELETE's backend was
// still there and the server's CPU came out at 0.02 s.
func (b *bench) awaitBackendsGone(db string) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !b.backendOf(db) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// backendOf says whether a process titled as a backend of db exists
// ("postgres: USER DB HOST(PORT) STATE").
func (b *bench) backendOf(db string) bool {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, path := range cmdlines {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		f := strings.Fields(strings.ReplaceAll(string(data), "\x00", " "))
		if len(f) >= 3 && f[0] == "postgres:" && f[2] == db {
			return true
		}
	}
	return false
}

// serverCPU is the CPU time the cluster has used so far: the postmaster and
// its live children, plus, in the postmaster's cutime and cstime, every child
// that has exited, such as the daemon's backends. It reads Linux's /proc
// and assumes 100 clock ticks a second.
func (b *bench) serverCPU() (time.Duration, error) {
	pid, err := os.ReadFile(filepath.Join(b.cluster.DataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("server CPU time: %w", err)
	}
	pm, _, _ := strings.Cut(string(pid), "\n")
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, path := range stats {
		data, err := os.ReadFile(path)
		f := benchdata.StatFields(data)
		if err != nil || f == nil {
			continue // gone meanwhile
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
