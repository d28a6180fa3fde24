package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The randomized audit on a Citus coordinator, with shards moving under the
// daemon: the same operator, writer and checks as TestRandomizedAudit, on an
// inbox distributed over the test cluster's two workers, with a backlog to
// work through, the daemon and the operator running as the least-privilege
// roles of deploy/sql/role.sql. While they run, a shard moves to the other
// worker (citus_move_shard_placement with logical replication), then a
// worker joins and citus_rebalance_start moves a shard onto it. Both are
// done once before the daemon starts too: the writer's longest insert then
// is the cut-over's own cost, against which the same operation under the
// daemon is measured (logged, and documented in docs/guides/citus.md).
//
// Each deletion is recorded by a trigger on the shards, on the worker that
// deletes it, with the coordinator's distributed transaction stamp (taken
// at the batch's first statement on a worker, milliseconds after the
// batch's now(): the early-deletion check is that much weaker than on one
// node) and, from the worker's commit timestamps, when it committed there
// (a two-phase commit's COMMIT PREPARED, before the coordinator lets go of
// the fence).
func TestRandomizedAuditCitusShardMoves(t *testing.T) {
	t.Parallel()
	r := auditRand(t)
	c := newCitusAudit(t)
	f := c.f

	waits := &insertWaits{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	writerSeed := r.Uint64()
	go func() { defer wg.Done(); auditWriter(t, f.pool, rand.New(rand.NewPCG(writerSeed, 1)), stop, waits) }()

	// The cut-overs alone, the writer inserting, no daemon: a move, and a
	// rebalance onto a new worker.
	alone := []span{c.move(t, waits, "move, no daemon"), c.rebalance(t, waits, 0, "rebalance onto a new worker, no daemon")}

	// Debug: the throttle's pausing and resuming lines say when it held,
	// and the passes that deleted nothing are logged.
	d := startDaemon(t, f.dir, f.env(append(append([]string{"INBOXKEEPER_DATABASE_URL=" + c.roles.Daemon}, auditDaemonVars...), "INBOXKEEPER_LOG_LEVEL=debug")...), "run")
	var spans []span
	moved := make(chan struct{})
	go func() {
		// Closed also when a helper ends this goroutine with t.Fatal.
		defer close(moved)
		// Once the daemon is into the backlog, the same again.
		pgtest.WaitFor(t, time.Minute, "the daemon to start on the backlog", func() bool {
			return f.count("SELECT count(*) FROM public.consumer_inbox WHERE message_id LIKE 'backlog-%'") < citusBacklog
		})
		b := c.move(t, waits, "move, daemon running")
		spans = []span{b, c.rebalance(t, waits, 1, "rebalance onto a new worker, daemon running")}
	}()
	deadline := time.Now().Add(*auditFor)
	operator := []string{"INBOXKEEPER_DATABASE_URL=" + c.roles.Operator}
	actions := auditOperator(t, f, r, operator, func() bool {
		select {
		case <-moved:
			return time.Now().Before(deadline) && !t.Failed()
		default:
			return true
		}
	})
	close(stop)
	wg.Wait()
	d.stop()
	if t.Failed() {
		return
	}
	if strings.Contains(d.log(), "level=ERROR") {
		t.Errorf("run logged errors:\n%s", d.log())
	}
	c.gatherDeletions(t)
	for i, s := range spans {
		n := f.count("SELECT count(*) FROM public.deleted WHERE committed BETWEEN $1 AND $2", s.from, s.to)
		t.Logf("%s: %s, the writer's longest insert %s (without the daemon: %s in %s); %d rows deleted meanwhile", s.name,
			s.to.Sub(s.from).Round(time.Millisecond), s.longest.Round(time.Millisecond), alone[i].longest.Round(time.Millisecond),
			alone[i].to.Sub(alone[i].from).Round(time.Millisecond), n)
		// The daemon worked during the operation: it deleted rows, or its
		// throttle held it back because sessions waited on locks (as it
		// must: a cut-over makes the writer wait; seen once in a short
		// move, 0 rows in 1.8 s), or a pass found every due row under a
		// hold or replay (seen in CI: 12,723 rows under holds when an
		// 8.8 s move began, and none deleted during it).
		switch {
		case n > 0:
		case throttleHeldDuring(t, d.log(), s.from, s.to):
			t.Logf("%s: the throttle held the daemon back", s.name)
		case nothingToDeleteDuring(t, d.log(), s.from, s.to):
			t.Logf("%s: every row due was under a hold or replay", s.name)
		default:
			t.Errorf("%s: the daemon deleted nothing while it ran, its throttle did not hold it, and no pass found its due rows all protected\n%s", s.name, d.log())
		}
		// No bound on the waits: a batch that holds a shard's locks when
		// the move blocks writes delays the cut-over by what is left of
		// it (the batch target is 200 ms, and the lock watch cancels it
		// within CitusLockPollInterval), but Citus's own cut-over, without
		// the daemon, once kept the writer waiting 16 s here on a loaded
		// machine: a bound loose enough for that would prove nothing.
	}
	if left := f.count("SELECT count(*) FROM public.consumer_inbox WHERE message_id LIKE 'backlog-%'"); left == citusBacklog {
		t.Error("the backlog was not worked on")
	}
	// The rows left are copied to the coordinator: Citus does not join a
	// distributed table with the local holds and replays.
	auditCheck(t, f, []string{"INBOXKEEPER_DATABASE_URL=" + c.roles.Daemon}, actions, auditTables{committed: "d.committed", left: "public.inbox_left",
		snapshot: func() {
			pgtest.Exec(t, f.pool, "CREATE TABLE public.inbox_left AS SELECT * FROM public.consumer_inbox")
		}})
}

// throttleHeldDuring reports whether the daemon's log (at info) shows its
// throttle pausing at any moment between from and to: a "throttle:
// pausing" line within it, or a pause in force when it began.
func throttleHeldDuring(t *testing.T, log string, from, to time.Time) bool {
	t.Helper()
	paused := false
	for _, l := range logLines(t, log, "throttle: pausing", "throttle: resuming") {
		pausing := l.msg == "throttle: pausing"
		switch {
		case l.at.After(to):
			return paused
		case l.at.Before(from):
			paused = pausing
		case pausing:
			return true
		}
	}
	return paused
}

// nothingToDeleteDuring reports whether the daemon's log (at debug) shows
// a pass on the inbox ending between from and to that ran no batch and
// left rows to holds or replays: every row due then was protected, as it
// may be for seconds when the operator's holds cover every consumer.
func nothingToDeleteDuring(t *testing.T, log string, from, to time.Time) bool {
	t.Helper()
	for _, l := range logLines(t, log, "expiry: table done") {
		if l.at.Before(from) || l.at.After(to) || !strings.Contains(l.text, " deleted=0 ") || !strings.Contains(l.text, " batches=0 ") {
			continue
		}
		if !strings.Contains(l.text, " protected_by_holds=0 ") || !strings.Contains(l.text, " protected_by_replays=0 ") {
			return true
		}
	}
	return false
}

// logLine is a line of the daemon's log: when it was written, its message
// and the whole line.
type logLine struct {
	at        time.Time
	msg, text string
}

// logLines returns the lines of log whose message is one of msgs, in order.
func logLines(t *testing.T, log string, msgs ...string) []logLine {
	t.Helper()
	var out []logLine
	for _, line := range strings.Split(log, "\n") {
		i := slices.IndexFunc(msgs, func(m string) bool { return strings.Contains(line, `msg="`+m+`"`) })
		f := strings.Fields(line)
		if i < 0 || len(f) == 0 || !strings.HasPrefix(f[0], "time=") {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
		if err != nil {
			t.Fatalf("a log line's time: %v\n%s", err, line)
		}
		out = append(out, logLine{at: at, msg: msgs[i], text: line})
	}
	return out
}

// citusBacklog is how many rows the Citus audit's inbox starts with that
// expired an hour ago.
const citusBacklog = 10000

// citusAudit is the Citus audit's database.
type citusAudit struct {
	f     *fixture
	roles pgtest.Roles
	nodes []int // ports of the nodes with a public.deleted (every worker, and the spare once added)
	db    string
}

// auditNodeDDL is each worker's record of the deletions its shards saw:
// the coordinator's distributed transaction stamp (the batch's start as
// near as a worker knows it). The trigger runs as the deleting role.
const auditNodeDDL = `
CREATE TABLE public.deleted (
    consumer       text,
    message_id     text,
    event_time     timestamptz,
    remember_until timestamptz,
    xact_start     timestamptz NOT NULL DEFAULT coalesce((get_current_transaction_id()).transaction_stamp, now())
);
GRANT INSERT ON public.deleted TO PUBLIC;`

func newCitusAudit(t *testing.T) *citusAudit {
	t.Helper()
	pool, url := pgtest.NewCitusPool(t)
	f := &fixture{t: t, pool: pool, url: url, dir: t.TempDir()}
	c := &citusAudit{f: f, db: pgtest.ConnConfig(t, url).Database}
	for _, w := range pgtest.Citus(t).Workers {
		c.addNode(t, w.Port)
	}
	pgtest.Exec(t, pool, inboxTable)
	pgtest.Exec(t, pool, pgtest.Distribute("consumer", "public.consumer_inbox"))
	// One statement at a time: Citus sends the function and the trigger to
	// the workers, and refuses to within a multi-statement query.
	pgtest.Exec(t, pool, `
CREATE FUNCTION public.audit_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.deleted (consumer, message_id, event_time, remember_until) VALUES (OLD.consumer, OLD.message_id, OLD.event_time, OLD.remember_until);
  RETURN OLD;
END $$`)
	pgtest.Exec(t, pool, `SET citus.enable_unsafe_triggers = on`)
	pgtest.Exec(t, pool, `CREATE TRIGGER audit_delete AFTER DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.audit_delete()`)
	pgtest.Exec(t, pool, `
-- The seed rows of the one-node audit: 2,000 expiring from a minute ago to a minute ahead.
INSERT INTO public.consumer_inbox
SELECT 'c' || (i % 5), 'seed-' || i, timestamptz '2026-01-01 00:00Z' + (i % 120) * interval '1 minute',
       now() + ((i * 7919) % 120 - 60) * interval '1 second'
FROM generate_series(1, 2000) i;
-- The backlog, expired an hour ago.
INSERT INTO public.consumer_inbox
SELECT 'c' || (i % 5), 'backlog-' || i, timestamptz '2026-01-01 00:00Z' + (i % 120) * interval '1 minute',
       now() - interval '1 hour' - i * interval '1 millisecond'
FROM generate_series(1, `+fmt.Sprint(citusBacklog)+`) i;
CREATE TABLE public.returned (kind text, id bigint, at timestamptz NOT NULL);
-- The workers' records, gathered at the end with their commit times.
CREATE TABLE public.deleted (consumer text, message_id text, event_time timestamptz, remember_until timestamptz,
                             xact_start timestamptz, committed timestamptz);`)
	pgtest.Migrate(t, url)
	c.roles = pgtest.ApplyRoleScript(t, url, map[string]string{"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until"})
	f.policy = f.writeFile("inboxkeeper.yaml", inboxPolicy)
	return c
}

// addNode creates the deletion record on the node at port.
func (c *citusAudit) addNode(t *testing.T, port int) {
	t.Helper()
	pgtest.ExecOn(t, pgtest.CitusNodeURL(t, port, c.db), auditNodeDDL)
	c.nodes = append(c.nodes, port)
}

// placement is a shard of the inbox on one of the first two workers, its
// worker and the other one.
func (c *citusAudit) placement(t *testing.T) (shard int64, from, to int) {
	t.Helper()
	ws := pgtest.Citus(t).Workers
	if err := c.f.pool.QueryRow(context.Background(), `SELECT shardid, nodeport, CASE WHEN nodeport = $1 THEN $2 ELSE $1 END
FROM citus_shards WHERE table_name = 'public.consumer_inbox'::regclass AND nodeport IN ($1, $2) ORDER BY shardid LIMIT 1`,
		ws[0].Port, ws[1].Port).Scan(&shard, &from, &to); err != nil {
		t.Fatal(err)
	}
	return shard, from, to
}

// span is a shard move: when it ran, and the writer's longest insert that
// began meanwhile.
type span struct {
	name     string
	from, to time.Time
	longest  time.Duration
}

// move moves a shard (and those co-located with it) from one of the first
// two workers to the other with logical replication, while the writer
// writes.
func (c *citusAudit) move(t *testing.T, waits *insertWaits, name string) span {
	t.Helper()
	shard, from, to := c.placement(t)
	return c.timed(t, waits, name, fmt.Sprintf("SELECT citus_move_shard_placement(%d, '127.0.0.1', %d, '127.0.0.1', %d, shard_transfer_mode => 'force_logical')", shard, from, to))
}

// rebalance adds the i-th spare node as a worker and rebalances onto it.
func (c *citusAudit) rebalance(t *testing.T, waits *insertWaits, i int, name string) span {
	t.Helper()
	node := pgtest.CitusSpareNode(t, c.f.url, i)
	c.addNode(t, node.Port)
	pgtest.Exec(t, c.f.pool, fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", node.Port))
	s := c.timed(t, waits, name, "SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical')", "SELECT citus_rebalance_wait()")
	var onSpare int
	if err := c.f.pool.QueryRow(context.Background(), "SELECT count(*) FROM citus_shards WHERE table_name = 'public.consumer_inbox'::regclass AND nodeport = $1", node.Port).Scan(&onSpare); err != nil || onSpare == 0 {
		t.Errorf("%s: no shard moved onto the new worker (%v)", name, err)
	}
	return s
}

// timed runs sql, one statement after the other, on a connection of its
// own, and measures the span.
func (c *citusAudit) timed(t *testing.T, waits *insertWaits, name string, sql ...string) span {
	t.Helper()
	conn := pgtest.Connect(t, c.f.url)
	s := span{name: name, from: time.Now()}
	for _, q := range sql {
		pgtest.Exec(t, conn, q)
	}
	s.to = time.Now()
	s.longest = waits.longest(s.from, s.to)
	return s
}

// gatherDeletions copies every node's deletion records, with the time each
// committed there, into the coordinator's public.deleted.
func (c *citusAudit) gatherDeletions(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, port := range c.nodes {
		conn := pgtest.Connect(t, pgtest.CitusNodeURL(t, port, c.db))
		rows, err := conn.Query(ctx, "SELECT consumer, message_id, event_time, remember_until, xact_start, pg_xact_commit_timestamp(xmin) FROM public.deleted")
		if err != nil {
			t.Fatal(err)
		}
		records, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([]any, error) { return row.Values() })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.f.pool.CopyFrom(ctx, pgx.Identifier{"public", "deleted"},
			[]string{"consumer", "message_id", "event_time", "remember_until", "xact_start", "committed"}, pgx.CopyFromRows(records)); err != nil {
			t.Fatal(err)
		}
	}
}

// insertWaits records how long each of the writer's inserts took, to tell
// the longest that began within a span.
type insertWaits struct {
	mu   sync.Mutex
	at   []time.Time
	took []time.Duration
}

// add records one insert; a nil insertWaits records nothing.
func (w *insertWaits) add(at time.Time, took time.Duration) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.at, w.took = append(w.at, at), append(w.took, took)
}

// longest is the longest insert that began from from to to.
func (w *insertWaits) longest(from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var m time.Duration
	for i, at := range w.at {
		if !at.Before(from) && !at.After(to) {
			m = max(m, w.took[i])
		}
	}
	return m
}

func TestThrottleHeldDuring(t *testing.T) {
	t.Parallel()
	log := `time=2026-12-01T20:00:01.000Z level=INFO msg="expiry: table done"
time=2026-12-01T20:00:02.000Z level=WARN msg="throttle: pausing" kind=lock_wait reason="x"
time=2026-12-01T20:00:04.000Z level=INFO msg="throttle: resuming" was=lock_wait
time=2026-12-01T20:00:08.000Z level=WARN msg="throttle: pausing" kind=lock_wait reason="x"
time=2026-12-01T20:00:09.000Z level=INFO msg="throttle: resuming" was=lock_wait`
	at := func(s int) time.Time { return time.Date(2026, 12, 1, 20, 0, s, 0, time.UTC) }
	for _, c := range []struct {
		from, to int
		want     bool
	}{{0, 1, false}, {1, 3, true}, {3, 5, true}, {5, 7, false}, {7, 10, true}, {10, 12, false}} {
		if got := throttleHeldDuring(t, log, at(c.from), at(c.to)); got != c.want {
			t.Errorf("held during [%ds, %ds] = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

func TestNothingToDeleteDuring(t *testing.T) {
	t.Parallel()
	log := `time=2026-12-01T20:00:01.000Z level=DEBUG msg="expiry: table done" table=public.consumer_inbox deleted=0 rows_per_second=0 protected_by_holds=0 protected_by_replays=0 batches=0 skip_locked_batches=0
time=2026-12-01T20:00:03.000Z level=INFO msg="expiry: table done" table=public.consumer_inbox deleted=80 rows_per_second=9 protected_by_holds=12723 protected_by_replays=0 batches=1 skip_locked_batches=0
time=2026-12-01T20:00:05.000Z level=DEBUG msg="expiry: table done" table=public.consumer_inbox deleted=0 rows_per_second=0 protected_by_holds=13564 protected_by_replays=0 batches=0 skip_locked_batches=0
time=2026-12-01T20:00:07.000Z level=DEBUG msg="expiry: progress" table=public.consumer_inbox deleted=0 batches=0 protected_by_holds=5
time=2026-12-01T20:00:09.000Z level=DEBUG msg="expiry: table done" table=public.consumer_inbox deleted=0 rows_per_second=0 protected_by_holds=0 protected_by_replays=3 batches=0 skip_locked_batches=0`
	at := func(s int) time.Time { return time.Date(2026, 12, 1, 20, 0, s, 0, time.UTC) }
	for _, c := range []struct {
		from, to int
		want     bool
	}{{0, 2, false}, {2, 4, false}, {4, 6, true}, {6, 8, false}, {8, 10, true}, {10, 12, false}} {
		if got := nothingToDeleteDuring(t, log, at(c.from), at(c.to)); got != c.want {
			t.Errorf("nothing to delete during [%ds, %ds] = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
