// Command frameworks benchmarks `inboxkeeper once` against each messaging
// framework's own cleanup, on the framework's table as its own DDL makes it
// (internal/testkit/frameworks), with the index and the policy
// docs/reference/policy.md gives: side by side in one run, on file copies
// of one template, so that only ratios are read (the machine is shared).
//
//	go run ./bench/frameworks                        # every framework, 1M rows, 3 reps
//	go run ./bench/frameworks -frameworks MassTransit -reps 5
//
// It builds cmd/inboxkeeper and starts a durable throwaway PostgreSQL. For
// each framework it fills a template database with -rows rows, half of them
// due (under both the policy and the framework's cleanup), the rest not
// yet, or kept by the framework's state; then, rep by rep, on a fresh file
// copy each, right after a CHECKPOINT: `inboxkeeper once`, timed from exec
// to exit, its VACUUM after the pass included; `inboxkeeper once` with its
// VACUUM left to autovacuum (INBOXKEEPER_VACUUM_DEAD_RATIO=0), as the
// frameworks leave theirs; with -baseline, another build's once so too;
// and the framework's own cleanup as it runs it, statement after statement
// on a connection opened before it, its pauses left out (in its favour):
//
//   - Wolverine: batches of 5,000 by ctid, `status = 'Handled' AND
//     keep_until <= now` (at most 20 a minute in Wolverine).
//   - DotNetCore.CAP: batches of 1,000 by "Id", `"ExpiresAt" < <the host's
//     local now> AND "StatusName" IN ('Succeeded', 'Failed')` (a second's
//     pause between them in CAP).
//   - MassTransit: batches of 100 in "Delivered" order, `"Delivered" <
//     now minus 30 minutes` (EF Core deletes them one statement a row).
//   - NServiceBus: batches of 4,000 by ctid, `"Dispatched" AND
//     "DispatchedAt" < <UTC now> - 7 days`.
//   - Brighter: batches of 100 (the archiver's page) by messageid,
//     `dispatched < now - 7 days`.
//   - Eventuate Tram: one DELETE, `creation_time < <now in ms> - 7 days`.
//
// With -referenced N (MassTransit), one due row in N also has an outbox
// message pointing at it, so that once's batches delete the two together
// (delete_referencing); the framework's cleanup, which fails on them, is
// left out, and the last once (the baseline's, with -baseline) is the
// reference of the ratios:
//
//	go run ./bench/frameworks -frameworks MassTransit -rows 400000 -referenced 20 -reps 6 -baseline PATH
//
// The order of the methods is reversed every other rep. It prints each
// one's wall time, rows/s and WAL, once's batches and longest batch, the
// ratio of the framework's time to each once's (the goal: at least 1, once
// as fast or faster), and per framework and once the median ratio. It
// exits non-zero when a method deletes other than exactly the due rows.
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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/frameworks"
)

// framework is one framework's table, rows and cleanup.
type framework struct {
	name  string // its heading in docs/reference/policy.md
	ddl   string
	table string // SQL spelling, for the counts
	// fill inserts $1 rows, the first $2 of them due at $3 (the database's
	// now when the template is filled) and for the next two hours at least:
	// statements run in turn, each with those parameters.
	fill []string
	// batch is one statement of the framework's cleanup at now $1 and its
	// batch size, run until it deletes fewer than size rows (size 0: once).
	batch string
	size  int
	// setup runs on the template before the fill (the database's zone).
	setup string
	// references, for a framework whose policy has delete_referencing,
	// points a row of the referencing table at one due row in $1 (now is
	// $2), for -referenced.
	references string
}

