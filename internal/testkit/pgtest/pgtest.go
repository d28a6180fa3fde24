// Package pgtest gives each test binary one PostgreSQL server and each test
// a database of its own on it, so tests run in parallel without seeing each
// other's rows, holds or control schema.
//
// The server is a throwaway cluster started from the local server binaries,
// or the server INBOXKEEPER_TEST_DATABASE_URL points at. Without either, the
// test binary fails with instructions: a missing PostgreSQL never skips.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

var (
	mu      sync.Mutex
	adminDB string // URL of a database used to create the per-test ones
	cluster *pgcluster.Cluster
	seq     atomic.Int64
)

// Main wraps testing.M: it starts the shared server, runs the tests and
// removes the server afterwards.
func Main(m *testing.M) {
	code := func() int {
		if err := setup(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: cannot get a PostgreSQL server for the tests:", err)
			return 1
		}
		defer teardown()
		return m.Run()
	}()
	os.Exit(code)
}

func setup() error {
	if u := os.Getenv("INBOXKEEPER_TEST_DATABASE_URL"); u != "" {
		adminDB = u
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Commit timestamps let the randomized audit test tell when each
	// deleting transaction committed.
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	if err != nil {
		return err
	}
	cluster = c
	adminDB = c.URL("postgres")
	return nil
}

func teardown() {
	if cluster != nil {
		cluster.Destroy()
	}
	citusMu.Lock()
	defer citusMu.Unlock()
	if citus != nil {
		citus.Destroy()
	}
	for _, s := range citusSpares {
		s.Destroy()
	}
}

// Cluster is the throwaway cluster, or nil when the tests use
// INBOXKEEPER_TEST_DATABASE_URL. Tests that restart the server need it.
func Cluster() *pgcluster.Cluster { return cluster }

// NewDatabase creates an empty database for the test, drops it at the end,
// and returns its connection string.
func NewDatabase(t testing.TB) string {
	t.Helper()
	url, drop, err := CreateDatabase(t.Name())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return url
}

// CreateDatabase creates an empty database named after label and returns
// its connection string and the function that drops it. It is for code that
// has no testing.T, such as runnable examples.
func CreateDatabase(label string) (url string, drop func() error, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("t_%d_%d_%s", os.Getpid(), seq.Add(1), sanitize(label))
	if len(name) > 60 {
		name = name[:60]
	}
	admin, err := pgx.Connect(ctx, adminDB)
	if err != nil {
		return "", nil, fmt.Errorf("connect to test server: %w (%s)", err, pgcluster.HowToFix)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return pgcluster.DropDatabase(ctx, adminDB, name)
	}
	return withDatabase(adminDB, name), drop, nil
}

// NewPool is NewDatabase plus a pool on it, closed at the end of the test.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := NewDatabase(t)
	return poolOn(t, url), url
}

// poolOn opens a pool on url, closed at the end of the test.
func poolOn(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	// Tests race several transactions at once; the default (4 on this
	// machine) would starve them.
	cfg.MaxConns = 20
	return PoolWith(t, cfg)
}

// PoolWith opens a pool configured by cfg (dbconn.Pool's: connections as
// the daemon makes them), closed at the end of the test.
func PoolWith(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Exec runs a statement and fails the test on error.
func Exec(t testing.TB, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("pgtest: %v\nSQL: %s", err, sql)
	}
}

func withDatabase(url, db string) string {
	// Only the database changes; every other parameter the caller gave stays.
	if strings.Contains(url, "://") {
		i := strings.Index(url, "://")
		rest := url[i+3:]
		path := strings.IndexAny(rest, "/?")
		host := rest
		query := ""
		if path >= 0 {
			host = rest[:path]
			if q := strings.Index(rest, "?"); q >= 0 {
				query = rest[q:]
			}
		}
		return url[:i+3] + host + "/" + db + query
	}
	return url + " dbname=" + db
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// NewCluster starts a cluster of the test's own, for tests whose signals are
// cluster-wide (standbys, replication slots, pg_stat_replication), and
// returns it with the URL of a migrated-nothing database "postgres" on it.
// It needs the local server binaries even when INBOXKEEPER_TEST_DATABASE_URL
// is set.
func NewCluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	return NewClusterWith(t, nil)
}

