// Command throttle benchmarks the replica-lag throttle: how far a slow
// standby falls behind while the daemon deletes a backlog throttled at
// MAX_REPLICA_LAG, against one unbounded DELETE of an identical copy and
// against the daemon unthrottled, side by side in one run (on a shared
// machine only the comparison means anything).
//
//	go run ./bench/throttle                    # 2M rows per table, 1M expired
//	go run ./bench/throttle -rows 500000 -apply-rate 16
//	go run ./bench/throttle -rows 1000000 -apply-rate 4 -max-lag 2s -reps 2 -references=false -baseline /tmp/inboxkeeper-main
//
// It builds cmd/inboxkeeper, starts a durable throwaway primary and a
// streaming standby (pg_basebackup -R), fills identical inbox tables, and
// then, each right after a CHECKPOINT and with the standby caught up:
//
//	A: `inboxkeeper once` on a with REPLICA_URLS=<standby>, MAX_REPLICA_LAG=-max-lag
//	   (with -baseline, the other build the same way on d, in a database of its own)
//	B: DELETE FROM b WHERE remember_until <= now()
//	C: `inboxkeeper once` on c with no standby listed and the pg_stat_replication
//	   thresholds out of reach (24h, 1TB): that signal throttles even without
//	   REPLICA_URLS, and C is the unthrottled reference. Its WAL window is a
//	   day of apply, so only the slow start (the window grows by what the
//	   standby replays until its apply rate is measured) paces its first
//	   moments.
//
// How the standby is slowed: a governor (internal/testkit/standby) caps
// its apply rate at -apply-rate MB/s of WAL by pausing replay whenever it
// gets ahead of that budget; left alone, the standby here replays a DELETE
// at about 200 MB/s and never lags. With a WAL budget a deletion's lag is
// about its WAL over the rate on any machine, and an idle primary's
// heartbeats are never held back, so the baseline lag (the first report
// line) is only the sampler's granularity, 50 to 100 ms.
//
// The lag is measured the way the daemon measures it, but independently of
// it and all the time: the test kit's sampler updates its own heartbeat row
// on the primary every 50 ms and reads its age on the standby every 50 ms;
// it also reads replay_lag and the replay position's distance in bytes
// from pg_stat_replication, for context. A phase's peak lag is the highest
// reading from its start until the standby has caught up again, because
// the peak of an unbounded DELETE comes after the statement ends.
//
// A pass of the daemon ends with its VACUUM of the table (half of it is
// dead), which is part of what is measured: its time, how it was paced,
// and its share of the WAL are in the details. -baseline PATH runs another
// build of the daemon (main's, say) throttled in the same way on a fourth
// identical table, in the same reps: right after this build, and right
// before it in every other rep. -reps N fills the tables again for each
// rep. -references=false leaves out the unbounded DELETE and the
// unthrottled daemon (each needs the standby to replay its WAL at the
// capped rate: a minute at 4 MB/s for -rows 1000000).
//
// The goals: the throttled daemon's peak lag stays within 1.5 x
// MAX_REPLICA_LAG from the first batch on, and its time within 1.3 x its WAL
// over the apply cap: it uses the standby fully without queueing more than
// the lag allows. Both are printed with their ratios. The longest batch is
// timed from the daemon's debug log (from the previous batch line, or from
// the "throttle: resuming" line after a pause, to the batch's own line). The
// program exits non-zero when a phase does not delete exactly the expired
// rows; a missed goal is printed (GOAL MISSED), not fatal. Both goals are
// judged for the baseline too, for comparison.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/standby"
)

// The goals: the throttled peak lag within goalLag x
// MAX_REPLICA_LAG, and the throttled time within goalTime x the time the
// standby needs to apply the run's WAL at its capped rate.
const (
	goalLag  = 1.5
	goalTime = 1.3
)

