// Command soak measures the steady state: what weeks of running do to the
// table, the database and the application. A writer inserts at a fixed
// rate into three identical inboxes, each in a database of its own on one
// throwaway cluster, side by side in one run; each gets a different
// cleaner:
//
//   - inboxkeeper: `inboxkeeper run` with INBOXKEEPER_INTERVAL=-interval
//     and the defaults (other INBOXKEEPER_* variables of this process pass
//     through, and the report lists them);
//
//   - procedure: the loop a DBA would schedule with pg_cron, a procedure
//     that deletes -proc-batch expired rows by ctid and commits, until a
//     batch comes back short, called every -proc-every;
//
//   - none: nothing deletes.
//
//     go run ./bench/soak                                  # 1,000 rows/s of ~400 B, 20 s expiry, 10 min
//     go run ./bench/soak -hold 60s -reps 3               # a session holds the xmin horizon for 60 s
//     go run ./bench/soak -rate 200 -row-bytes 1000 -interval 30s -standby
//
// Rows have the recommended layout (inbox.PlainDDL) plus a payload that
// brings them to -row-bytes, a random UUID as message id, and expire
// -expiry after they are inserted. Each table's writer inserts on four
// sessions of its own, open loop (insert i is due at i / -rate seconds
// whatever the ones before took), with synchronous_commit off, and times
// each insert. The cluster is durable, with the default autovacuum.
//
// Every second a sampler reads each table's size (table, indexes and
// TOAST), its dead tuples (pg_stat_user_tables) and its cleanup lag (now
// minus the oldest expiry among rows already expired). The report gives,
// per cleaner:
//
//   - the footprint: the peak size over the bytes of the live rows (those
//     not expired, as the writer counts them) packed, that is in a table
//     and indexes built fresh from them; after a warm-up of twice the
//     expiry (the table is filling up) and, with -hold, before the hold
//     and from its start on;
//   - the peak dead tuples, the cleanup lag's p99 and maximum;
//   - the writer's insert p50, p99 and p999, and their ratios to the
//     table nobody cleans;
//   - the cleaner's transactions a second: each database's commits and
//     rollbacks (pg_stat_database, read once the writers' sessions ended)
//     less the writer's inserts and the sampler's reads, less what is left
//     over in the database nobody cleans (autovacuum's own);
//   - for the daemon: its CPU, its RSS (and its anonymous part) in the first minute, half way and the last,
//     its log lines per hour; and, once the writers stopped and it deleted
//     every row, its transactions a second when nothing is due, over -idle.
//
// With -hold, a session in each database opens a REPEATABLE READ
// transaction at -hold-at for -hold: the report says whether
// `inboxkeeper status` named it, and what the daemon's
// inboxkeeper_xmin_horizon_age_seconds said one pass after it began.
// With -standby, a streaming standby replays everything (the daemon's
// throttle then has one to read). -reps N runs it N times, on fresh
// databases, starting the cleaners and writers in the reverse order every
// other rep, and judges the goals on the medians. -baseline PATH runs
// another build of the daemon (main's, say) as one more cleaner,
// "baseline", on a fourth identical inbox in the same reps, right after
// this build (right before it in the reversed reps), and prints its
// figures beside this build's in every goal.
//
// Goals (printed with the figures, at 1,000 rows/s and -interval 5s over
// at least 10 minutes): footprint at most 1.5, and 2.5 while a session
// holds the horizon for 60 s; insert p99 at most 1.1 and p999 at most
// 1.25 times no cleanup's; cleanup lag at most -interval + 2 s; at most 1
// transaction a second from the daemon when nothing is due; RSS flat (the
// last minute's at most 1.05 times the half-way minute's: a leak grows in
// both halves of the run, while a process that has just started grows in
// the first only, as the heap's pages are touched for the first time, so
// the first minute's figure is printed but not judged). A missed goal is printed
// (GOAL MISSED), not fatal; the command exits non-zero when a step fails.
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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// The cleaners, in the order of the report.
const (
	cleanInboxkeeper = "inboxkeeper"
	cleanBaseline    = "baseline"
	cleanProcedure   = "procedure"
	cleanNone        = "none"
)