// NewClusterWith is NewCluster with extra postgresql.conf settings.
func NewClusterWith(t testing.TB, settings map[string]string) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: settings})
	if err != nil {
		t.Fatalf("pgtest: start a cluster: %v", err)
	}
	t.Cleanup(c.Destroy)
	return c
}

// NewStandby starts a streaming standby of c, removed at the end of the test.
func NewStandby(t testing.TB, c *pgcluster.Cluster, settings map[string]string) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := c.StartStandby(ctx, settings)
	if err != nil {
		t.Fatalf("pgtest: start a standby: %v", err)
	}
	t.Cleanup(s.Destroy)
	return s
}

// NewBouncer starts a PgBouncer in transaction pool mode in front of the
// test server, stopped at the end of the test. Its URL(db) reaches any
// database a test made with NewDatabase.
func NewBouncer(t testing.TB) *pgcluster.Bouncer {
	t.Helper()
	cfg, err := pgconn.ParseConfig(adminDB)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	host := cfg.Host
	if strings.HasPrefix(host, "/") {
		t.Fatalf("pgtest: the pooler tests need a TCP server address, not the socket %s (INBOXKEEPER_TEST_DATABASE_URL)", host)
	}
	return startBouncer(t, host, int(cfg.Port), cfg.User)
}

// startBouncer starts a PgBouncer in transaction mode in front of the
// server at host:port, letting in user and others, stopped at the end of
// the test.
func startBouncer(t testing.TB, host string, port int, user string, others ...string) *pgcluster.Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A port picked free can be taken by a parallel test's server before
	// the pooler binds it: then it exits, and another port is tried.
	var b *pgcluster.Bouncer
	var err error
	for attempt := 1; ; attempt++ {
		if b, err = pgcluster.StartBouncer(ctx, host, port, user, others...); err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("pgtest: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", b.Log())
		}
		b.Stop()
	})
	return b
}

// BouncerURL is url (from NewDatabase) with its host and port replaced by
// the pooler's.
func BouncerURL(t testing.TB, b *pgcluster.Bouncer, url string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return b.URL(cfg.Database)
}

// WaitFor polls cond until it holds, failing the test after timeout. It is
// for conditions only the database can report (a session waiting on a lock,
// a slot's position): tests wait on a condition, never a fixed sleep.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Freeze stops the process pid with SIGSTOP and returns once it is stopped
// (kill(2) returns before it is: on a loaded machine a "frozen" daemon was
// seen committing a batch afterwards), so wait for state T in /proc. The
// returned thaw sends SIGCONT; it also runs at the end of the test.
func Freeze(t testing.TB, pid int) (thaw func()) {
	t.Helper()
	var once sync.Once
	thaw = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("pgtest: SIGSTOP %d: %v", pid, err)
	}
	t.Cleanup(thaw)
	WaitFor(t, 30*time.Second, fmt.Sprintf("process %d to be stopped", pid), func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// The state follows the command name in parentheses: "pid (comm) T ...".
		i := bytes.LastIndexByte(b, ')')
		return err == nil && i > 0 && i+2 < len(b) && b[i+2] == 'T'
	})
	return thaw
}

