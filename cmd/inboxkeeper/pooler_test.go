package main

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// throughBouncer starts a PgBouncer in transaction mode in front of f's
// database: its URL, and the environment that points the command at it.
func throughBouncer(t *testing.T, f *fixture) (bouncerURL string, via []string) {
	t.Helper()
	bouncerURL = pgtest.BouncerURL(t, pgtest.NewBouncer(t), f.url)
	return bouncerURL, []string{"INBOXKEEPER_DATABASE_URL=" + bouncerURL}
}

// Through PgBouncer in transaction mode, with a plain URL, every command
// that needs no session works, one after the other (no named prepared
// statement clashes on a shared server connection), and leaves no session
// state behind on the server connections other clients get next.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	bouncerURL, via := throughBouncer(t, f)

	pooledCommands(t, f, via, via)
	wantNoSessionState(t, bouncerURL)
}

// pooledCommands runs, through a pooler, every command that needs no
// session of its own on the usual inbox, one after the other: the daemon's
// (status, once, the lists, run) with the environment daemon, the
// operator's (holds, replays, pause) with operator.
func pooledCommands(t *testing.T, f *fixture, daemon, operator []string) {
	t.Helper()
	wantExit(t, f.runWith(daemon, "status"), 0, "public.consumer_inbox")
	r := f.runWith(daemon, "once", "--dry-run")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "would delete", expiredRows, 0, 0)
	holdID := f.addIDWith(operator, "hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--reason", "r", "--owner", "o", "--for", "1d")
	wantExit(t, f.runWith(daemon, "hold", "list"), 0, "hold "+holdID+" ")
	replayID := f.addIDWith(operator, "replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T05:30:00Z", "--owner", "o")
	r = f.runWith(daemon, "once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "deleted", 15, 10, 5)
	r = f.runWith(daemon, "once")
	wantExit(t, r, 0)
	wantResult(t, r, "public.consumer_inbox", "deleted", 0, 10, 5)
	wantExit(t, f.runWith(operator, "replay", "finish", replayID), 0)
	wantExit(t, f.runWith(operator, "hold", "release", holdID), 0)
	wantExit(t, f.runWith(operator, "pause", "--reason", "test", "--for", "1m"), 0)
	wantExit(t, f.runWith(operator, "resume"), 0)
	wantExit(t, f.runWith(daemon, "status", "--json"), 0)

	// The daemon: passes complete, and a clean stop exits 0.
	d := startDaemon(t, f.dir, f.env(append(daemon, "INBOXKEEPER_INTERVAL=200ms")...), "run")
	d.waitLine(passDone, 30*time.Second)
	d.waitLine(passDone, 30*time.Second)
	f.wantCount("expired rows", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")
	d.stop()
	if regexp.MustCompile(`level=(ERROR|WARN)`).MatchString(d.log()) {
		t.Errorf("run through PgBouncer logged warnings or errors:\n%s", d.log())
	}
}

// Tiered tables too: demotion, the permanent key table made on the fly,
// and deletion, through the pooler.
func TestThroughPgBouncerTiered(t *testing.T) {
	t.Parallel()
	f := newFixture(t, tieredDDL, pgtest.TieredInboxPolicy, true)
	bouncerURL, via := throughBouncer(t, f)
	wantExit(t, f.runWith(via, "once", "--dry-run"), 0, "public.inbox: would demote 5 to warm")
	r := f.runWith(via, "once")
	wantExit(t, r, 0, "public.inbox: demoted 5 to warm")
	wantResult(t, r, "public.inbox", "deleted", 15, 0, 0)
	f.wantCount("permanent keys", 15, "SELECT count(*) FROM inboxkeeper.keys_public_inbox")
	wantExit(t, f.runWith(via, "status"), 0, "public.inbox")
	wantNoSessionState(t, bouncerURL)
}

// wantNoSessionState opens as many transactions at once through the pooler
// as it has server connections, so that each lands on its own, and checks
// that none carries a setting, a prepared statement or an advisory lock
// left by inboxkeeper.
func wantNoSessionState(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	type state struct {
		pid                    int32
		lock, idle, stmt       string
		prepared, sessionLocks int
	}
	results := make(chan any, 20)
	for range 20 {
		go func() {
			var s state
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `SELECT pg_backend_pid(), current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'),
       current_setting('statement_timeout'), (SELECT count(*) FROM pg_prepared_statements),
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).Scan(
					&s.pid, &s.lock, &s.idle, &s.stmt, &s.prepared, &s.sessionLocks)
			})
			if err != nil {
				results <- err
				return
			}
			results <- s
		}()
	}
	for range 20 {
		switch v := (<-results).(type) {
		case error:
			t.Fatal(v)
		case state:
			if v.lock != "0" || v.idle != "0" || v.stmt != "0" || v.prepared != 0 || v.sessionLocks != 0 {
				t.Errorf("server connection %d kept session state: %+v", v.pid, v)
			}
		}
	}
}

// What needs a session of its own (partition DDL, the migration lock) is
// refused behind a pooler, before anything is touched, unless
// INBOXKEEPER_SESSION_DATABASE_URL names a direct connection; with it, it
// works and leaks nothing to the pooled connections.
func TestPgBouncerNeedsASessionURL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, partitionedDDL, partitionedPolicy, true)
	bouncerURL, via := throughBouncer(t, f)
	partitions := func() int64 {
		return f.count("SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.consumer_inbox'::regclass")
	}
	before := partitions()

	// A dry run is refused as the real run is: it is how a change is tried.
	for _, args := range [][]string{{"once"}, {"once", "--dry-run"}, {"partitions", "ensure"}, {"partitions", "ensure", "--dry-run"}, {"migrate"}, {"run"}} {
		r := f.runWith(via, args...)
		wantExit(t, r, 2, "INBOXKEEPER_SESSION_DATABASE_URL", "pooler")
	}
	if n := partitions(); n != before {
		t.Errorf("refused commands changed the partitions: %d, was %d", n, before)
	}
	// What needs no session still works through the pooler.
	wantExit(t, f.runWith(via, "status"), 0)
	wantExit(t, f.runWith(append(via, "INBOXKEEPER_SESSION_DATABASE_URL="+f.url), "once", "--dry-run"), 0)

	withSession := append(via, "INBOXKEEPER_SESSION_DATABASE_URL="+f.url)
	wantExit(t, f.runWith(withSession, "migrate"), 0, "up to date")
	r := f.runWith(withSession, "once")
	wantExit(t, r, 0)
	if n := partitions(); n == before {
		t.Errorf("once with a session URL made and retired no partition (still %d)\n%s", n, r)
	}
	f.wantCount("rows of the expired month", 0, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until < now()")
	// The DDL session's settings and its fence lock stayed on the direct
	// connection.
	wantNoSessionState(t, bouncerURL)
}