// cleaners are the cleaners of a run, in the order of the report: with
// -baseline, the other build's daemon right after this one's.
func (o options) cleaners() []string {
	if o.Baseline != "" {
		return []string{cleanInboxkeeper, cleanBaseline, cleanProcedure, cleanNone}
	}
	return []string{cleanInboxkeeper, cleanProcedure, cleanNone}
}

// daemons are the cleaners that are a daemon: this build's, and the
// baseline's with -baseline.
func (o options) daemons() []string {
	if o.Baseline != "" {
		return []string{cleanInboxkeeper, cleanBaseline}
	}
	return []string{cleanInboxkeeper}
}

// The goals.
const (
	goalFootprint     = 1.5
	goalFootprintHeld = 2.5
	goalP99           = 1.1
	goalP999          = 1.25
	goalLagSlack      = 2 * time.Second
	goalIdleXacts     = 1.0
	goalRSSGrowth     = 1.05
)

type options struct {
	rate             float64
	rowBytes         int
	expiry           time.Duration
	duration         time.Duration
	interval         time.Duration
	procEvery        time.Duration
	procBatch        int
	idle             time.Duration
	hold             time.Duration
	holdAt           time.Duration
	standby          bool
	benchdata.Common // -baseline: another inboxkeeper binary, run as one more cleaner
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	o, ok := parseArgs(args)
	if !ok {
		return 2
	}
	return benchdata.Run("bench/soak", func(ctx context.Context) error {
		_, err := benchmark(ctx, o, stdout)
		return err
	})
}

func parseArgs(args []string) (options, bool) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	var o options
	fs.Float64Var(&o.rate, "rate", 1000, "rows inserted per second into each table")
	fs.IntVar(&o.rowBytes, "row-bytes", 400, "about how many bytes a row takes (a payload column makes up the rest)")
	fs.DurationVar(&o.expiry, "expiry", 20*time.Second, "how long after its insert a row expires")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the writers insert")
	fs.DurationVar(&o.interval, "interval", 5*time.Second, "INBOXKEEPER_INTERVAL of the daemon")
	fs.DurationVar(&o.procEvery, "proc-every", 60*time.Second, "how often the procedure loop is called")
	fs.IntVar(&o.procBatch, "proc-batch", 10000, "rows the procedure loop deletes per COMMIT")
	fs.DurationVar(&o.idle, "idle", 2*time.Minute, "how long the daemon's transactions are counted once nothing is due")
	fs.DurationVar(&o.hold, "hold", 0, "hold the xmin horizon this long with a REPEATABLE READ transaction in each database (0: never)")
	fs.DurationVar(&o.holdAt, "hold-at", 0, "when the hold begins, from the writers' start (0: half way)")
	fs.BoolVar(&o.standby, "standby", false, "run a streaming standby of the cluster")
	o.Define(fs, 1, "runs, alternating the order the cleaners and writers start in; goals are judged on the medians", benchdata.KeepUsage,
		"another inboxkeeper binary (e.g. main's build) run as one more cleaner, \""+cleanBaseline+"\", on an identical inbox in the same reps")
	ok := benchdata.ParseFlags(fs, args, &o.Common, func() error {
		if o.holdAt == 0 {
			o.holdAt = o.duration / 2
		}
		return benchdata.WantFlags(fs, o.rate <= 0 || o.rowBytes < 150 || o.expiry < time.Second || o.interval <= 0 ||
			o.duration < 4*o.expiry || o.procEvery <= 0 || o.procBatch < 1 || o.idle < o.interval ||
			o.hold < 0 || (o.hold > 0 && o.holdAt+o.hold > o.duration),
			"-rate > 0, -row-bytes >= 150, -expiry >= 1s, -duration >= 4 x -expiry, -interval, -proc-every > 0, -proc-batch >= 1, "+
				"-idle >= -interval, and a hold that ends within -duration")
	})
	return o, ok
}