type options struct {
	benchdata.Common // -baseline: another inboxkeeper binary, run throttled beside this build
	rows             int
	maxLag           time.Duration
	applyRate        float64 // MB/s of WAL the standby may apply; 0 leaves it alone
	references       bool    // the unbounded DELETE and the unthrottled daemon too
	logs             string  // directory for the daemon's logs; empty: not kept
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("throttle", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 2_000_000, "rows in each table; half of them expired")
	fs.DurationVar(&o.maxLag, "max-lag", time.Second, "the throttled daemon's INBOXKEEPER_MAX_REPLICA_LAG")
	fs.Float64Var(&o.applyRate, "apply-rate", 8, "MB/s of WAL the standby may apply; 0 does not slow it")
	fs.BoolVar(&o.references, "references", true, "also measure one unbounded DELETE and the daemon unthrottled")
	o.Define(fs, 1, "repetitions, each on tables filled again; with -baseline the two builds take turns to go first", "leave both clusters running and print their URLs",
		"another inboxkeeper binary (e.g. main's build) run throttled the same way, in a database of its own that it migrates (a build refuses a newer control schema), in the same reps")
	fs.StringVar(&o.logs, "logs", "", "write the daemon's debug logs to `dir`/<table>-<rep>.log")
	return benchdata.Main(fs, args, &o.Common, func() error {
		return benchdata.WantFlags(fs, o.rows < 2 || o.maxLag <= 0 || o.applyRate < 0, "-rows >= 2, -max-lag > 0, -apply-rate >= 0")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	benchdata.Bench
	o              options
	url            string // the primary
	baseURL        string // with -baseline: its database on the primary
	baseStandbyURL string // and on the standby
	standbyURL     string
	pool           *pgxpool.Pool // the primary
	basePool       *pgxpool.Pool // with -baseline: its database, which its own build migrated
	standby        *pgxpool.Pool
	lag            *standby.Sampler
	gov            *standby.Governor // nil while replay runs free (the fills)
	baseline       float64           // seconds: the median lag of the idle, caught-up pair
	rep            int
}

// phase is one measured deletion.
type phase struct {
	wall    time.Duration
	wal     int64 // bytes, the whole cluster's
	peak    standby.Peaks
	catchUp time.Duration // from the end of the deletion until the standby caught up
	log     daemonLog     // the daemon's phases only
	// steal: the share of the machine's CPU time the hypervisor gave
	// other guests from the deletion's start until the standby caught up
	// (valid where /proc/stat was read).
	steal      float64
	stealValid bool
}

// The phases of a rep, and the table each deletes from.
const (
	thisBuild     = "this build"
	baselineBuild = "baseline"
	unboundedName = "unbounded DELETE"
	freeName      = "unthrottled"
)

var tableOf = map[string]string{thisBuild: "a", unboundedName: "b", freeName: "c", baselineBuild: "d"}

func benchmark(ctx context.Context, o options, w io.Writer) error {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-bench-throttle-")
	if err != nil {
		return err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o}

	// The standby comes first, so it replays the fills and ends up with the
	// same pages.
	pair, end, err := benchdata.StartPair(ctx, b.Progress, benchdata.ClusterSettings("1GB", nil), o.Keep, w)
	if err != nil {
		return err
	}
	defer end()
	c, s := pair.Primary, pair.Standby
	b.url, b.standbyURL, b.pool, b.standby = pair.URL, pair.StandbyURL, pair.PrimaryPool, pair.StandbyPool
	// migrate reads no policy, but the configuration must name one.
	if _, err := b.inboxkeeper(ctx, b.Bin, b.url, filepath.Join(b.Dir, "none.yaml"), nil, "migrate"); err != nil {
		return err
	}
	// The baseline's control schema is its own build's: a build refuses a
	// schema newer than it knows.
	if o.Baseline != "" {
		if _, err := b.pool.Exec(ctx, "CREATE DATABASE "+baselineDB); err != nil {
			return err
		}
		b.baseURL, b.baseStandbyURL = c.URL(baselineDB), s.URL(baselineDB)
		if b.basePool, err = pgxpool.New(ctx, b.baseURL); err != nil {
			return err
		}
		defer b.basePool.Close()
		if _, err := b.inboxkeeper(ctx, o.Baseline, b.baseURL, filepath.Join(b.Dir, "none.yaml"), nil, "migrate"); err != nil {
			return err
		}
	}
	if b.lag, err = standby.StartSampler(ctx, b.url, b.standbyURL, b.Logf); err != nil {
		return err
	}
	defer b.lag.Stop()
	defer b.uncap() // replay runs free again before -keep leaves it

	phases := []string{thisBuild}
	if o.Baseline != "" {
		phases = append(phases, baselineBuild)
	}
	if o.references {
		phases = append(phases, unboundedName, freeName)
	}
	total, expired := int64(o.rows), int64(o.rows/2)
	benchdata.Header(w, "bench/throttle", o.Flags)
	var results []map[string]phase
	for b.rep = 1; b.rep <= o.Reps; b.rep++ {
		if err := b.fill(ctx, w, phases, total, expired); err != nil {
			return err
		}
		order := slices.Clone(phases)
		if o.Baseline != "" && b.rep%2 == 0 {
			order[0], order[1] = order[1], order[0]
		}
		res := map[string]phase{}
		for _, name := range order {
			if res[name], err = b.measure(ctx, name, total, expired); err != nil {
				return err
			}
		}
		results = append(results, res)
		b.report(w, res, order, expired)
	}
	if o.Reps > 1 || o.Baseline != "" {
		b.summary(w, results)
	}
	if n := b.lag.Errors(); n > 0 {
		fmt.Fprintf(w, "the sampler had %d failed reads or writes (see stderr)\n", n)
	}
	b.Logf("done")
	return nil
}

// fill makes a table for each phase from the same rows, with replay
// running free, waits for the standby to replay them, and caps its apply
// rate again. The first time, it also measures what "caught up" looks
// like and says so in the report.
func (b *bench) fill(ctx context.Context, w io.Writer, phases []string, total, expired int64) error {
	b.uncap()
	var t0 time.Time
	if err := b.pool.QueryRow(ctx, "SELECT now()").Scan(&t0); err != nil {
		return err
	}
	var tables, baseTables []benchdata.Table
	for _, p := range phases {
		if p == baselineBuild {
			baseTables = append(baseTables, benchdata.Table{Name: tableOf[p], Payload: true})
		} else {
			tables = append(tables, benchdata.Table{Name: tableOf[p], Payload: true})
		}
	}
	if err := benchdata.Parallel(
		func() error { return benchdata.FillAll(ctx, b.pool, b.Progress, tables, total, expired, t0) },
		func() error { return benchdata.FillAll(ctx, b.basePool, b.Progress, baseTables, total, expired, t0) },
	); err != nil {
		return err
	}
	var heap, idx int64
	if err := b.pool.QueryRow(ctx, `SELECT pg_relation_size('a'), pg_indexes_size('a')`).Scan(&heap, &idx); err != nil {
		return err
	}
	for _, t := range append(tables, baseTables...) {
		var size int64
		if err := b.poolOf(t.Name).QueryRow(ctx, `SELECT pg_relation_size($1)`, t.Name).Scan(&size); err != nil {
			return err
		}
		if size != heap {
			return fmt.Errorf("the tables should be identical, but a has %d bytes and %s %d", heap, t.Name, size)
		}
	}
	b.Logf("waiting for the standby to replay the fill")
	if err := standby.WaitCaughtUp(ctx, b.url, b.standbyURL, 20*time.Minute); err != nil {
		return err
	}
	if b.o.applyRate > 0 {
		b.gov = standby.CapApply(ctx, b.standbyURL, b.o.applyRate*(1<<20), b.Logf)
	}
	if b.rep > 1 {
		return nil
	}
	// What "caught up" looks like, once the readings no longer see the
	// row as the fill left it.
	baseline, lo, hi, err := b.lag.Idle(ctx)
	if err != nil {
		return err
	}
	b.baseline = baseline
	b.Logf("baseline lag %.3f s (idle readings %.3f to %.3f s)", b.baseline, lo, hi)
	slowed := "nothing (-apply-rate 0)"
	if b.o.applyRate > 0 {
		slowed = fmt.Sprintf("apply capped at %g MB/s of WAL (replay paused whenever it gets ahead)", b.o.applyRate)
	}
	fmt.Fprintf(w, "standby apply slowed by: %s (baseline lag %.2f s, the median of 2 s idle; at most %.2f s)\n", slowed, b.baseline, hi)
	fmt.Fprintf(w, "rows: %d total, %d expired; each table %.0f MB heap + %.0f MB indexes; %d reps\n", total, expired, benchdata.MB(heap), benchdata.MB(idx), b.o.Reps)
	if b.o.Baseline != "" {
		fmt.Fprintf(w, "baseline: %s, throttled as this build, in a database of its own that it migrated\n", b.o.Baseline)
	}
	return nil
}

// uncap lets replay run free.
func (b *bench) uncap() {
	if b.gov != nil {
		b.gov.Stop()
		b.gov = nil
	}
}

// measure runs one phase's deletion after a CHECKPOINT with the standby
// caught up, and keeps sampling the lag until the standby has caught up
// again.
func (b *bench) measure(ctx context.Context, name string, total, expired int64) (phase, error) {
	var p phase
	if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return p, err
	}
	if err := b.waitReplay(ctx, b.baseline+0.1); err != nil {
		return p, err
	}
	lsn, err := benchdata.InsertLSN(ctx, b.pool)
	if err != nil {
		return p, err
	}
	b.Logf("rep %d: %s on %s", b.rep, name, tableOf[name])
	b.lag.Take()
	if b.gov != nil {
		b.gov.Take()
	}
	steal := benchdata.Steal()
	table := tableOf[name]
	maxLag := "INBOXKEEPER_MAX_REPLICA_LAG=" + b.o.maxLag.String()
	switch name {
	case thisBuild:
		p.wall, p.log, err = b.daemon(ctx, b.Bin, table, total, expired, "INBOXKEEPER_REPLICA_URLS="+b.standbyURL, maxLag)
	case baselineBuild:
		// Its standby URL names its own database, where its heartbeats go.
		p.wall, p.log, err = b.daemon(ctx, b.o.Baseline, table, total, expired, "INBOXKEEPER_REPLICA_URLS="+b.baseStandbyURL, maxLag)
	case unboundedName:
		p.wall, err = b.unbounded(ctx, table, total, expired)
	case freeName:
		// No standby listed and the pg_stat_replication thresholds out
		// of reach: only the slow start paces its first moments.
		p.wall, p.log, err = b.daemon(ctx, b.Bin, table, total, expired, "INBOXKEEPER_MAX_REPLICA_LAG=24h", "INBOXKEEPER_MAX_REPLICA_LAG_BYTES=1TB")
	}
	if err != nil {
		return p, err
	}
	if p.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return p, err
	}
	b.Logf("%.1f s, %.0f MB of WAL; waiting for the standby", p.wall.Seconds(), benchdata.MB(p.wal))
	ended := time.Now()
	if err := b.waitReplay(ctx, b.baseline+0.1); err != nil {
		return p, err
	}
	p.catchUp = time.Since(ended)
	p.steal, p.stealValid = steal()
	p.peak = b.lag.Take()
	var held, gap time.Duration
	if b.gov != nil {
		held, gap = b.gov.Take()
	}
	b.Logf("peak lag %.2f s, caught up after %.1f s; the governor held replay for %.1f s, longest between two polls %v",
		p.peak.Lag, p.catchUp.Seconds(), held.Seconds(), gap.Round(time.Millisecond))
	return p, nil
}