// The frameworks' fills: row k of $1; the first $2 due. Each leaves the
// rows the framework keeps by state among the rows not due.
var all = []framework{
	{
		name: "Wolverine", ddl: frameworks.WolverineDDL, table: "public.wolverine_incoming_envelopes",
		fill: []string{`
INSERT INTO public.wolverine_incoming_envelopes (id, status, owner_id, body, message_type, received_at, keep_until)
SELECT md5(k::text)::uuid, CASE WHEN k < $2 OR k % 3 = 0 THEN 'Handled' WHEN k % 3 = 1 THEN 'Scheduled' ELSE 'Incoming' END, 0,
       decode(repeat('ab', 150), 'hex'), 'Orders.Placed', 'rabbitmq://orders',
       CASE WHEN k < $2 THEN $3::timestamptz - interval '3 days' + k * (interval '2 days' / $2)
            WHEN k % 3 = 0 THEN $3::timestamptz + interval '1 day'
            WHEN k % 3 = 1 THEN $3::timestamptz - interval '1 day' END
FROM generate_series(0, $1 - 1) k`},
		batch: `DELETE FROM public.wolverine_incoming_envelopes WHERE status = 'Handled' AND ctid IN
  (SELECT ctid FROM public.wolverine_incoming_envelopes WHERE status = 'Handled' AND keep_until <= $1 LIMIT 5000)`,
		size: 5000,
	},
	{
		name: "DotNetCore.CAP", ddl: frameworks.CAPDDL, table: `cap.received`,
		setup: `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', current_database(), 'UTC'); END $$`,
		fill: []string{`
INSERT INTO "cap"."received" ("Id", "Version", "Name", "Group", "Content", "Retries", "Added", "ExpiresAt", "StatusName")
SELECT k, 'v1', 'orders.placed', 'billing', repeat('x', 300), 0, l - interval '2 days',
       CASE WHEN k < $2 THEN l - interval '3 days' + k * (interval '2 days' / $2)
            WHEN k % 3 = 0 THEN l + interval '4 hours'
            WHEN k % 3 = 1 THEN l - interval '1 hour' END,
       CASE WHEN k < $2 THEN (CASE WHEN k % 5 = 0 THEN 'Failed' ELSE 'Succeeded' END)
            WHEN k % 3 = 0 THEN 'Succeeded' WHEN k % 3 = 1 THEN 'Delayed' ELSE 'Scheduled' END
FROM generate_series(0, $1 - 1) k, LATERAL (SELECT $3::timestamptz AT TIME ZONE 'America/New_York' AS l) n`},
		batch: `DELETE FROM "cap"."received" WHERE "Id" IN (SELECT "Id" FROM "cap"."received"
  WHERE "ExpiresAt" < ($1::timestamptz AT TIME ZONE 'America/New_York') AND "StatusName" IN ('Succeeded', 'Failed') LIMIT 1000)`,
		size: 1000,
	},
	{
		name: "MassTransit", ddl: frameworks.MassTransitInboxDDL + frameworks.MassTransitOutboxDDL, table: `public."InboxState"`,
		fill: []string{`
INSERT INTO "InboxState" ("MessageId", "ConsumerId", "LockId", "Received", "ReceiveCount", "Consumed", "Delivered")
SELECT md5(k::text)::uuid, md5((k % 16)::text)::uuid, md5(('l' || k)::text)::uuid, coalesce(d, $3::timestamptz) - interval '1 second', 1, d, d
FROM generate_series(0, $1 - 1) k,
     LATERAL (SELECT CASE WHEN k < $2 THEN $3::timestamptz - interval '3 days' + k * (interval '2 days' / $2)
                          WHEN k % 10 = 0 THEN NULL ELSE $3::timestamptz - interval '10 minutes' END AS d) dd`,
			// Outbox messages of rows not yet past the window: the foreign
			// key's index is not empty.
			`
INSERT INTO "OutboxMessage" ("SentTime", "InboxMessageId", "InboxConsumerId", "MessageId", "ContentType", "MessageType", "Body")
SELECT $3::timestamptz, "MessageId", "ConsumerId", gen_random_uuid(), 'application/json', 'urn:message:Orders:Placed', '{}'
FROM "InboxState" WHERE "Delivered" > $3::timestamptz - interval '1 hour' AND "Id" % 50 = 0 AND $1::int > 0 AND $2::int >= 0`},
		references: `
INSERT INTO "OutboxMessage" ("SentTime", "InboxMessageId", "InboxConsumerId", "MessageId", "ContentType", "MessageType", "Body")
SELECT $2::timestamptz, "MessageId", "ConsumerId", gen_random_uuid(), 'application/json', 'urn:message:Orders:Placed', '{}'
FROM "InboxState" WHERE "Delivered" < $2::timestamptz - interval '1 hour' AND "Id" % $1 = 0`,
		batch: `DELETE FROM "InboxState" WHERE "Id" IN (SELECT "Id" FROM "InboxState"
  WHERE "Delivered" < $1::timestamptz - interval '30 minutes' ORDER BY "Delivered" LIMIT 100)`,
		size: 100,
	},
	{
		name: "NServiceBus", ddl: frameworks.NServiceBusDDL("Sales_", "Billing_"), table: `public."Sales_OutboxData"`,
		fill: []string{`
INSERT INTO public."Sales_OutboxData" ("MessageId", "Dispatched", "DispatchedAt", "PersistenceVersion", "Operations")
SELECT md5(k::text), d IS NOT NULL, d, '8.1.0', '[{"MessageId": "x", "Body": "` + strings.Repeat("y", 200) + `"}]'
FROM generate_series(0, $1 - 1) k,
     LATERAL (SELECT CASE WHEN k < $2 THEN ($3::timestamptz AT TIME ZONE 'UTC') - interval '9 days' + k * (interval '2 days' / $2)
                          WHEN k % 4 = 0 THEN NULL ELSE ($3::timestamptz AT TIME ZONE 'UTC') - interval '6 days' END AS d) dd`},
		batch: `DELETE FROM public."Sales_OutboxData" WHERE ctid IN (SELECT ctid FROM public."Sales_OutboxData"
  WHERE "Dispatched" = true AND "DispatchedAt" < ($1::timestamptz AT TIME ZONE 'UTC') - interval '7 days' LIMIT 4000)`,
		size: 4000,
	},
	{
		name: "Brighter", ddl: frameworks.BrighterOutboxDDL, table: "public.outbox",
		fill: []string{`
INSERT INTO outbox (MessageId, Topic, MessageType, Timestamp, Dispatched, HeaderBag, Body)
SELECT md5(k::text)::uuid, 'orders.placed', 'MT_EVENT', $3::timestamptz - interval '10 days', d, '{}', repeat('z', 300)
FROM generate_series(0, $1 - 1) k,
     LATERAL (SELECT CASE WHEN k < $2 THEN $3::timestamptz - interval '9 days' + k * (interval '2 days' / $2)
                          WHEN k % 4 = 0 THEN NULL ELSE $3::timestamptz - interval '6 days' END AS d) dd`},
		batch: `DELETE FROM outbox WHERE messageid IN (SELECT messageid FROM outbox
  WHERE dispatched < $1::timestamptz - interval '7 days' ORDER BY dispatched LIMIT 100)`,
		size: 100,
	},
	{
		name: "Eventuate Tram", ddl: frameworks.EventuateDDL, table: "eventuate.received_messages",
		fill: []string{`
INSERT INTO eventuate.received_messages
SELECT 'orderService', md5(k::text),
       CASE WHEN k < $2 THEN (extract(epoch FROM $3::timestamptz - interval '9 days') * 1000)::bigint + k * (2 * 86400000::bigint / $2)
            ELSE (extract(epoch FROM $3::timestamptz - interval '6 days') * 1000)::bigint END
FROM generate_series(0, $1 - 1) k`},
		batch: `DELETE FROM eventuate.received_messages WHERE creation_time < (extract(epoch FROM $1::timestamptz) * 1000)::bigint - 7 * 86400000::bigint`,
	},
}

