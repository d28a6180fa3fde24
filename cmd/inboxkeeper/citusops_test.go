package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// citusRoles applies deploy/sql/role.sql for the fixture's inbox on the
// coordinator: the tests of the daemon on Citus run as its roles.
func citusRoles(t *testing.T, f *fixture) pgtest.Roles {
	t.Helper()
	return pgtest.ApplyRoleScript(t, f.url, map[string]string{"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until"})
}

// A daemon frozen (SIGSTOP, a paused VM) in the middle of a batch on a
// distributed table: the batch's row locks on the workers and the fence on
// the coordinator go when PostgreSQL ends its transaction, after
// IDLE_IN_TRANSACTION_TIMEOUT; an application's UPDATE of the rows it
// deleted and a hold add wait about that long, and the frozen batch
// deletes nothing. The daemon and hold add run as role.sql's roles.
func TestCitusFrozenDaemonLetsGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newCitusFixture(t)
	wantExit(t, f.run("migrate"), 0)
	roles := citusRoles(t, f)
	db := pgtest.ConnConfig(t, f.url).Database
	// The gate: every row the daemon deletes waits, on its worker, while
	// that worker's public.gate has a row (a wait that is not a lock, so
	// the batch's short lock timeout does not end it).
	var gates []string
	for _, w := range pgtest.Citus(t).Workers {
		u := w.URL(db)
		pgtest.ExecOn(t, u, "CREATE TABLE public.gate (closed bool); GRANT SELECT ON public.gate TO PUBLIC; INSERT INTO public.gate VALUES (true)")
		gates = append(gates, u)
	}
	pgtest.Exec(t, f.pool, `CREATE FUNCTION public.gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WHILE EXISTS (SELECT 1 FROM public.gate) LOOP PERFORM pg_sleep(0.01); END LOOP;
  RETURN OLD;
END $$`)
	pgtest.Exec(t, f.pool, "SET citus.enable_unsafe_triggers = on")
	pgtest.Exec(t, f.pool, "CREATE TRIGGER gate BEFORE DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.gate()")

	const idle = 2 * time.Second
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_DATABASE_URL="+roles.Daemon, "INBOXKEEPER_STATEMENT_TIMEOUT=60s",
		fmt.Sprintf("INBOXKEEPER_IDLE_IN_TRANSACTION_TIMEOUT=%s", idle), "INBOXKEEPER_INTERVAL=1h"), "run")
	var pid int32
	pgtest.WaitFor(t, 30*time.Second, "the daemon's DELETE at the gate", func() bool {
		return f.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'inboxkeeper run' AND state = 'active' AND query LIKE '%DELETE%'`).Scan(&pid) == nil
	})
	thaw := pgtest.Freeze(t, d.cmd.Process.Pid)
	defer thaw()
	// Its connections to the workers, which Citus names after the
	// coordinator backend's global pid.
	const onWorkers = "SELECT count(*) FROM citus_stat_activity WHERE application_name = 'citus_internal gpid=' || (citus_backend_gpid() / 10000000000 * 10000000000 + $1)"
	if n := f.count(onWorkers, pid); n == 0 {
		t.Fatal("the frozen batch has no session on a worker: the check below would see nothing")
	}
	for _, u := range gates {
		pgtest.ExecOn(t, u, "DELETE FROM public.gate")
	}
	// The DELETE ends; COMMIT never comes. An application wants a row
	// the batch deleted, and an operator adds a hold.
	began := time.Now()
	held := make(chan result, 1)
	go func() {
		held <- runCLI(t, f.dir, f.env("INBOXKEEPER_DATABASE_URL="+roles.Operator), "hold", "add", "--table", "public.consumer_inbox",
			"--scope", "billing", "--reason", "r", "--owner", "o")
	}()
	app := pgtest.Begin(t, f.pool)
	pgtest.Exec(t, app, "SET LOCAL citus.propagate_set_commands = 'local'")
	pgtest.Exec(t, app, "SET LOCAL lock_timeout = '60s'")
	pgtest.Exec(t, app, "UPDATE public.consumer_inbox SET event_time = event_time WHERE consumer = 'payments' AND remember_until <= now()")
	appWait := time.Since(began)
	if err := app.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-held
	wantExit(t, r, 0)
	holdWait := time.Since(began)
	t.Logf("with IDLE_IN_TRANSACTION_TIMEOUT=%s: the application's UPDATE waited %s, hold add returned after %s", idle, appWait.Round(time.Millisecond), holdWait.Round(time.Millisecond))
	// The timeout runs from the DELETE's end, a moment after the gate
	// opened; 3 s more allows for a loaded 2-core machine (the process
	// start of hold add included).
	if appWait > idle+3*time.Second || holdWait > idle+3*time.Second {
		t.Errorf("waits of %s (UPDATE) and %s (hold add) with IDLE_IN_TRANSACTION_TIMEOUT=%s", appWait, holdWait, idle)
	}
	// Nothing of the frozen batch is left: its coordinator backend, its
	// sessions on the workers (their locks went as they aborted; the
	// process entries a moment later).
	pgtest.WaitFor(t, 10*time.Second, "the frozen batch's backend and its sessions on the workers to end", func() bool {
		return f.count("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) == 0 && f.count(onWorkers, pid) == 0
	})
	f.wantCount("rows (the frozen batch rolled back)", allRows, "SELECT count(*) FROM public.consumer_inbox")
}

// Through PgBouncer in transaction mode in front of the coordinator (the
// usual managed-Citus setup), as on one node: every command that needs no
// session of its own works, one after the other, and leaves no session
// state on the server connections; what needs one (partition DDL, the
// migration lock) is refused naming INBOXKEEPER_SESSION_DATABASE_URL, and
// works with it. Every command runs as role.sql's roles; the partitioned
// inbox belongs to a role the daemon's login is a member of, so that it
// creates and retires partitions, on the workers too, without being a
// superuser.
func TestCitusThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newCitusFixture(t)
	rename := strings.NewReplacer("public.consumer_inbox", "public.part_inbox", "public.old_month", "public.part_old", "public.this_month", "public.part_now")
	pgtest.Exec(t, f.pool, rename.Replace(partitionedDDL))
	pgtest.Exec(t, f.pool, "SET citus.shard_count = 4; SELECT create_distributed_table('public.part_inbox', 'consumer')")
	wantExit(t, f.run("migrate"), 0)
	roles := pgtest.ApplyRoleScript(t, f.url,
		map[string]string{"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until"},
		map[string]string{"table_schema": "public", "table_name": "part_inbox", "expiry_column": "remember_until"})
	daemonLogin, operatorLogin := pgtest.ConnConfig(t, roles.Daemon).User, pgtest.ConnConfig(t, roles.Operator).User
	owner := pgx.Identifier{roles.DaemonRole + "_owner"}.Sanitize()
	// The owner of the application's tables, who may create them.
	pgtest.Exec(t, f.pool, "CREATE ROLE "+owner+" NOLOGIN")
	pgtest.Exec(t, f.pool, "GRANT CREATE ON SCHEMA public TO "+owner)
	for _, table := range []string{"public.part_inbox", "public.part_old", "public.part_now"} {
		pgtest.Exec(t, f.pool, "ALTER TABLE "+table+" OWNER TO "+owner)
	}
	pgtest.Exec(t, f.pool, "GRANT "+owner+" TO "+pgx.Identifier{daemonLogin}.Sanitize())

	b := pgtest.NewCitusBouncer(t, daemonLogin, operatorLogin)
	db := pgtest.ConnConfig(t, f.url).Database
	daemon := []string{"INBOXKEEPER_DATABASE_URL=" + pgtest.WithUser(t, b.URL(db), daemonLogin)}
	operator := []string{"INBOXKEEPER_DATABASE_URL=" + pgtest.WithUser(t, b.URL(db), operatorLogin)}

	wantExit(t, f.runWith(daemon, "status"), 0, "distributed (Citus):      hash on consumer, 4 shards on 2 nodes")
	pooledCommands(t, f, daemon, operator)

	// The partitioned inbox too: partition DDL needs a session.
	f.policy = f.writeFile("both.yaml", inboxPolicy+strings.TrimPrefix(rename.Replace(partitionedPolicy), "tables:\n"))
	partitions := func() int64 {
		return f.count("SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.part_inbox'::regclass")
	}
	before := partitions()
	// A dry run is refused as the run is: it is how a change is tried.
	for _, args := range [][]string{{"once"}, {"once", "--dry-run"}, {"partitions", "ensure"}, {"run"}} {
		wantExit(t, f.runWith(daemon, args...), 2, "INBOXKEEPER_SESSION_DATABASE_URL", "pooler")
	}
	wantExit(t, f.runWith([]string{"INBOXKEEPER_DATABASE_URL=" + b.URL(db)}, "migrate"), 2, "INBOXKEEPER_SESSION_DATABASE_URL", "pooler")
	if n := partitions(); n != before {
		t.Errorf("refused commands changed the partitions: %d, was %d", n, before)
	}
	withSession := append(daemon, "INBOXKEEPER_SESSION_DATABASE_URL="+roles.Daemon)
	wantExit(t, f.runWith(withSession, "once", "--dry-run"), 0)
	r := f.runWith(withSession, "once")
	wantExit(t, r, 0)
	if n := partitions(); n == before {
		t.Errorf("once with a session URL made and retired no partition (still %d)\n%s", n, r)
	}
	f.wantCount("rows of the expired month", 0, "SELECT count(*) FROM public.part_inbox WHERE remember_until < now()")
	// The partitions the daemon made belong to the parent's owner, on the
	// coordinator and in the shards on the workers.
	f.wantCount("partitions owned by another role", 0, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'public.part_inbox'::regclass AND c.relowner <> $1::regrole`, roles.DaemonRole+"_owner")
	var shardOwners []string
	if err := f.pool.QueryRow(ctx, `SELECT array_agg(DISTINCT result) FROM run_command_on_shards('public.part_inbox',
$$SELECT string_agg(DISTINCT c.relowner::regrole::text, ',') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %1$L::regclass$$)`).Scan(&shardOwners); err != nil {
		t.Fatal(err)
	}
	if len(shardOwners) != 1 || shardOwners[0] != roles.DaemonRole+"_owner" {
		t.Errorf("the partitions' shards belong to %v, want %s", shardOwners, roles.DaemonRole+"_owner")
	}
	wantExit(t, f.runWith(append([]string{"INBOXKEEPER_DATABASE_URL=" + b.URL(db)}, "INBOXKEEPER_SESSION_DATABASE_URL="+f.url), "migrate"), 0, "up to date")
	wantNoSessionState(t, b.URL(db))
}