// Migrate creates inboxkeeper's control schema in the database at url.
func Migrate(t testing.TB, url string) {
	t.Helper()
	withConn(t, url, func(conn *pgx.Conn) {
		if _, err := migrations.Migrate(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
	})
}

// NewMigratedPool is NewPool with the control schema migrated, then each of
// sql run: the start of most tests that run the daemon against a table.
func NewMigratedPool(t testing.TB, sql ...string) (*pgxpool.Pool, string) {
	t.Helper()
	pool, url := NewPool(t)
	migrateAndExec(t, pool, url, sql)
	return pool, url
}

// MigratedPoolOn is NewMigratedPool on a database of a cluster of the
// test's own (NewClusterWith).
func MigratedPoolOn(t testing.TB, url string, sql ...string) *pgxpool.Pool {
	t.Helper()
	pool := poolOn(t, url)
	migrateAndExec(t, pool, url, sql)
	return pool
}

func migrateAndExec(t testing.TB, pool *pgxpool.Pool, url string, sql []string) {
	t.Helper()
	Migrate(t, url)
	for _, s := range sql {
		Exec(t, pool, s)
	}
}

// Connect opens a connection of its own to url, closed at the end of the
// test: a session apart from the pool (one that holds locks, reads on a
// worker or a standby).
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	return ConnectAs(t, url, "")
}

// ConnConfig is url parsed: what a test reads of it (its database, its
// user) or connects with, changed.
func ConnConfig(t testing.TB, url string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return cfg
}

// ConnectAs is Connect with the session's application_name (none when
// ""): what pg_stat_activity, and so the daemon, names it by.
func ConnectAs(t testing.TB, url, application string) *pgx.Conn {
	t.Helper()
	cfg := ConnConfig(t, url)
	if application != "" {
		cfg.RuntimeParams["application_name"] = application
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// HoldHorizon opens a session named application (ConnectAs) that holds the
// xmin horizon until the test ends: a repeatable-read transaction that has
// run query. It returns the session, its pid and when its transaction began.
func HoldHorizon(t testing.TB, url, application, query string) (conn *pgx.Conn, pid int, since time.Time) {
	t.Helper()
	conn = ConnectAs(t, url, application)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; "+query); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), now()").Scan(&pid, &since); err != nil {
		t.Fatal(err)
	}
	return conn, pid, since
}

// ExecOn runs sql on a connection of its own to url, for a server the test
// has no pool on (a standby, a worker).
func ExecOn(t testing.TB, url, sql string, args ...any) {
	t.Helper()
	withConn(t, url, func(conn *pgx.Conn) { Exec(t, conn, sql, args...) })
}

// withConn runs f on a connection to url that is closed as soon as f
// returns, so that no session of the test's own lingers in the views the
// test reads.
func withConn(t testing.TB, url string, f func(*pgx.Conn)) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	f(conn)
}

// Beginner is what a transaction starts on: a pool, a connection.
type Beginner interface {
	Begin(context.Context) (pgx.Tx, error)
}

