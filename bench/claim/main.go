// Command claim benchmarks the consumer's claim path against the insert a
// consumer would otherwise write to deduplicate, side by side in one run on
// the same tables: on a shared machine only ratios mean anything.
//
//	go run ./bench/claim                                  # 3 reps, 5 s a method
//	go run ./bench/claim -reps 5 -baseline /tmp/ik-main   # and main's build's claim
//
// It starts a durable throwaway PostgreSQL and, in one database, the
// recommended inbox table in both layouts (inbox.PlainDDL, and
// inbox.PartitionedDDL as public.partitioned_inbox), each filled with -rows
// rows remembered for another 30 to 60 days, the control schema, and a
// retention rule for each of 20 consumers that remembers a claim for
// -horizon. The daemon (`inboxkeeper run`, INTERVAL 1s) runs beside the
// whole time: on the plain table it deletes what the claims and inserts
// wrote -horizon before, as fast as they write it; the partitioned table it
// only keeps premade (it retires whole months).
//
// Then, for each rep, layout and mix (all fresh identities, or half of them
// repeats of one claimed a moment before), each method runs for -duration
// on -clients connections of its own, in turns of -slice, the methods one
// after the other and then in reverse order, so that what else the machine
// does meanwhile (the daemon's passes, a neighbour's load) falls on all of
// them alike:
//
//   - INSERT ... ON CONFLICT DO NOTHING, a statement of its own (on the
//     partitioned table, which has no unique key, a plain insert);
//   - SELECT ... FROM inboxkeeper.claim(...), a statement of its own;
//   - the INSERT in a transaction (BEGIN, INSERT, COMMIT: pgx.BeginFunc);
//   - inbox.Claim in a transaction, as a Go consumer calls it;
//   - with -baseline, another build's inboxkeeper.claim, a statement of its
//     own, on a second database with the same tables, rules and fill, that
//     build's control schema and its own daemon beside.
//
// Every claim's answer is checked (fresh for a new identity, duplicate for
// a repeat): a wrong one fails the run. It reports each method's rate and
// latency (p50, p99), and the claim's against the insert of the same shape
// (the statement's against the statement, inbox.Claim's against the
// transaction), and the CPU time an operation took, its backend's and the
// client's (this process's): a ratio that a neighbour's load changes less
// than a rate. Goals: at least 0.7 x the insert's rate on the plain
// layout and 0.5 x on the partitioned one, a p99 at most 1.5 x, in every
// rep. synchronous_commit is off in the clients' sessions unless
// -synchronous-commit: with the disk's flush in every commit, both wait
// for the disk and the ratio says little of the claim's own cost.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/inbox"
)

// Goals: the claim's rate over the insert's, at least, by layout; its p99
// over the insert's, at most.
var goalRate = map[string]float64{"plain": 0.7, "partitioned": 0.5}

const goalP99 = 1.5

