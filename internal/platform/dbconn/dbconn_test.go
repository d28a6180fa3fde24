package dbconn

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// timeouts are the settings TxSettings sets, as q's session has them.
func timeouts(t *testing.T, q Querier) [4]string {
	t.Helper()
	var s [4]string
	if err := q.QueryRow(context.Background(), `SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
  current_setting('idle_in_transaction_session_timeout'), current_setting('plan_cache_mode')`).Scan(&s[0], &s[1], &s[2], &s[3]); err != nil {
		t.Fatal(err)
	}
	return s
}

// Open tells a direct connection from one through a transaction pooler,
// and makes the pool safe behind the pooler: no named statement is left on
// a server connection another client gets next.
func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)

	var dials atomic.Int32
	countDials := func(c *pgconn.Config) {
		dial := c.DialFunc
		c.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dial(ctx, network, addr)
		}
	}
	pool, pooled, err := Open(ctx, url, 3, 2, AppName("once"), countDials)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Both warm connections open before Open returns, idle in the pool,
	// and the probe for a pooler ran on one of them: no third connection.
	if st := pool.Stat(); st.TotalConns() != 2 || st.IdleConns() != 2 || dials.Load() != 2 {
		t.Errorf("a direct pool asked for 2 warm connections: %d open, %d idle, %d dialled", st.TotalConns(), st.IdleConns(), dials.Load())
	}
	if pooled || pool.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		t.Errorf("a direct connection: pooled %v, query mode %v", pooled, pool.Config().ConnConfig.DefaultQueryExecMode)
	}
	var app string
	if err := pool.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&app); err != nil || app != "inboxkeeper once" {
		t.Errorf("application_name %q (%v), want the command's", app, err)
	}
	sendsCancels := func(p *pgxpool.Pool) bool {
		t.Helper()
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		return SendsCancelRequests(c.Conn())
	}
	if !sendsCancels(pool) {
		t.Error("a direct connection: a cancelled context sends no cancel request")
	}

	viaBouncer := pgtest.BouncerURL(t, pgtest.NewBouncer(t), url)
	bpool, pooled, err := Open(ctx, viaBouncer, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer bpool.Close()
	if !pooled || bpool.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheDescribe {
		t.Errorf("through PgBouncer: pooled %v, query mode %v", pooled, bpool.Config().ConnConfig.DefaultQueryExecMode)
	}
	if sendsCancels(bpool) {
		t.Error("through PgBouncer: a cancelled context sends a cancel request (PgBouncer 1.18 can crash on one)")
	}
	// The same query from many clients on the pooler's few server
	// connections: a named statement left behind would fail one (42P05).
	for range 20 {
		var n int
		if err := bpool.QueryRow(ctx, "SELECT $1::int", 7).Scan(&n); err != nil || n != 7 {
			t.Fatalf("through PgBouncer: %d, %v", n, err)
		}
	}
}

// A connection string that does not parse is an error that never shows
// the string, which may hold a password; one that names no server says
// where it tried, without the password.
func TestBadURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bad := "postgres://inboxkeeper:s3cret@db:notaport/app"
	_, _, err := Open(ctx, bad, 2, 1)
	if !errors.Is(err, ErrBadURL) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Open(unparseable): %v, want ErrBadURL without the password", err)
	}
	if _, err := Dial(ctx, bad); !errors.Is(err, ErrBadURL) {
		t.Errorf("Dial(unparseable): %v, want ErrBadURL", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = Dial(cctx, "postgres://inboxkeeper:s3cret@127.0.0.1:1/app?connect_timeout=5")
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "connect to postgres://inboxkeeper:***@127.0.0.1:1/app") {
		t.Errorf("Dial(no server): %v, want the address with the password hidden", err)
	}
}