// goals judges a throttled phase: its peak lag against goalLag x
// MAX_REPLICA_LAG, and its time against goalTime x its WAL over the apply
// cap (0 without a cap).
func (b *bench) goals(p phase) (lagRatio, timeRatio float64, met bool) {
	lagRatio = p.peak.Lag / b.o.maxLag.Seconds()
	met = lagRatio <= goalLag
	if b.o.applyRate > 0 {
		timeRatio = p.wall.Seconds() / (float64(p.wal) / (b.o.applyRate * (1 << 20)))
		met = met && timeRatio <= goalTime
	}
	return lagRatio, timeRatio, met
}

// report prints one rep.
func (b *bench) report(w io.Writer, res map[string]phase, order []string, expired int64) {
	maxLag := b.o.maxLag.String()
	rate := func(p phase) float64 { return float64(expired) / p.wall.Seconds() }
	fmt.Fprintf(w, "rep %d of %d (%s first):\n", b.rep, b.o.Reps, order[0])
	names := map[string]string{thisBuild: "daemon, throttled at " + maxLag + ":", baselineBuild: "baseline, throttled at " + maxLag + ":",
		unboundedName: "unbounded DELETE:", freeName: "daemon, unthrottled:"}
	for _, name := range []string{thisBuild, baselineBuild, unboundedName, freeName} {
		p, ok := res[name]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "  %-28s peak lag %5.2f s   time %5.1f s", names[name], p.peak.Lag, p.wall.Seconds())
		if name != unboundedName {
			fmt.Fprintf(w, " %7.0f rows/s", rate(p))
		}
		fmt.Fprintln(w)
	}
	bound := goalLag * b.o.maxLag.Seconds()
	for _, name := range []string{thisBuild, baselineBuild} {
		p, ok := res[name]
		if !ok {
			continue
		}
		lr, tr, _ := b.goals(p)
		fmt.Fprintf(w, "  %s: goal 1: throttled peak lag <= %.1f x %s = %.2f s: peak %.2f s (%.2f x max-lag): %s",
			name, goalLag, maxLag, bound, p.peak.Lag, lr, benchdata.Verdict(lr <= goalLag))
		if unb, ok := res[unboundedName]; ok && name == thisBuild {
			fmt.Fprintf(w, "; unbounded above it: %s", yesNo(unb.peak.Lag > bound))
		}
		fmt.Fprintln(w)
		if b.o.applyRate > 0 {
			floor := float64(p.wal) / (b.o.applyRate * (1 << 20))
			fmt.Fprintf(w, "  %s: goal 2: throttled time <= %.1f x its WAL / apply cap (%.0f MB / %g MB/s = %.1f s): time %.1f s (%.2f x): %s\n",
				name, goalTime, benchdata.MB(p.wal), b.o.applyRate, floor, p.wall.Seconds(), tr, benchdata.Verdict(tr <= goalTime))
		}
	}
	if free, ok := res[freeName]; ok {
		fmt.Fprintf(w, "  throughput throttled/unthrottled: %.2f\n", rate(res[thisBuild])/rate(free))
	}
	fmt.Fprintln(w, "  details (WAL of the whole cluster; replay_lag and bytes behind from pg_stat_replication; catch-up from the end of the deletion):")
	for _, name := range []string{thisBuild, baselineBuild, unboundedName, freeName} {
		if p, ok := res[name]; ok {
			b.detail(w, name+":", p)
		}
	}
}