func (f framework) key() string { return f.name }

type options struct {
	benchdata.Common // -baseline: another build of the daemon, run as one more method
	rows             int
	referenced       int
	frameworks       []framework
}

func main() { os.Exit(run(os.Args[1:], os.Stdout)) }

// run prints the report on stdout and progress and errors on stderr.
func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("frameworks", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rows, "rows", 1_000_000, "rows in each framework's table; half of them due")
	list := fs.String("frameworks", benchdata.Names(all, framework.key), "comma-separated frameworks to run")
	fs.IntVar(&o.referenced, "referenced", 0, "point a row of the referencing table at one due row in this many, so that once's batches delete them with it (delete_referencing; MassTransit only); the framework's cleanup, which fails on them, is left out and the last once is the reference; 0: none")
	o.Define(fs, 3, "repetitions, reversing the order of the two every other one", benchdata.KeepUsage,
		"another inboxkeeper binary (go build -o PATH ./cmd/inboxkeeper in another checkout) run as one more method, its VACUUM left to autovacuum, in the same reps")
	return benchdata.Main(fs, args, &o.Common, func() error {
		var err error
		if o.frameworks, err = benchdata.Pick(all, framework.key, *list, "framework"); err != nil {
			return err
		}
		if o.referenced > 0 {
			for _, f := range o.frameworks {
				if f.references == "" {
					return fmt.Errorf("-referenced: %s's policy deletes no referencing rows (only MassTransit's does)", f.name)
				}
			}
		}
		return benchdata.WantFlags(fs, o.rows < 2 || o.referenced < 0, "-rows >= 2 and -referenced >= 0")
	}, func(ctx context.Context) error { return benchmark(ctx, o, stdout) })
}