// A failed connection says its cause once: a database that does not exist
// is the configuration's, a server that does not answer is not; a pool's
// failure while it runs is classified alike.
func TestConnectErrorCauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	noDB := strings.Replace(url, "/"+pgtest.ConnConfig(t, url).Database+"?", "/ik_no_such_db?", 1)
	_, _, err := Open(ctx, noDB, 2, 2)
	var ce *ConnectError
	if !errors.As(err, &ce) || ce.Cause != CauseUnknownDatabase || !IsConfigError(err) || !strings.Contains(err.Error(), `database "ik_no_such_db" does not exist (SQLSTATE 3D000)`) {
		t.Errorf("Open(no such database): %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = Dial(cctx, "postgres://u@127.0.0.1:1/app")
	if !errors.As(err, &ce) || ce.Cause != CauseUnreachable || IsConfigError(err) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Dial(no server): %v, want unreachable, in one line", err)
	}
	pc, err := Pool(noDB, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = InRecovery(ctx, pool)
	if err = Classify(err); !errors.As(err, &ce) || ce.Cause != CauseUnknownDatabase || !strings.HasPrefix(err.Error(), "connect to postgres@") {
		t.Errorf("a pool's failure classified: %v", err)
	}
}

// TxSettings are local to the transaction (nothing is left on a
// connection a pooler hands on), and name its backend.
func TestTxSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	before := timeouts(t, conn)

	tx := pgtest.Begin(t, conn)
	b, err := TxSettings{LockTimeout: 50 * time.Millisecond, StatementTimeout: 2 * time.Second, CustomPlans: true}.Apply(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	var start time.Time
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), now()").Scan(&pid, &start); err != nil {
		t.Fatal(err)
	}
	if b.PID != pid || !b.XactStart.Equal(start) {
		t.Errorf("the backend %+v, want pid %d and the transaction's start %s", b, pid, start)
	}
	if in := timeouts(t, tx); in != [4]string{"50ms", "2s", "10s", "force_custom_plan"} {
		t.Errorf("in the transaction: lock_timeout, statement_timeout, idle_in_transaction_session_timeout (the default) and plan_cache_mode are %q", in)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if after := timeouts(t, conn); after != before {
		t.Errorf("the settings outlived the transaction: %q, before it %q", after, before)
	}

	// The session ends a transaction left idle past the timeout: a frozen
	// daemon lets go of its locks.
	tx = pgtest.Begin(t, conn)
	b, err = TxSettings{IdleInTx: 100 * time.Millisecond}.Apply(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	watcher := pgtest.Connect(t, conn.Config().ConnString())
	pgtest.WaitFor(t, 10*time.Second, "the idle transaction's session to end", func() bool {
		var gone bool
		err := watcher.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", b.PID).Scan(&gone)
		return err == nil && gone
	})
}

// A cancelled context sends the server a cancel request: the backend stops
// the statement at once (and lets go of its locks), instead of running it
// to the end behind a closed socket.
func TestCancel(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	conn, err := Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid uint32
	if err := conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "SELECT pg_sleep(60)")
		done <- err
	}()
	watcher := pgtest.Connect(t, url)
	running := func() bool {
		var n int
		_ = watcher.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%' AND state = 'active'", pid).Scan(&n)
		return n == 1
	}
	pgtest.WaitFor(t, 10*time.Second, "the statement to run", running)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the cancelled statement succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled statement still ran 30 s later")
	}
	pgtest.WaitFor(t, 10*time.Second, "the backend to stop the statement", func() bool { return !running() })
}

// InRecovery and Now read the database, never the host.
func TestDatabaseFacts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	if standby, err := InRecovery(ctx, conn); err != nil || standby {
		t.Errorf("the test server in recovery: %v, %v", standby, err)
	}
	tx := pgtest.Begin(t, conn)
	first, err := Now(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, tx, "SELECT pg_sleep(0.01)")
	if again, err := Now(ctx, tx); err != nil || !again.Equal(first) {
		t.Errorf("now() moved within a transaction: %s then %s (%v)", first, again, err)
	}
}

// A connection built here keeps the notices of a statement run while it is
// watched, in order, and drops those sent before or after.
func TestWatchNotices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := Dial(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	warn := func(msg string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `DO $$ BEGIN RAISE WARNING '`+msg+`' USING ERRCODE = '55P03'; RAISE NOTICE 'and a notice'; END $$`); err != nil {
			t.Fatal(err)
		}
	}
	warn("before")
	w := WatchNotices(conn.PgConn())
	warn("during")
	got := w.Stop()
	warn("after")
	if len(got) != 2 || got[0].Severity != "WARNING" || got[0].Code != "55P03" || got[0].Message != "during" || got[1].Severity != "NOTICE" {
		var s []string
		for _, n := range got {
			s = append(s, n.Severity+" "+n.Code+" "+n.Message)
		}
		t.Fatalf("kept %q, want the WARNING 55P03 \"during\" and its NOTICE", s)
	}
	if _, ok := watched.Load(conn.PgConn()); ok {
		t.Error("the connection is still watched after Stop")
	}
}