// detail prints a phase's details.
func (b *bench) detail(w io.Writer, name string, p phase) {
	fmt.Fprintf(w, "    %-12s WAL %4.0f MB, peak replay_lag %5.2f s, peak %4.0f MB behind, catch-up %5.1f s",
		name, benchdata.MB(p.wal), p.peak.ReplayLag, benchdata.MB(p.peak.Bytes), p.catchUp.Seconds())
	if p.stealValid {
		// Other guests' load on the host, which the standby's replay
		// and the daemon share with them.
		fmt.Fprintf(w, ", CPU steal %.1f%%", 100*p.steal)
	}
	fmt.Fprintln(w)
	l := p.log
	if l.batches == 0 {
		return
	}
	perRow := p.wal / max(l.rows, 1) // FPIs and the VACUUM included: the run's average
	fmt.Fprintf(w, "    %-12s %d batches of up to %d rows (~%.1f MB of WAL", "", l.batches, l.maxRows, benchdata.MB(perRow*l.maxRows))
	if b.o.applyRate > 0 {
		fmt.Fprintf(w, ", %.2f s of apply", benchdata.MB(perRow*l.maxRows)/b.o.applyRate)
	}
	fmt.Fprintf(w, "), longest %.2f s; paused %d times, %.1f s in all", l.longest.Seconds(), l.pauses, l.paused.Seconds())
	if len(l.kinds) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(l.kinds, ", "))
	}
	fmt.Fprintln(w)
	switch {
	case l.vacuum == 0:
		fmt.Fprintf(w, "    %-12s no VACUUM logged (this build logs one at info only when paced; run with -logs to see the debug log)\n", "")
	case l.pace != "":
		fmt.Fprintf(w, "    %-12s VACUUM %.1f s, paced %s; stopped %d times\n", "", l.vacuum.Seconds(), l.pace, l.stops)
	default:
		fmt.Fprintf(w, "    %-12s VACUUM %.1f s, unpaced\n", "", l.vacuum.Seconds())
	}
}

