package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

var idLine = regexp.MustCompile(`^[1-9][0-9]*\n$`)

// addID runs a command that prints a new hold or replay id and returns it.
func (f *fixture) addID(args ...string) string {
	f.t.Helper()
	return f.addIDWith(nil, args...)
}

// addIDWith is addID with extra environment variables.
func (f *fixture) addIDWith(vars []string, args ...string) string {
	f.t.Helper()
	r := f.runWith(vars, args...)
	wantExit(f.t, r, 0)
	if !idLine.MatchString(r.stdout) {
		f.t.Fatalf("want an id on a line of its own\n%s", r)
	}
	return strings.TrimSpace(r.stdout)
}

// wantEnded checks the record id of public.consumer_inbox just ended with
// `kind end id` (hold release, replay finish): ending it again, or an
// unknown ID, exits 1 and says it is not found; list shows none, and list
// --all shows it in its state (released, finished).
func (f *fixture) wantEnded(kind, end, id, none, state string) {
	f.t.Helper()
	for _, again := range []string{id, "987654"} {
		r := f.run(kind, end, again)
		wantExit(f.t, r, 1, kind+" "+again)
		if !strings.Contains(r.stderr, "not found") {
			f.t.Errorf("%s %s %s does not say why it failed\n%s", kind, end, again, r)
		}
	}
	wantExit(f.t, f.run(kind, "list"), 0, none)
	wantExit(f.t, f.run(kind, "list", "--all"), 0, kind+" "+id+" on public.consumer_inbox", " "+state+" ")
}

func TestHold(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)

	id := f.addID("hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--reason", "legal: case 7", "--owner", "legal@example.com")
	r := f.run("hold", "list")
	wantExit(t, r, 0, "hold "+id+` on public.consumer_inbox scope="billing" owner="legal@example.com" reason="legal: case 7" since `)

	f.wantOnce("public.consumer_inbox", 20, 10, 0)
	if n := f.expiredOf("billing"); n != 10 {
		t.Errorf("%d expired billing rows left, want all 10 (held)", n)
	}
	if n := f.expiredOf("payments"); n != 0 {
		t.Errorf("%d expired payments rows left, want 0", n)
	}

	r = f.run("hold", "release", id)
	wantExit(t, r, 0, "hold "+id+" released")
	f.wantEnded("hold", "release", id, "no holds", "released")

	// A hold on an event-time range, any scope: billing's first three events.
	// The table is named as SQL would fold it.
	rangeID := f.addID("hold", "add", "--table", "Public.Consumer_Inbox",
		"--from", "2026-02-01T00:00:00Z", "--to", "2026-02-01T03:30:00Z", "--reason", "incident", "--owner", "ops")
	r = f.run("hold", "list")
	wantExit(t, r, 0, "hold "+rangeID+" on public.consumer_inbox events [2026-02-01T00:00:00Z, 2026-02-01T03:30:00Z)")
	r = f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "deleted", 7, 3, 0)

	// A hold that would already have ended (a mistyped year) is refused,
	// on the database's clock, and nothing is written.
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	r = f.run("hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o", "--expires", past)
	wantExit(t, r, 2, "not in the future", "nothing was written")
	f.wantCount("holds", 2, "SELECT count(*) FROM inboxkeeper.holds")
	wantExit(t, f.run("hold", "release", rangeID), 0)
	r = f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "deleted", 3, 0, 0)
	f.wantCount("expired rows", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	f.wantCount("rows", allRows-expiredRows, "SELECT count(*) FROM public.consumer_inbox")
}