// report is what the benchmark measured; the tiny test checks it.
type report struct {
	o       options
	packing packing // measured in the last rep
	reps    []rep
	passed  []string // INBOXKEEPER_* variables passed through to the daemon
}

// rep is one run: a result per cleaner, and the daemons' own figures.
type rep struct {
	order    []string
	results  map[string]*result
	daemon   daemonFigures
	baseline daemonFigures // with -baseline
	// steal is the share of the machine's CPU time the hypervisor gave
	// other guests during the rep; valid where /proc/stat was read.
	steal      float64
	stealValid bool
}

// result is what one cleaner's table went through.
type result struct {
	cleaner        string
	footprint      float64 // peak, after the warm-up (before the hold, with one)
	heapPart       float64 // at that peak: the table alone over its rows packed
	indexPart      float64 // and the indexes alone
	footprintHeld  float64 // peak from the hold's start on
	deadPeak       int64
	lagP99, lagMax time.Duration
	lat            latency
	late           int64   // inserts that started late (the writer fell behind)
	xactsPerSecond float64 // the cleaner's, steady state
}

// daemonFigures are the daemon's own.
type daemonFigures struct {
	cpu          float64 // of a core, steady state
	rss          rssFigures
	linesPerHour float64 // steady state
	// The passes of the steady state that ran a VACUUM (and of those, the
	// ones that ran it after another session's lock had passed it over, and
	// those whose VACUUM an older snapshot held back), found it passed over
	// to the end, or ran none for another reason though the dead tuples
	// called for one.
	vacuums, vacuumsLate, vacuumsHeldBack, vacuumsPassedOver, vacuumsNotRun int
	idleXacts                                                               float64 // a second, nothing due
	idleLinesPerHour                                                        float64
	namedInStatus                                                           string // the line of status that named the holder, "" when none
	holdPID                                                                 int
	metricInHold                                                            float64 // inboxkeeper_xmin_horizon_age_seconds{kind="backend"} when it first read 1 s or more in the hold (or at its end)
	metricInHoldAt                                                          time.Duration
}

type bench struct {
	benchdata.Bench
	o       options
	cluster *pgcluster.Cluster
	admin   *pgxpool.Pool
}