// summary prints the goals over every rep, for this build and the
// baseline.
func (b *bench) summary(w io.Writer, results []map[string]phase) {
	for _, name := range []string{thisBuild, baselineBuild} {
		var lags, times []float64
		met := 0
		for _, res := range results {
			p, ok := res[name]
			if !ok {
				continue
			}
			lr, tr, ok := b.goals(p)
			lags, times = append(lags, lr), append(times, tr)
			if ok {
				met++
			}
		}
		if len(lags) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s over %d reps: peak lag %s x max-lag, time %s x WAL / apply cap; both goals met in %d\n",
			name, len(lags), span(lags), span(times), met)
	}
}

// span is "lo to hi" of vs, or the one value.
func span(vs []float64) string {
	lo, hi := slices.Min(vs), slices.Max(vs)
	if lo == hi {
		return fmt.Sprintf("%.2f", lo)
	}
	return fmt.Sprintf("%.2f to %.2f", lo, hi)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func (b *bench) verify(ctx context.Context, table string, n, expired int64) error {
	return benchdata.Verify(ctx, b.poolOf(table), table, n, expired)
}

// baselineDB is the baseline's database.
const baselineDB = "baseline"

// poolOf is the pool of table's database.
func (b *bench) poolOf(table string) *pgxpool.Pool {
	if table == tableOf[baselineBuild] {
		return b.basePool
	}
	return b.pool
}

// waitReplay waits until the standby has replayed everything the primary
// has written so far and, when lagBelow > 0, the sampler reads a lag under
// it.
func (b *bench) waitReplay(ctx context.Context, lagBelow float64) error {
	if err := standby.WaitCaughtUp(ctx, b.url, b.standbyURL, 20*time.Minute); err != nil {
		return err
	}
	for lagBelow > 0 && b.lag.Latest() >= lagBelow {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(standby.SampleEvery):
		}
	}
	return nil
}