// Mistakes on the hold, replay and pause command lines exit 2 and write
// nothing.
func TestHoldAndReplayUsageErrors(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	// The same table, but the policy gives it no scope or event-time column.
	plain := f.writeFile("plain.yaml", `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    expires_at: remember_until
`)
	hold := []string{"hold", "add", "--table", "public.consumer_inbox"}
	replay := []string{"replay", "start", "--table", "public.consumer_inbox", "--scope", "billing", "--owner", "o"}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	cases := []struct {
		name   string
		policy string // default: the fixture's
		args   []string
		want   string
	}{
		{"hold without reason", "", with(hold, "--owner", "o"), "--reason"},
		{"hold without owner", "", with(hold, "--reason", "r"), "--owner"},
		{"hold with blank reason", "", with(hold, "--reason", " ", "--owner", "o"), "reason"},
		{"hold without table", "", []string{"hold", "add", "--reason", "r", "--owner", "o"}, "--table"},
		{"hold with a bad --from", "", with(hold, "--reason", "r", "--owner", "o", "--from", "yesterday", "--to", "2026-01-01T00:00:00Z"), `"yesterday"`},
		{"hold with a bad --expires", "", with(hold, "--reason", "r", "--owner", "o", "--expires", "31/12/2026"), "expires"},
		{"hold expiring in the past", "", with(hold, "--reason", "r", "--owner", "o", "--expires", "2025-12-01T00:00:00Z"), "not in the future"},
		{"hold expiring on a past date", "", with(hold, "--reason", "r", "--owner", "o", "--expires", "2025-12-01"), "2025-12-01T00:00:00Z, which is not in the future"},
		{"hold with --expires and --for", "", with(hold, "--reason", "r", "--owner", "o", "--expires", "2099-01-01", "--for", "90d"), "not both"},
		{"hold for no time", "", with(hold, "--reason", "r", "--owner", "o", "--for", "0"), "longer than 0"},
		{"hold for a negative time", "", with(hold, "--reason", "r", "--owner", "o", "--for", "-1h"), "must not be negative"},
		{"hold for less than a second", "", with(hold, "--reason", "r", "--owner", "o", "--for", "999us"), "must be at least 1s"},
		{"hold on an empty scope", "", with(hold, "--reason", "r", "--owner", "o", "--scope", ""), "--scope is empty"},
		{"pause for less than a second", "", []string{"pause", "--reason", "r", "--for", "999ms"}, "must be at least 1s"},
		{"hold for a malformed time", "", with(hold, "--reason", "r", "--owner", "o", "--for", "3 months"), "not a duration (like 500ms, 30s, 36h, 90d or 1d12h)"},
		{"hold with --from only", "", with(hold, "--reason", "r", "--owner", "o", "--from", "2026-01-01T00:00:00Z"), "--to"},
		{"hold with --from after --to", "", with(hold, "--reason", "r", "--owner", "o",
			"--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"), "before"},
		{"hold on a table not in the policy", "", []string{"hold", "add", "--table", "public.not_in_policy", "--reason", "r", "--owner", "o"},
			"public.not_in_policy"},
		{"hold on a malformed table name", "", []string{"hold", "add", "--table", "consumer_inbox", "--reason", "r", "--owner", "o"},
			"schema"},
		{"hold with --scope on a table without scope column", plain, with(hold, "--scope", "billing", "--reason", "r", "--owner", "o"),
			"scope"},
		{"hold with a range on a table without event_time column", plain, with(hold, "--reason", "r", "--owner", "o",
			"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"), "event_time"},
		{"hold release without id", "", []string{"hold", "release"}, "ID"},
		{"hold release of a non-number", "", []string{"hold", "release", "abc"}, `"abc"`},
		{"hold release of zero", "", []string{"hold", "release", "0"}, `"0"`},
		{"replay without --to", "", with(replay, "--from", "2026-01-01T00:00:00Z"), "--to"},
		{"replay without scope", "", []string{"replay", "start", "--table", "public.consumer_inbox", "--owner", "o",
			"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"}, "--scope"},
		{"replay with a bad --to", "", with(replay, "--from", "2026-01-01T00:00:00Z", "--to", "tomorrow"), `"tomorrow"`},
		{"replay with --from after --to", "", with(replay, "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"), "before"},
		{"replay on a table not in the policy", "", []string{"replay", "start", "--table", "public.not_in_policy", "--scope", "s", "--owner", "o",
			"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"}, "public.not_in_policy"},
		{"replay on a table without scope column", plain, with(replay, "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"), "in the policy"},
		{"replay finish of a non-number", "", []string{"replay", "finish", "x"}, `"x"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var vars []string
			if c.policy != "" {
				vars = append(vars, "INBOXKEEPER_POLICY_FILE="+c.policy)
			}
			r := runCLI(t, f.dir, f.env(vars...), c.args...)
			wantExit(t, r, 2, c.want)
		})
	}
	t.Cleanup(func() {
		// Runs after the parallel subtests.
		f.wantCount("holds", 0, "SELECT count(*) FROM inboxkeeper.holds")
		f.wantCount("replays", 0, "SELECT count(*) FROM inboxkeeper.replays")
		f.wantCount("pauses", 0, "SELECT count(*) FROM inboxkeeper.pause")
	})
}

func TestReplay(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)

	// payments' first five events.
	id := f.addID("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T05:30:00Z", "--owner", "ops@example.com")
	r := f.run("replay", "list")
	wantExit(t, r, 0, "replay "+id+` on public.consumer_inbox scope="payments" events [2026-01-01T00:00:00Z, 2026-01-01T05:30:00Z) owner="ops@example.com" since `)

	f.wantOnce("public.consumer_inbox", 25, 0, 5)
	f.wantCount("replayed rows kept", 5, `SELECT count(*) FROM public.consumer_inbox
WHERE consumer = 'payments' AND remember_until <= now() AND event_time >= '2026-01-01T00:00:00Z' AND event_time < '2026-01-01T05:30:00Z'`)
	if n := f.expiredOf("payments"); n != 5 {
		t.Errorf("%d expired payments rows left, want the 5 replayed", n)
	}

	r = f.run("replay", "finish", id)
	wantExit(t, r, 0, "replay "+id+" finished")
	f.wantEnded("replay", "finish", id, "no replays", "finished")

	r = f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "deleted", 5, 0, 0)
	f.wantCount("rows", allRows-expiredRows, "SELECT count(*) FROM public.consumer_inbox")
}

func TestStatus(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	holdID := f.addID("hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--reason", "r", "--owner", "o")
	replayID := f.addID("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T05:30:00Z", "--owner", "ops")

	check := func(r result, due, byHolds, byReplays int, lag string) {
		t.Helper()
		var oldest, newest time.Time
		if err := f.pool.QueryRow(context.Background(), "SELECT min(remember_until), max(remember_until) FROM public.consumer_inbox").Scan(&oldest, &newest); err != nil {
			t.Fatal(err)
		}
		wantExit(t, r, 0)
		for _, want := range []string{
			`(?m)^public\.consumer_inbox$`,
			`(?m)^  due \(deletable now\): +` + strconv.Itoa(due) + `$`,
			`(?m)^  protected by holds: +` + strconv.Itoa(byHolds) + `$`,
			`(?m)^  protected by replays: +` + strconv.Itoa(byReplays) + `$`,
			`(?m)^  replays beyond the window: 0$`,
			`(?m)^  cleanup lag: +` + lag + `$`,
			`(?m)^  oldest retained expiry: +` + regexp.QuoteMeta(oldest.UTC().Format(time.RFC3339)) + `$`,
			`(?m)^  newest retained expiry: +` + regexp.QuoteMeta(newest.UTC().Format(time.RFC3339)) + `$`,
			`(?m)^  active holds: +1$`,
			`(?m)^    hold ` + holdID + ` on public\.consumer_inbox scope="billing" `,
			`(?m)^  active replays: +1$`,
			`(?m)^    replay ` + replayID + ` on public\.consumer_inbox scope="payments" events \[2026-01-01T00:00:00Z, 2026-01-01T05:30:00Z\) `,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status does not match %s\n%s", want, r)
			}
		}
	}

	// Due are the expired rows nothing protects, deletable now: billing's 10
	// are held and payments' first 5 replayed; the lag is that of the oldest
	// row nothing protects: payments' 20th, due 2h20m ago.
	check(f.run("status"), expiredRows-15, 10, 5, `2h20m`)
	wantExit(t, f.run("once"), 0)
	// Left: billing's 10 (held) and payments' 5 (replayed); nothing is late.
	check(f.run("status"), 0, 10, 5, `0s`)

	wantExit(t, f.run("hold", "release", holdID), 0)
	wantExit(t, f.run("replay", "finish", replayID), 0)
	r := f.run("status")
	wantExit(t, r, 0, "active holds:             0", "active replays:           0")
	// Nothing protects billing's 10 any more: the oldest of them is due 2h10m ago.
	if !regexp.MustCompile(`(?m)^  cleanup lag: +2h10m$`).MatchString(r.stdout) {
		t.Errorf("want a lag of 2h10m\n%s", r)
	}
}

// For a table whose rows expire a fixed time after a column (expires_after),
// status reports expiries, not the column's values: a row kept because it is
// not due yet must not show an expiry in the past.
func TestStatusExpiresAfter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, `
CREATE TABLE public.other_inbox (id bigint PRIMARY KEY, first_seen_at timestamp NOT NULL);
CREATE INDEX ON public.other_inbox (first_seen_at);
INSERT INTO public.other_inbox SELECT i, (now() AT TIME ZONE 'UTC') - interval '3 hours' - i * interval '1 minute' FROM generate_series(1, 7) i;
INSERT INTO public.other_inbox SELECT i, (now() AT TIME ZONE 'UTC') - interval '30 minutes' + i * interval '1 minute' FROM generate_series(8, 10) i;`,
		`tables:
  - table: public.other_inbox
    key: [id]
    expires_after: {column: first_seen_at, after: 2h}
`, true)
	check := func(r result, due int, lag string) {
		t.Helper()
		wantExit(t, r, 0)
		var oldest, newest time.Time
		if err := f.pool.QueryRow(context.Background(), `
SELECT min(first_seen_at AT TIME ZONE 'UTC') + interval '2 hours', max(first_seen_at AT TIME ZONE 'UTC') + interval '2 hours'
FROM public.other_inbox`).Scan(&oldest, &newest); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			`(?m)^  due \(deletable now\): +` + strconv.Itoa(due) + `$`,
			`(?m)^  cleanup lag: +` + lag + `$`,
			`(?m)^  oldest retained expiry: +` + regexp.QuoteMeta(oldest.UTC().Format(time.RFC3339)) + `$`,
			`(?m)^  newest retained expiry: +` + regexp.QuoteMeta(newest.UTC().Format(time.RFC3339)) + `$`,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status does not match %s\n%s", want, r)
			}
		}
	}
	// The oldest row was first seen 3h07m ago and expired 2h after that.
	check(f.run("status"), 7, `1h7m`)
	r := f.run("once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.other_inbox", "deleted", 7, 0, 0)
	// Left: three rows first seen about 30 minutes ago, expiring in about 1h30m.
	check(f.run("status"), 0, `0s`)
}

// --expires takes a date (00:00 UTC) as well as RFC 3339, and --for a
// duration from the database's now.
func TestHoldExpiryForms(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	id := f.addID("hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o", "--expires", "2099-12-31")
	wantExit(t, f.run("hold", "list"), 0, "hold "+id+" ", " expires 2099-12-31T00:00:00Z")
	id = f.addID("hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o", "--for", "90d")
	f.wantCount("a hold ending 90 days from the database's now", 1,
		"SELECT count(*) FROM inboxkeeper.holds WHERE id = $1 AND expires_at = created_at + interval '90 days'", id)
	// Replays take dates too.
	rid := f.addID("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments", "--from", "2026-01-01", "--to", "2026-01-02", "--owner", "o")
	wantExit(t, f.run("replay", "list"), 0, "replay "+rid+` on public.consumer_inbox scope="payments" events [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z)`)
}

// holdFence takes the hold fence in shared mode, as a cleanup batch does, on
// a connection of its own named like a daemon, and keeps it until the test
// ends or release is called.
func holdFence(t *testing.T, url string) (pid int32, release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url+"&application_name=inboxkeeper%20run")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, holds.BatchFenceSQL); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return pid, release
}

// hold add and replay start wait for the fence at most FENCE_TIMEOUT, then
// fail naming the sessions in the way, and write nothing.
func TestFenceTimeout(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	pid, _ := holdFence(t, f.url)
	vars := []string{"INBOXKEEPER_FENCE_TIMEOUT=300ms"}
	start := time.Now()
	r := f.runWith(vars, "hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o")
	wantExit(t, r, 1, "timed out waiting for the cleanup batches in flight", "after 300ms", "nothing was written",
		fmt.Sprintf(`pid %d (RowExclusiveLock, role "postgres", application_name "inboxkeeper run", state "idle in transaction", in a transaction since `, pid))
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("hold add took %s with a 300ms fence timeout", took)
	}
	r = f.runWith(vars, "replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", "2026-01-01", "--to", "2026-01-02", "--owner", "o")
	wantExit(t, r, 1, "timed out waiting", fmt.Sprintf("pid %d ", pid))
	f.wantCount("holds", 0, "SELECT count(*) FROM inboxkeeper.holds")
	f.wantCount("replays", 0, "SELECT count(*) FROM inboxkeeper.replays")
}

// A daemon frozen in the middle of a batch (SIGSTOP, a paused VM) keeps its
// transaction open, and with it the fence; PostgreSQL ends that transaction
// after IDLE_IN_TRANSACTION_TIMEOUT, so hold add gets through, and the
// frozen batch deletes nothing.
func TestFrozenDaemonReleasesTheFence(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	ctx := context.Background()
	gate := gateDeletes(t, f)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_LOCK_TIMEOUT=60s", "INBOXKEEPER_STATEMENT_TIMEOUT=60s",
		"INBOXKEEPER_IDLE_IN_TRANSACTION_TIMEOUT=1s", "INBOXKEEPER_INTERVAL=1h"), "run")
	pid := gate.waitForBatch()
	// Open the gate only once it is frozen: kill(2) returns before the
	// process is stopped.
	thaw := pgtest.Freeze(t, d.cmd.Process.Pid)
	defer thaw()
	gate.open() // the DELETE finishes; COMMIT never comes
	// Idle in its transaction, or already ended by the timeout (on a busy
	// machine the poll may miss the second it spends idle).
	var state string
	pgtest.WaitFor(t, 30*time.Second, "the frozen batch idle in its transaction", func() bool {
		err := f.pool.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state)
		return errors.Is(err, pgx.ErrNoRows) || err == nil && state == "idle in transaction"
	})
	start := time.Now()
	r := f.runWith([]string{"INBOXKEEPER_FENCE_TIMEOUT=30s"}, "hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o")
	wantExit(t, r, 0)
	t.Logf("hold add returned after %s", time.Since(start))
	// Its locks go as its backend exits; the process entry a moment later.
	pgtest.WaitFor(t, 10*time.Second, "the frozen batch's backend to end", func() bool {
		return f.count("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) == 0
	})
	f.wantCount("rows (the frozen batch rolled back)", allRows, "SELECT count(*) FROM public.consumer_inbox")
}

// deleteGate makes every deletion from public.consumer_inbox wait on an
// advisory lock the test holds, so that a daemon's batch can be caught in
// the middle of its DELETE, holding the fence and its row locks.
type deleteGate struct {
	t    *testing.T
	f    *fixture
	tx   pgx.Tx
	once sync.Once
}

func gateDeletes(t *testing.T, f *fixture) *deleteGate {
	t.Helper()
	pgtest.Exec(t, f.pool, `
CREATE FUNCTION public.wait_42() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock(42); RETURN OLD; END $$;
CREATE TRIGGER wait_42 BEFORE DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.wait_42();`)
	tx, err := f.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g := &deleteGate{t: t, f: f, tx: tx}
	pgtest.Exec(t, tx, "SELECT pg_advisory_xact_lock(42)")
	t.Cleanup(g.open)
	return g
}

// waitForBatch waits until a daemon's batch waits at the gate, and returns
// its backend's pid. It waits for the SKIP LOCKED form: the optimistic
// attempt before it gives up at the gate after 50 ms (its own short lock
// timeout) and is rolled back, maybe before the test acts on it, and the
// fallback may run on another connection.
func (g *deleteGate) waitForBatch() int32 {
	g.t.Helper()
	var pid int32
	pgtest.WaitFor(g.t, 30*time.Second, "the daemon's batch waiting at the gate", func() bool {
		err := g.f.pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'inboxkeeper run' AND wait_event_type = 'Lock'
  AND query LIKE '%DELETE%' AND query LIKE '%SKIP LOCKED%'`).Scan(&pid)
		return err == nil
	})
	return pid
}