type options struct {
	benchdata.Common // -baseline: another build's binary, whose claim function is one more method
	rows, clients    int
	duration, slice  time.Duration
	horizon          time.Duration
	syncCommit       bool
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("claim", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 1_000_000, "rows in each layout's table before the run, remembered 30 to 60 days more")
	fs.IntVar(&o.clients, "clients", 4, "clients of each method, each on a connection of its own")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "how long each method runs in each rep, layout and mix, in turns of -slice")
	fs.DurationVar(&o.slice, "slice", 250*time.Millisecond, "how long a method's turn lasts (its first tenth not counted) before the next method's")
	fs.DurationVar(&o.horizon, "horizon", 10*time.Second, "how long a claim or insert is remembered: the daemon deletes the plain table's rows that much later")
	fs.BoolVar(&o.syncCommit, "synchronous-commit", false, "keep synchronous_commit on in the clients' sessions (each commit waits for the disk)")
	o.Define(fs, 3, "repetitions: the goals are judged in each", benchdata.KeepUsage,
		"another inboxkeeper binary (e.g. main's build): its claim function, on a database of its own migrated by it with its daemon beside, is one more method, \""+baselineName+"\"")
	return benchdata.Main(fs, args, &o.Common, func() error {
		return benchdata.WantFlags(fs, o.rows < 0 || o.clients < 1 || o.slice < 10*time.Millisecond || o.duration < o.slice || o.horizon < time.Second,
			"-rows >= 0, -clients >= 1, -slice >= 10ms, -duration >= -slice, -horizon >= 1s")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

// layout is one of the recommended table's layouts, as a table of the
// benchmark's database.
type layout struct{ name, table string }

var layouts = []layout{{"plain", "public.consumer_inbox"}, {"partitioned", "public.partitioned_inbox"}}

// mix is the share of claims that repeat an identity claimed before.
type mix struct {
	name string
	dup  float64
}

var mixes = []mix{{"fresh", 0}, {"50% duplicates", 0.5}}

// tablesDDL are both layouts, with names of their own.
var tablesDDL = inbox.PlainDDL + strings.NewReplacer("public.consumer_inbox", "public.partitioned_inbox",
	"consumer_inbox_", "partitioned_inbox_").Replace(inbox.PartitionedDDL)

// policyFile is the daemon's policy for both tables.
const policyFile = `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    first_seen: first_seen_at
    expires_at: remember_until
  - table: public.partitioned_inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    first_seen: first_seen_at
    expires_at: remember_until
    partitions:
      by: month
      max_expiry: 90d
`

// fillSQL adds $2 rows to table %s, first seen a day ago and remembered 30
// to 60 days more, over the 20 consumers.
const fillSQL = `INSERT INTO %s (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until)
SELECT 'c' || (1 + k %% 20), 'fill-' || k, sha256(k::text::bytea), 'applied', now() - interval '1 day', now() - interval '1 day',
       now() + interval '30 days' + (k %% 30) * interval '1 day'
FROM generate_series(1, $1::bigint) k`

// rulesSQL remembers every claim of the 20 consumers for $1, on both tables.
const rulesSQL = `INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, post_receipt, margin)
SELECT 'public', t, 'c' || i, $1::interval, interval '0'
FROM unnest(ARRAY['consumer_inbox', 'partitioned_inbox']) t, generate_series(1, 20) i`

type bench struct {
	benchdata.Bench
	o       options
	dbs     map[string]*database // "claims", and "baseline" with -baseline
	methods []method
}

// database is one of the benchmark's databases, its clients' connections
// and the daemon beside it.
type database struct {
	url     string
	conns   []*pgx.Conn
	pids    []int // the connections' backends
	daemon  *daemon
	deleted func(ctx context.Context) (int64, error)
}

// cpu is the CPU time the connections' backends have used so far.
func (db *database) cpu() (time.Duration, error) {
	var sum time.Duration
	for _, pid := range db.pids {
		t, err := benchdata.ProcessCPU(pid)
		if err != nil {
			return 0, err
		}
		sum += t
	}
	return sum, nil
}

func benchmark(ctx context.Context, o options, w io.Writer) error {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-bench-claim-")
	if err != nil {
		return err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o, dbs: map[string]*database{}, methods: methods}
	if o.Baseline != "" {
		b.methods = append(b.methods, baselineMethod)
	}
	c, admin, end, err := benchdata.StartCluster(ctx, b.Progress, benchdata.ClusterSettings("1GB", nil), o.Keep, w)
	if err != nil {
		return err
	}
	defer end()
	policy := filepath.Join(b.Dir, "inboxkeeper.yaml")
	if err := os.WriteFile(policy, []byte(policyFile), 0o644); err != nil {
		return err
	}
	builds := map[string]string{"claims": b.Bin}
	if o.Baseline != "" {
		builds["baseline"] = o.Baseline
	}
	for name, bin := range builds {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			return err
		}
		db, err := b.prepare(ctx, c.URL(name), bin, policy)
		if err != nil {
			return fmt.Errorf("database %s: %w", name, err)
		}
		defer db.close()
		b.dbs[name] = db
	}

	benchdata.Header(w, "bench/claim", o.Flags)
	benchdata.SharedMemory(w, c.DataDir)
	commit := "off"
	if o.syncCommit {
		commit = "on"
	}
	fmt.Fprintf(w, "rows: %d in each layout's table before the run; %d clients a method; %s a method in turns of %s (the first tenth of each not counted), the methods in turn; synchronous_commit %s in the clients' sessions\n",
		o.rows, o.clients, o.duration, o.slice, commit)
	fmt.Fprintf(w, "beside: inboxkeeper run (INTERVAL 1s) on each database; claims and inserts are remembered %s, then the daemon deletes them from the plain table\n", o.horizon)
	if o.Baseline != "" {
		fmt.Fprintf(w, "baseline: %s, its claim function on a database of its own (migrated by it, its daemon beside)\n", o.Baseline)
	}
	runs, err := b.measureAll(ctx, w)
	if err != nil {
		return err
	}
	b.summary(w, runs)
	for _, name := range []string{"claims", "baseline"} {
		db := b.dbs[name]
		if db == nil {
			continue
		}
		if err := db.daemon.healthy(); err != nil {
			return err
		}
		n, err := db.deleted(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "daemon beside (%s): %d rows deleted from the plain table during the run\n", name, n)
	}
	return nil
}

// prepare makes a database ready: the tables, the control schema (migrate
// by bin), the rules, the partitions made by a pass of bin, the fill, the
// daemon (bin run) beside, and the clients' connections.
func (b *bench) prepare(ctx context.Context, url, bin, policy string) (*database, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, tablesDDL); err != nil {
		return nil, err
	}
	env := benchdata.DaemonEnv(false, append(benchdata.DaemonSettings(url, policy, 0), "INBOXKEEPER_INTERVAL=1s")...)
	for _, cmd := range []string{"migrate", "once"} {
		b.Logf("%s: inboxkeeper %s", bin, cmd)
		if _, err := benchdata.RunBinary(ctx, bin, env, cmd); err != nil {
			return nil, err
		}
	}
	if _, err := conn.Exec(ctx, rulesSQL, b.o.horizon); err != nil {
		return nil, err
	}
	for _, l := range layouts {
		b.Logf("filling %s with %d rows", l.table, b.o.rows)
		if _, err := conn.Exec(ctx, fmt.Sprintf(fillSQL, l.table), b.o.rows); err != nil {
			return nil, err
		}
		if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+l.table); err != nil {
			return nil, err
		}
	}
	db := &database{url: url}
	if db.daemon, err = startDaemon(bin, env); err != nil {
		return nil, err
	}
	var before int64
	count := `SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = 'public.consumer_inbox'::regclass`
	if err := conn.QueryRow(ctx, count).Scan(&before); err != nil {
		db.close()
		return nil, err
	}
	db.deleted = func(ctx context.Context) (int64, error) {
		var n int64
		err := db.conns[0].QueryRow(ctx, count).Scan(&n)
		return n - before, err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		db.close()
		return nil, err
	}
	if !b.o.syncCommit {
		cfg.RuntimeParams["synchronous_commit"] = "off"
	}
	for range b.o.clients {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			db.close()
			return nil, err
		}
		db.conns = append(db.conns, c)
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			db.close()
			return nil, err
		}
		db.pids = append(db.pids, pid)
	}
	return db, nil
}

func (db *database) close() {
	for _, c := range db.conns {
		c.Close(context.Background())
	}
	if db.daemon != nil {
		db.daemon.stop()
	}
}