// daemon runs `inboxkeeper once` of bin on table with the extra
// environment.
func (b *bench) daemon(ctx context.Context, bin, table string, n, expired int64, env ...string) (time.Duration, daemonLog, error) {
	policy := filepath.Join(b.Dir, table+".yaml")
	if err := benchdata.WritePolicy(policy, table); err != nil {
		return 0, daemonLog{}, err
	}
	start := time.Now()
	url := b.url
	if table == tableOf[baselineBuild] {
		url = b.baseURL
	}
	out, err := b.inboxkeeper(ctx, bin, url, policy, env, "once")
	wall := time.Since(start)
	if b.o.logs != "" {
		if err := os.WriteFile(filepath.Join(b.o.logs, fmt.Sprintf("%s-%d.log", table, b.rep)), []byte(out), 0o644); err != nil {
			return wall, daemonLog{}, err
		}
	}
	if err != nil {
		return wall, daemonLog{}, err
	}
	l := parseLog(out)
	if l.rows != expired {
		return wall, l, fmt.Errorf("inboxkeeper once on %s logged %d deleted rows in batches, want %d", table, l.rows, expired)
	}
	return wall, l, b.verify(ctx, table, n, expired)
}

// unbounded deletes every expired row of table in one statement.
func (b *bench) unbounded(ctx context.Context, table string, n, expired int64) (time.Duration, error) {
	start := time.Now()
	tag, err := b.pool.Exec(ctx, "DELETE FROM "+table+" WHERE remember_until <= now()")
	wall := time.Since(start)
	if err != nil {
		return wall, fmt.Errorf("unbounded DELETE: %w", err)
	}
	if tag.RowsAffected() != expired {
		return wall, fmt.Errorf("unbounded DELETE on %s deleted %d rows, want %d", table, tag.RowsAffected(), expired)
	}
	return wall, b.verify(ctx, table, n, expired)
}