// open lets the deletions through.
func (g *deleteGate) open() {
	g.once.Do(func() {
		if err := g.tx.Rollback(context.Background()); err != nil {
			g.t.Error(err)
		}
	})
}

// A session that holds the xmin horizon (a report in REPEATABLE READ) is
// named by status (pid, application_name, client, since; in --json too),
// and the pass that deletes rows while it holds exports how long it has.
func TestHorizonHolderNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := inboxFixture(t)
	report, pid, since := pgtest.HoldHorizon(t, f.url, "quarterly report", "SELECT count(*) FROM public.consumer_inbox")

	r := f.run("status")
	wantExit(t, r, 0, "xmin horizon: held by",
		fmt.Sprintf(`backend pid %d, application_name "quarterly report", client 127.0.0.1, idle in transaction, since %s`, pid, since.UTC().Format(time.RFC3339)))

	r = f.run("status", "--json")
	wantExit(t, r, 0)
	got := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	found := false
	for _, b := range got.XminHorizon.Blockers {
		if b.Kind == "backend" && b.PID != nil && *b.PID == pid {
			found = true
			if b.Application != "quarterly report" || b.Client != "127.0.0.1" || b.Since == nil || !b.Since.Equal(since) || b.AgeSeconds == nil || *b.AgeSeconds <= 0 {
				t.Errorf("status --json names the session as %+v", b)
			}
		}
	}
	if !found {
		t.Errorf("status --json does not name the session (pid %d):\n%s", pid, r.stdout)
	}

	// The daemon's first pass deletes the expired rows while the report
	// holds the horizon: the metric says for how long, from that pass on.
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1h"), "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)
	m := httpGet(t, "http://"+addr+"/metrics")
	var held float64 // read after the scrape, which may have read the horizon again
	if err := report.QueryRow(ctx, "SELECT extract(epoch FROM clock_timestamp() - $1::timestamptz)", since).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if age := metricValue(t, m, `inboxkeeper_xmin_horizon_age_seconds{kind="backend"}`); age <= 0 || age > held {
		t.Errorf("inboxkeeper_xmin_horizon_age_seconds{kind=\"backend\"} = %v after a pass that deleted rows, want (0, %v]", age, held)
	}
	if v := metricValue(t, m, `inboxkeeper_xmin_horizon_age_seconds{kind="replication_slot"}`); v != 0 {
		t.Errorf("no slot holds the horizon, yet its age reads %v", v)
	}
	if !strings.Contains(d.log(), `msg="expiry: table done"`) {
		t.Errorf("the pass deleted nothing:\n%s", d.log())
	}
	d.stop()
}