func benchmark(ctx context.Context, o options, w io.Writer) (*report, error) {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-soak-")
	if err != nil {
		return nil, err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o}
	// The default autovacuum, as users run it; a checkpoint every 5
	// minutes (the default), so its full-page writes fall on every table
	// alike.
	c, admin, end, err := benchdata.StartCluster(ctx, b.Progress, benchdata.ClusterSettings("256MB", map[string]string{
		"checkpoint_timeout": "'5min'", "max_wal_size": "'1GB'", "max_connections": "100",
	}), o.Keep, w)
	if err != nil {
		return nil, err
	}
	defer end()
	b.cluster = c
	if o.standby {
		b.Logf("starting a streaming standby")
		s, err := c.StartStandby(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer s.Destroy()
	}
	b.admin = admin

	r := &report{o: o, passed: benchdata.PassedThrough(daemonSet("", "", "0s")...)}
	benchdata.Header(w, "bench/soak", o.Flags)
	benchdata.SharedMemory(w, c.DataDir)
	if len(r.passed) > 0 {
		fmt.Fprintf(w, "daemon environment passed through: %s\n", strings.Join(r.passed, " "))
	}
	if o.Baseline != "" {
		fmt.Fprintf(w, "baseline: %s, run as the cleaner %q beside this build\n", o.Baseline, cleanBaseline)
	}
	for i := range o.Reps {
		order := o.cleaners()
		if i%2 == 1 {
			slices.Reverse(order)
		}
		b.Logf("rep %d of %d (order: %s)", i+1, o.Reps, strings.Join(order, ", "))
		rp, err := b.rep(ctx, order, r)
		if err != nil {
			return nil, fmt.Errorf("rep %d: %w", i+1, err)
		}
		r.reps = append(r.reps, rp)
		if i == 0 {
			printRows(w, r)
		}
		printRep(w, r, i)
	}
	printGoals(w, r)
	b.Logf("done")
	return r, nil
}

// dbName is the database of a cleaner's table.
func dbName(cleaner string) string { return "soak_" + cleaner }

// tableDDL is the recommended plain layout with a payload column.
var tableDDL = inbox.PlainDDL + "\nALTER TABLE public.consumer_inbox ADD COLUMN payload text;"

// procedureSQL is the cleanup a DBA would schedule with pg_cron: batches
// by ctid in expiry order, a COMMIT each, until one comes back short.
const procedureSQL = `
CREATE PROCEDURE public.inbox_cleanup(batch int) LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
  LOOP
    DELETE FROM public.consumer_inbox
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM public.consumer_inbox WHERE remember_until <= now() ORDER BY remember_until LIMIT batch));
    GET DIAGNOSTICS n = ROW_COUNT;
    COMMIT;
    EXIT WHEN n < batch;
  END LOOP;
END $$`

// setup makes each cleaner's database afresh, in order.
func (b *bench) setup(ctx context.Context, order []string) error {
	for _, cl := range order {
		db := pgx.Identifier{dbName(cl)}.Sanitize()
		if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			return err
		}
		if _, err := b.admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			return err
		}
		ddl := tableDDL
		if cl == cleanProcedure {
			ddl += ";" + procedureSQL
		}
		if err := execOn(ctx, b.cluster.URL(dbName(cl)), ddl); err != nil {
			return fmt.Errorf("%s: %w", cl, err)
		}
	}
	policy := filepath.Join(b.Dir, "inboxkeeper.yaml")
	if err := benchdata.WritePolicy(policy, "consumer_inbox"); err != nil {
		return err
	}
	for _, cl := range b.o.daemons() {
		url := b.cluster.URL(dbName(cl))
		if _, err := benchdata.RunBinary(ctx, b.binOf(cl), benchdata.DaemonEnv(false, daemonSet(url, policy, b.o.interval.String())...), "migrate"); err != nil {
			return fmt.Errorf("%s: %w", cl, err)
		}
	}
	return nil
}

// binOf is the binary of a daemon cleaner.
func (b *bench) binOf(cleaner string) string {
	if cleaner == cleanBaseline {
		return b.o.Baseline
	}
	return b.Bin
}

// daemonSet is the daemon's environment: the database, the policy, the
// interval, a metrics listener on a free port (the hold's check reads it).
func daemonSet(url, policy, interval string) []string {
	return []string{"INBOXKEEPER_DATABASE_URL=" + url, "INBOXKEEPER_POLICY_FILE=" + policy,
		"INBOXKEEPER_INTERVAL=" + interval, "INBOXKEEPER_METRICS_ADDR=127.0.0.1:0"}
}

func execOn(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// xacts is every database's commits and rollbacks, as the statistics have
// them (read from the database postgres, which nothing of the run uses).
func (b *bench) xacts(ctx context.Context) (map[string]int64, error) {
	rows, err := b.admin.Query(ctx, `SELECT datname::text, xact_commit + xact_rollback FROM pg_stat_database WHERE datname LIKE 'soak\_%'`)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
		out[name] = n
		return nil
	})
	return out, err
}

// sessionsGone waits until no session named app is connected: a session
// writes its statistics when it ends, before it leaves pg_stat_activity.
func (b *bench) sessionsGone(ctx context.Context, app string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := b.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sessions of %q still connected a minute after they were closed", n, app)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// median is the median of vs.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