// inboxkeeper runs bin with a clean INBOXKEEPER_* environment (it rejects
// unknown variables) at debug level, and returns its output.
func (b *bench) inboxkeeper(ctx context.Context, bin, url, policy string, env []string, args ...string) (string, error) {
	set := append(benchdata.DaemonSettings(url, policy, 0), "INBOXKEEPER_LOG_LEVEL=debug")
	set = append(set, env...)
	p, err := benchdata.RunBinary(ctx, bin, benchdata.DaemonEnv(false, set...), args...)
	return p.Output, err
}

// daemonLog is what the daemon's debug log says about a pass.
type daemonLog struct {
	batches int
	rows    int64 // deleted, summed over the batch lines
	maxRows int64
	longest time.Duration
	pauses  int
	paused  time.Duration
	kinds   []string      // throttle reasons, in order of first appearance
	vacuum  time.Duration // the VACUUM that ran after the pass, as it says
	pace    string        // how it was paced for the standby; empty: unpaced
	stops   int           // paced VACUUMs the throttle stopped
}

var (
	logLine  = regexp.MustCompile(`^time=(\S+) level=\S+ msg="([^"]*)"(.*)$`)
	logField = regexp.MustCompile(`\b(deleted|kind|took)=(\S+)`)
	logPace  = regexp.MustCompile(`\bpace="([^"]*)"`)
)

// parseLog times each batch from the line before it that let it start (the
// previous batch line, or "throttle: resuming" after a pause) to its own
// line. A batch line is written right after the commit and the throttle is
// consulted right before the next batch, so the span is the batch and no
// waiting. The first batch has no such line before it and is not timed.
func parseLog(out string) daemonLog {
	var l daemonLog
	var mark, pausedAt time.Time // mark: when the next batch may have started
	throttled := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := logLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		fields := map[string]string{}
		for _, f := range logField.FindAllStringSubmatch(m[3], -1) {
			fields[f[1]] = f[2]
		}
		switch m[2] {
		case "expiry: batch":
			n, _ := strconv.ParseInt(fields["deleted"], 10, 64)
			if n > 0 {
				l.batches++
				l.rows += n
				l.maxRows = max(l.maxRows, n)
			}
			if !mark.IsZero() && !throttled {
				l.longest = max(l.longest, at.Sub(mark))
			}
			mark = at
		case "throttle: pausing", "throttle: still pausing":
			if k := fields["kind"]; !slices.Contains(l.kinds, k) {
				l.kinds = append(l.kinds, k)
			}
			if !throttled {
				l.pauses++
				pausedAt = at
			}
			throttled = true
		case "throttle: resuming":
			if throttled {
				l.paused += at.Sub(pausedAt)
			}
			throttled = false
			mark = at
		case "vacuum: done", "vacuum: done, paced for the standby":
			l.vacuum, _ = time.ParseDuration(fields["took"])
			if p := logPace.FindStringSubmatch(m[3]); p != nil {
				l.pace = p[1]
			}
		case "vacuum: stopped by the throttle; what it cleaned stays clean":
			l.stops++
		}
	}
	return l
}