// Begin starts a transaction on db. One the test has not ended is rolled
// back at the end of the test, so that a failing test leaves no lock behind.
func Begin(t testing.TB, db Beginner) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(context.Background())
	if err != nil {
		t.Fatalf("pgtest: begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// Lock starts a transaction on db that runs sql (a SELECT ... FOR UPDATE, an
// UPDATE) and so holds its locks until the test commits or rolls it back:
// the application session a test makes the daemon meet.
func Lock(t testing.TB, db Beginner, sql string, args ...any) pgx.Tx {
	t.Helper()
	tx := Begin(t, db)
	Exec(t, tx, sql, args...)
	return tx
}

// Querier reads one row: a pool, a connection, a transaction.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// CurrentDatabase is the name of db's database: a test's roles and
// settings are named after it, so that tests side by side do not collide.
func CurrentDatabase(t testing.TB, db Querier) string {
	t.Helper()
	return Value[string](t, db, "SELECT current_database()")
}

// Value is the one value the query returns; an error fails the test.
func Value[T any](t testing.TB, db Querier, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("pgtest: %v\nSQL: %s", err, sql)
	}
	return v
}

// WaitForLockWait waits until a session of the test's database in view
// (pg_stat_activity, or citus_stat_activity for every node of a Citus
// cluster) waits on a lock while running a statement LIKE query
// (case-insensitive). The database filter keeps out parallel tests.
func WaitForLockWait(t testing.TB, db Querier, view, query, what string) {
	t.Helper()
	WaitFor(t, 30*time.Second, what, func() bool {
		var waiting bool
		_ = db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM `+view+`
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query ILIKE $1)`, query).Scan(&waiting)
		return waiting
	})
}

// QueueOnFence runs write, a hold or replay marker being written while a
// batch of the test's is held open, in the background; it waits until write
// queues on the fence (the SHARE lock on inboxkeeper.fence that waits for
// the batches in flight) and fails the test if write got past it. Write's error comes on
// the channel it returns once the batch has ended.
func QueueOnFence(t testing.TB, db Querier, write func() error) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- write() }()
	WaitForLockWait(t, db, "pg_stat_activity", "%LOCK TABLE inboxkeeper.fence IN SHARE MODE%", "the hold writer to queue on the fence")
	select {
	case err := <-done:
		t.Fatalf("the hold writer returned while a batch was in flight: %v", err)
	default:
	}
	return done
}

// WantInvalid fails the test unless err is a problem of a policy against
// the catalog (catalog.ErrInvalid) that mentions every want.
func WantInvalid(t testing.TB, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("error %v, want ErrInvalid", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// Resolve parses a policy file's text and resolves every table in it
// against db.
func Resolve(t testing.TB, db catalog.Querier, policyText string) []*catalog.Table {
	t.Helper()
	p, err := policy.Parse([]byte(policyText), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []*catalog.Table
	for _, pt := range p.Tables {
		ct, err := catalog.Resolve(context.Background(), db, pt)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ct)
	}
	return out
}

var (
	citusMu  sync.Mutex
	citus    *pgcluster.Citus // started by the first test that asks
	citusErr error
	// citusCreate serialises the tests' database setup on it.
	citusCreate sync.Mutex
)

// CitusWorkers is how many workers the test Citus cluster has.
const CitusWorkers = 2

// Citus returns the test binary's Citus cluster (a coordinator and
// CitusWorkers workers on this machine), starting it on first use. Without
// the Citus extension the test fails with the way to install it.
func Citus(t testing.TB) *pgcluster.Citus {
	t.Helper()
	citusMu.Lock()
	defer citusMu.Unlock()
	if citus == nil && citusErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		citus, citusErr = pgcluster.StartCitus(ctx, CitusWorkers, pgcluster.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	}
	if citusErr != nil {
		t.Fatalf("pgtest: start a Citus cluster: %v", citusErr)
	}
	return citus
}

// NewCitusDatabase creates a database of the test's own on every node of the
// Citus cluster, with the extension and the nodes registered, drops it at
// the end of the test, and returns the coordinator's URL for it.
func NewCitusDatabase(t testing.TB) string {
	t.Helper()
	c := Citus(t)
	name := fmt.Sprintf("c_%d_%d_%s", os.Getpid(), seq.Add(1), sanitize(t.Name()))
	if len(name) > 60 {
		name = name[:60]
	}
	// Parallel node registrations fail on Citus ("failure on connection
	// marked as essential"): one database at a time. The minute bounds
	// this test's creation, not its wait behind the others': started
	// before the lock, it ran out in a fresh-clone CI run where a test
	// waited its turn behind the package's other Citus tests.
	citusCreate.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	url, err := c.CreateDatabase(ctx, name)
	cancel()
	citusCreate.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DropDatabase(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("pgtest: Citus database: %v", err)
	}
	return url
}

// NewCitusPool is NewCitusDatabase plus a pool on the coordinator.
func NewCitusPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := NewCitusDatabase(t)
	return poolOn(t, url), url
}

// NewMigratedCitusPool is NewCitusPool with the control schema migrated,
// then each of sql run on the coordinator.
func NewMigratedCitusPool(t testing.TB, sql ...string) (*pgxpool.Pool, string) {
	t.Helper()
	pool, url := NewCitusPool(t)
	migrateAndExec(t, pool, url, sql)
	return pool, url
}

// CitusWorkerURL is the URL of database db on the worker of the test Citus
// cluster that listens on port (a nodeport of pg_dist_node), for a session
// straight on the worker, as an application's router query leaves one.
func CitusWorkerURL(t testing.TB, port int, db string) string {
	t.Helper()
	for _, w := range Citus(t).Workers {
		if w.Port == port {
			return w.URL(db)
		}
	}
	t.Fatalf("pgtest: no Citus worker on port %d", port)
	return ""
}

// CitusShards is the shard count the tests distribute a table with: two on
// each worker, so that a batch spans shards on one node and across nodes.
const CitusShards = 2 * CitusWorkers

// Distribute is the SQL that hash-distributes tables on column in
// CitusShards shards, every one after the first co-located with the first,
// as an inbox and its side tables are.
func Distribute(column string, tables ...string) string {
	sql := fmt.Sprintf("SET citus.shard_count = %d;", CitusShards)
	for i, table := range tables {
		colocate := ""
		if i > 0 {
			colocate = ", colocate_with => " + sqlident.QuoteLiteral(tables[0])
		}
		sql += fmt.Sprintf("\nSELECT create_distributed_table(%s, %s%s);", sqlident.QuoteLiteral(table), sqlident.QuoteLiteral(column), colocate)
	}
	return sql
}

// ShortInboxDDL creates the short inbox most tests fill: of the recommended
// layout (inbox.PlainDDL) only the identity, the event time and
// remember_until, the last two nullable so that a row can lack them, and the
// index on remember_until. ShortInboxPolicy is its policy file.
const ShortInboxDDL = `
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    event_time     timestamptz,
    remember_until timestamptz,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ON public.consumer_inbox (remember_until);`

// ShortInboxPolicy is the policy file of the table ShortInboxDDL creates.
const ShortInboxPolicy = `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    expires_at: remember_until
`

// ShortPartitionedDDL is the partitioned counterpart of ShortInboxDDL: the
// columns of the recommended partitioned layout (inbox.PartitionedDDL) the
// partition manager reads, partitioned by range of remember_until, with
// the index on the identity and no partition yet.
const ShortPartitionedDDL = `
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    event_time     timestamptz,
    remember_until timestamptz NOT NULL
) PARTITION BY RANGE (remember_until);
CREATE INDEX ON public.consumer_inbox (consumer, message_id);`

// TieredInboxDDL creates public.inbox, the tiered inbox the tests of the
// deleter, the demoter and the CLI fill: the columns of the recommended
// layout (inbox.PlainDDL) but the outcome, the timestamps nullable, and one
// payload column kept in place; with the index on remember_until and the
// partial index on first_seen_at the demoter scans. TieredInboxPolicy is its
// policy file.
const TieredInboxDDL = `
CREATE TABLE public.inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_hash   bytea       NOT NULL,
    event_time     timestamptz,
    first_seen_at  timestamptz,
    remember_until timestamptz,
    business_key   text,
    payload        text,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ON public.inbox (remember_until);
CREATE INDEX ON public.inbox (first_seen_at) WHERE payload IS NOT NULL;`

// TieredPolicyHead is public.inbox's policy entry with its tiers (hot for
// three days from first_seen_at, a permanent business key hashed by
// payload_hash) up to where the payload is named: a test appends
// payload_columns or payload_table to suit its table.
const TieredPolicyHead = `tables:
  - table: public.inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    first_seen: first_seen_at
    expires_at: remember_until
    tiers:
      hot_for: 3d
      anchor: first_seen_at
      permanent_key: {columns: [consumer, business_key], hash: payload_hash}
`

// TieredInboxPolicy is the policy file of the table TieredInboxDDL creates:
// TieredPolicyHead with the payload in place.
const TieredInboxPolicy = TieredPolicyHead + "      payload_columns: [payload]\n"