type bench struct {
	benchdata.Bench
	o       options
	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool // the postgres database: copies are made from here
}

// result is one measured cleanup.
type result struct {
	wall, longest time.Duration
	wal, deleted  int64
	batches       int
}

func benchmark(ctx context.Context, o options, w io.Writer) error {
	ws, removeDir, err := benchdata.NewBench(ctx, "inboxkeeper-bench-")
	if err != nil {
		return err
	}
	defer removeDir()
	b := &bench{Bench: ws, o: o}
	cluster, pool, end, err := benchdata.StartCluster(ctx, b.Progress, benchdata.ClusterSettings("512MB", map[string]string{"autovacuum": "off"}), o.Keep, w)
	if err != nil {
		return err
	}
	defer end()
	b.cluster, b.pool = cluster, pool

	benchdata.Header(w, "bench/frameworks", o.Flags)
	benchdata.SharedMemory(w, cluster.DataDir)
	fmt.Fprintf(w, "timing: inboxkeeper once from exec to exit, its VACUUM after the pass included, and with INBOXKEEPER_VACUUM_DEAD_RATIO=0 (VACUUM left to autovacuum, as the frameworks leave it); each framework's cleanup as statements alone, back to back, on a connection opened before them (its pauses left out); autovacuum off; the order of the methods reversed every other rep\n")
	fmt.Fprintf(w, "rows: %d in each table, %d due; %d reps\n", o.rows, o.rows/2, o.Reps)
	for _, f := range o.frameworks {
		if err := b.framework(ctx, w, f); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// framework fills f's template and runs the reps.
func (b *bench) framework(ctx context.Context, w io.Writer, f framework) error {
	policy, indexes, err := frameworks.DocSection(f.name)
	if err != nil {
		return err
	}
	policyFile := filepath.Join(b.Dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(policy), 0o644); err != nil {
		return err
	}
	tpl := "tpl_" + ident(f.name)
	if err := b.recreate(ctx, tpl, ""); err != nil {
		return err
	}
	if _, err := b.inboxkeeper(ctx, b.Bin, tpl, policyFile, nil, "migrate"); err != nil {
		return err
	}
	due := int64(b.o.rows / 2)
	b.Logf("%s: filling %d rows", f.name, b.o.rows)
	err = b.inDB(ctx, tpl, func(conn *pgx.Conn) error {
		if f.setup != "" {
			if _, err := conn.Exec(ctx, f.setup); err != nil {
				return err
			}
		}
		if _, err := conn.Exec(ctx, f.ddl); err != nil {
			return err
		}
		for _, ix := range indexes {
			if _, err := conn.Exec(ctx, ix); err != nil {
				return err
			}
		}
		now := time.Now()
		for _, fill := range f.fill {
			if _, err := conn.Exec(ctx, fill, b.o.rows, due, now); err != nil {
				return err
			}
		}
		if b.o.referenced > 0 {
			if _, err := conn.Exec(ctx, f.references, b.o.referenced, now); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, "VACUUM (ANALYZE, FREEZE)")
		return err
	})
	if err != nil {
		return err
	}
	how := fmt.Sprintf("batches of %d", f.size)
	if f.size == 0 {
		how = "one DELETE"
	}
	fmt.Fprintf(w, "\nframework %s: %d rows, %d due; its cleanup: %s\n", f.name, b.o.rows, due, how)
	if b.o.referenced > 0 {
		fmt.Fprintf(w, "  one due row in %d pointed at by a referencing row; the framework's cleanup left out (it fails on them)\n", b.o.referenced)
	}
	ms := b.methods(policyFile, f)
	ref := ms[len(ms)-1]                   // the framework's cleanup, or with -referenced the last once
	ratios := make([][]float64, len(ms)-1) // each other method against ref
	for rep := range b.o.Reps {
		order := slices.Clone(ms)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		got := map[string]result{}
		for i, m := range order {
			db := fmt.Sprintf("run_%s_%d", ident(f.name), i)
			if err := b.recreate(ctx, db, tpl); err != nil {
				return err
			}
			r, err := m.run(ctx, db)
			if err != nil {
				return fmt.Errorf("rep %d, %s: %w", rep+1, m.name, err)
			}
			if r.deleted != due {
				return fmt.Errorf("rep %d, %s: %d rows deleted, want the %d due", rep+1, m.name, r.deleted, due)
			}
			got[m.name] = r
		}
		own := got[ref.name]
		fmt.Fprintf(w, "  rep %d (%s first):\n", rep+1, order[0].name)
		for i, m := range ms {
			r := got[m.name]
			if m.name == frameworkName {
				fmt.Fprintf(w, "    %-34s %8s (%6.0f rows/s, WAL %4.0f MB, %d statements)\n", m.name, r.wall.Round(time.Millisecond), float64(due)/r.wall.Seconds(), benchdata.MB(r.wal), r.batches)
				continue
			}
			if m.name == ref.name {
				fmt.Fprintf(w, "    %-34s %8s (%6.0f rows/s, WAL %4.0f MB, %d batches, longest %s)\n", m.name, r.wall.Round(time.Millisecond),
					float64(due)/r.wall.Seconds(), benchdata.MB(r.wal), r.batches, r.longest.Round(time.Millisecond))
				continue
			}
			ratio := own.wall.Seconds() / r.wall.Seconds()
			ratios[i] = append(ratios[i], ratio)
			fmt.Fprintf(w, "    %-34s %8s (%6.0f rows/s, WAL %4.0f MB, %d batches, longest %s); ratio %s/this %.2f\n", m.name, r.wall.Round(time.Millisecond),
				float64(due)/r.wall.Seconds(), benchdata.MB(r.wal), r.batches, r.longest.Round(time.Millisecond), ref.label, ratio)
		}
	}
	for i, m := range ms[:len(ms)-1] {
		rs := slices.Sorted(slices.Values(ratios[i]))
		med := rs[len(rs)/2]
		verdict := "" // the goal is the framework's: another once is compared, not judged
		if ref.name == frameworkName {
			verdict = "; at least as fast: " + benchdata.Verdict(med >= 1)
		}
		fmt.Fprintf(w, "  %s over %d reps, %s: ratio %s/this median %.2f (min %.2f, max %.2f)%s\n",
			f.name, b.o.Reps, m.name, ref.label, med, rs[0], rs[len(rs)-1], verdict)
	}
	return nil
}

// frameworkName names the framework's own cleanup among the methods.
const frameworkName = "the framework's cleanup"

// method is one way of deleting the due rows of a copy.
type method struct {
	name  string
	label string // as the reference of the ratios
	run   func(ctx context.Context, db string) (result, error)
}

// methods are once, once with its VACUUM left to autovacuum as the
// framework leaves it, the baseline build's once (-baseline), and the
// framework's cleanup, last.
func (b *bench) methods(policy string, f framework) []method {
	ms := []method{
		{"inboxkeeper once", "", func(ctx context.Context, db string) (result, error) { return b.once(ctx, b.Bin, db, policy, f) }},
		{"inboxkeeper once, VACUUM left", "once", func(ctx context.Context, db string) (result, error) {
			return b.once(ctx, b.Bin, db, policy, f, "INBOXKEEPER_VACUUM_DEAD_RATIO=0")
		}},
	}
	if b.o.Baseline != "" {
		ms = append(ms, method{"baseline once, VACUUM left", "baseline", func(ctx context.Context, db string) (result, error) {
			if err := benchdata.MigrateAs(ctx, b.o.Baseline, b.cluster.URL(db), policy); err != nil {
				return result{}, err
			}
			return b.once(ctx, b.o.Baseline, db, policy, f, "INBOXKEEPER_VACUUM_DEAD_RATIO=0")
		}})
	}
	if b.o.referenced > 0 {
		return ms
	}
	return append(ms, method{frameworkName, "framework", func(ctx context.Context, db string) (result, error) { return b.cleanup(ctx, db, f) }})
}

// once runs bin's `inboxkeeper once` on db, with set added to its
// environment, and counts what it deleted.
func (b *bench) once(ctx context.Context, bin, db, policy string, f framework, set ...string) (result, error) {
	var r result
	before, err := b.count(ctx, db, f)
	if err != nil {
		return r, err
	}
	var p benchdata.Process
	r.wall, r.wal, err = benchdata.Measure(ctx, b.pool, func() error {
		var err error
		p, err = b.inboxkeeper(ctx, bin, db, policy, set, "once")
		return err
	})
	if err != nil {
		return r, err
	}
	r.batches, r.longest = benchdata.DoneBatches(p.Output), benchdata.LongestBatch(p.Output)
	after, err := b.count(ctx, db, f)
	r.deleted = before - after
	return r, err
}

// cleanup runs the framework's own cleanup on db, at the database's now.
func (b *bench) cleanup(ctx context.Context, db string, f framework) (result, error) {
	var r result
	before, err := b.count(ctx, db, f)
	if err != nil {
		return r, err
	}
	err = b.inDB(ctx, db, func(conn *pgx.Conn) error {
		var now time.Time
		if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return err
		}
		var err error
		r.wall, r.wal, err = benchdata.Measure(ctx, b.pool, func() error {
			for {
				tag, err := conn.Exec(ctx, f.batch, now)
				if err != nil {
					return err
				}
				r.batches++
				if f.size == 0 || tag.RowsAffected() < int64(f.size) {
					return nil
				}
			}
		})
		return err
	})
	if err != nil {
		return r, err
	}
	after, err := b.count(ctx, db, f)
	r.deleted = before - after
	return r, err
}

func (b *bench) count(ctx context.Context, db string, f framework) (int64, error) {
	var n int64
	err := b.inDB(ctx, db, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT count(*) FROM "+f.table).Scan(&n)
	})
	return n, err
}

// recreate drops db and creates it again, a file copy of tpl when given.
func (b *bench) recreate(ctx context.Context, db, tpl string) error {
	if _, err := b.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		return err
	}
	create := "CREATE DATABASE " + db
	if tpl != "" {
		create += " TEMPLATE " + tpl + " STRATEGY FILE_COPY"
	}
	_, err := b.pool.Exec(ctx, create)
	return err
}

func (b *bench) inboxkeeper(ctx context.Context, bin, db, policy string, set []string, args ...string) (benchdata.Process, error) {
	return benchdata.RunBinary(ctx, bin, benchdata.DaemonEnv(false, append(benchdata.DaemonSettings(b.cluster.URL(db), policy, 0), set...)...), args...)
}

func (b *bench) inDB(ctx context.Context, db string, fn func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, b.cluster.URL(db))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return fn(conn)
}

// ident is a framework's name as part of a database name.
func ident(name string) string {
	return strings.ToLower(strings.NewReplacer(" ", "_", ".", "_").Replace(name))
}