// A session holding the fence in the hold writers' mode keeps the batches
// out: once fails naming the fence and who holds it (a bare "lock timeout"
// before), status names it too, and nothing is deleted. A role granted
// nothing on inboxkeeper.fence cannot take it at all: with the advisory
// lock the fence was, any role that could connect stalled every hold add
// (a shared lock) or every batch (an exclusive one).
func TestBlockedFenceIsNamed(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	ctx := context.Background()
	before := f.rows()
	conn, err := pgx.Connect(ctx, f.url+"&application_name=a%20stuck%20writer")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE inboxkeeper.fence IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	r := f.runWith([]string{"INBOXKEEPER_LOCK_TIMEOUT=100ms"}, "once")
	wantExit(t, r, 1, "the hold fence (inboxkeeper.fence) is held against the cleanup", `application_name "a stuck writer"`)
	if n := f.rows(); n != before {
		t.Errorf("%d rows deleted past a held fence", before-n)
	}
	r = f.run("status")
	wantExit(t, r, 0, "hold fence: held against the cleanup by pid", "ShareLock", `application_name 'a stuck writer'`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r = f.run("status")
	wantExit(t, r, 0)
	if strings.Contains(r.stdout, "hold fence:") {
		t.Errorf("status names a fence holder after it let go:\n%s", r.stdout)
	}

	// A role with nothing but CONNECT.
	db := pgtest.CurrentDatabase(t, f.pool)
	nobody := "nobody_" + db
	pgtest.Exec(t, f.pool, fmt.Sprintf("CREATE ROLE %s LOGIN; GRANT USAGE ON SCHEMA inboxkeeper TO %[1]s", nobody))
	t.Cleanup(func() { pgtest.Exec(t, f.pool, fmt.Sprintf("DROP OWNED BY %[1]s; DROP ROLE %[1]s", nobody)) })
	cfg := pgtest.ConnConfig(t, f.url)
	cfg.User = nobody
	other, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	for _, mode := range []string{"ACCESS SHARE", "ROW EXCLUSIVE", "SHARE", "ACCESS EXCLUSIVE"} {
		err := pgx.BeginFunc(ctx, other, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "LOCK TABLE inboxkeeper.fence IN "+mode+" MODE")
			return err
		})
		if retry.Code(err) != retry.SQLStateInsufficientPriv {
			t.Errorf("LOCK TABLE inboxkeeper.fence IN %s MODE by a role granted nothing: %v, want permission denied", mode, err)
		}
	}
	r = f.runWith([]string{"INBOXKEEPER_FENCE_TIMEOUT=5s"}, "hold", "add", "--table", "public.consumer_inbox", "--reason", "r", "--owner", "o")
	wantExit(t, r, 0)
}
