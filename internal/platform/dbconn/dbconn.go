// Package dbconn builds connection configurations the same way for every
// connection the daemon opens, and tells whether a connection goes through
// a transaction pooler (PgBouncer and the like).
package dbconn

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// Option adjusts a connection configuration.
type Option func(*pgconn.Config)

// AppName sets application_name to "inboxkeeper <command>" (say "inboxkeeper
// run" or "inboxkeeper hold add"), so that pg_stat_activity, pg_locks
// reports and PgBouncer's SHOW CLIENTS tell which inboxkeeper holds what.
// An application_name given in the connection string wins.
func AppName(command string) Option {
	return func(c *pgconn.Config) {
		if c.RuntimeParams["application_name"] == "" && command != "" {
			c.RuntimeParams["application_name"] = "inboxkeeper " + command
		}
	}
}

// base makes a cancelled context send a cancel request to the server. pgx's
// default only closes the socket, and a backend busy in a statement notices
// that late, keeping its row locks meanwhile: a stopped or backing-off
// daemon must release its locks at once. It also routes the connection's
// notices to WatchNotices.
func base(c *pgconn.Config, opts []Option) {
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
	c.OnNotice = onNotice // kept for a connection being watched (WatchNotices)
	for _, o := range opts {
		o(c)
	}
	if c.RuntimeParams["application_name"] == "" {
		c.RuntimeParams["application_name"] = "inboxkeeper"
	}
}

// Pool parses url (empty: libpq's PG* variables) into a pool configuration.
func Pool(url string, maxConns int32, opts ...Option) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, badURL(err)
	}
	pc.MaxConns = maxConns
	pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > PingAfterIdle }
	base(&pc.ConnConfig.Config, opts)
	return pc, nil
}

// PingAfterIdle is how long a pooled connection may sit idle before it is
// pinged when taken again. pgx pings after one second, and the daemon's
// cadences (the lease renewed every LEASE_TTL/3, passes every few seconds)
// leave its connections idle for a few seconds at a time: every use was a
// ping and a statement, two transactions in pg_stat_database. A connection
// idle this long is still checked, as one a restart or a session timeout
// may have closed; a failure on a connection used sooner is retried or
// read again, as any failed statement is.
const PingAfterIdle = 30 * time.Second

// Conn parses url into a single-connection configuration.
func Conn(url string, opts ...Option) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, badURL(err)
	}
	base(&cc.Config, opts)
	return cc, nil
}

// Pooled reports whether conn reaches PostgreSQL through a connection
// pooler. A pooler answers the startup with a backend key of its own, so the
// process id the connection was told differs from the one the server reports.
// That holds for PgBouncer in every pool mode, Odyssey, pgcat and
// pgpool-II alike: inboxkeeper cannot tell a transaction pool from a session
// pool, so it assumes the worst (no session state survives a transaction)
// unless INBOXKEEPER_SESSION_DATABASE_URL names a connection for sessions.
func Pooled(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	// The simple protocol: a named statement would stay behind on the
	// pooler's server connection for the next client to trip over.
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	return pid != conn.PgConn().PID(), nil
}

// ForPooler makes a configuration safe behind a transaction pooler: queries
// use unnamed prepared statements (with cached descriptions, still one round
// trip each), so that no named statement is left on a server connection
// another client gets next (SQLSTATE 42P05, "prepared statement ... already
// exists"). A query execution mode chosen in the connection string stays.
//
// A cancelled context lets the statement in flight finish for up to
// PoolerCancelDelay before the connection is cut, instead of sending a
// cancel request at once: PgBouncer 1.18 (Debian 12's) can crash on a cancel
// request that races with the client's disconnect, taking every client of
// the pooler down with it. Batch statements take well under that delay, so
// a shutdown waits for the one in flight and rolls its transaction back
// (nothing commits after the context ends); only a statement still running
// after the delay gets a cancel request, when pgx closes its connection.
func ForPooler(c *pgx.ConnConfig) {
	if c.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		c.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn(), DeadlineDelay: PoolerCancelDelay}
	}
}

// PoolerCancelDelay is how long a statement behind a pooler may go on after
// its context ended.
const PoolerCancelDelay = 5 * time.Second

// Querier reads a row: pgx.Tx, *pgx.Conn, *pgxpool.Conn.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// TxSettings are what every transaction inboxkeeper opens sets for itself
// with set_config(..., true): local to the transaction, so that nothing is
// left on a server connection a pooler hands to another client. A zero
// duration leaves that setting alone, except IdleInTx, which defaults to
// config.DefaultIdleTimeout: no transaction of ours may stay open, holding the hold
// fence or row locks, after its process froze or vanished.
type TxSettings struct {
	LockTimeout, StatementTimeout, IdleInTx time.Duration
	// CustomPlans sets plan_cache_mode to force_custom_plan: batch
	// statements are planned for their own parameters every time.
	CustomPlans bool
	// Citus also sends the timeouts to the workers a statement on a
	// distributed table reaches. set_config() stays on the coordinator, so
	// without this a worker waits for an application's row lock for as
	// long as its own lock_timeout says (none by default). Citus forwards
	// SET LOCAL commands to the workers' transactions when
	// citus.propagate_set_commands is 'local'.
	Citus bool
}

// Backend identifies the transaction a TxSettings.Apply ran in: the server
// process id of its backend (behind a pooler the connection's own backend
// key is the pooler's, and the server connection changes per transaction)
// and the transaction's start (its now()).
type Backend struct {
	PID       uint32
	XactStart time.Time
}

// Apply sets them in tx, in one round trip, and returns its backend.
func (s TxSettings) Apply(ctx context.Context, tx Querier) (b Backend, err error) {
	sql, args := s.query()
	if err = tx.QueryRow(ctx, sql, args...).Scan(&b.PID, &b.XactStart, nil); err != nil || !s.Citus {
		return b, err
	}
	idle := s.idle()
	// SET takes no parameters; the values are our own durations.
	local := []string{"SET LOCAL citus.propagate_set_commands TO 'local'",
		fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout TO '%s'", retry.Millis(idle))}
	for _, kv := range []struct {
		name string
		d    time.Duration
	}{{"lock_timeout", s.LockTimeout}, {"statement_timeout", s.StatementTimeout}} {
		if kv.d > 0 {
			local = append(local, fmt.Sprintf("SET LOCAL %s TO '%s'", kv.name, retry.Millis(kv.d)))
		}
	}
	ex, ok := tx.(interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	})
	if !ok {
		return b, fmt.Errorf("dbconn: %T cannot run SET LOCAL for Citus", tx)
	}
	// Without arguments pgx sends the statements in one simple-protocol
	// round trip.
	if _, err := ex.Exec(ctx, strings.Join(local, "; ")); err != nil {
		return b, fmt.Errorf("set the timeouts for the Citus workers: %w", err)
	}
	return b, nil
}

// Queue queues on b what Apply sends, its backend read into into, for a
// transaction that sends its first statements in one round trip. Citus
// needs statements Apply sends after it: an error.
func (s TxSettings) Queue(b *pgx.Batch, into *Backend) error {
	if s.Citus {
		return fmt.Errorf("dbconn: the settings for Citus workers cannot be queued")
	}
	sql, args := s.query()
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&into.PID, &into.XactStart, nil) })
	return nil
}

func (s TxSettings) idle() time.Duration {
	if s.IdleInTx <= 0 {
		return config.DefaultIdleTimeout
	}
	return s.IdleInTx
}

// query is the statement that sets them and reads the backend.
func (s TxSettings) query() (string, []any) {
	sets := []string{"set_config('idle_in_transaction_session_timeout', $1, true)"}
	args := []any{retry.Millis(s.idle())}
	for _, kv := range []struct {
		name string
		d    time.Duration
	}{{"lock_timeout", s.LockTimeout}, {"statement_timeout", s.StatementTimeout}} {
		if kv.d > 0 {
			args = append(args, retry.Millis(kv.d))
			sets = append(sets, fmt.Sprintf("set_config('%s', $%d, true)", kv.name, len(args)))
		}
	}
	if s.CustomPlans {
		sets = append(sets, "set_config('plan_cache_mode', 'force_custom_plan', true)")
	}
	// JIT compiles a statement's expressions while planning it, and does
	// not look at cancellation meanwhile: a statement carrying thousands of
	// hold predicates spent minutes there, past statement_timeout and
	// pg_terminate_backend. Nothing the daemon runs is long enough for JIT
	// to pay for itself.
	sets = append(sets, "set_config('jit', 'off', true)")
	return "SELECT pg_backend_pid(), now(), concat_ws(',', " + strings.Join(sets, ", ") + ")", args
}

// Durable runs fn in a transaction whose COMMIT returns only once the
// commit is flushed to disk: a hold, a replay marker, a pause or a setting
// must survive a crash from the moment its command says it was written,
// whatever synchronous_commit the server, the database or the role set
// (off loses up to 3 x wal_writer_delay of commits in a crash). A stronger
// setting already in force (on, remote_write, remote_apply) stays.
func Durable(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := MakeDurable(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// MakeDurable makes the transaction tx's COMMIT durable, as Durable does,
// for a caller that opened the transaction itself.
func MakeDurable(ctx context.Context, tx Querier) error {
	var s string
	if err := tx.QueryRow(ctx, durableSQL).Scan(&s); err != nil {
		return fmt.Errorf("make the commit durable (synchronous_commit): %w", err)
	}
	return nil
}

// durableSQL raises synchronous_commit to on for the transaction when it is
// off or local (local waits for the local flush but not for a synchronous
// standby: a failover would lose the write).
const durableSQL = DurableCTE

// DurableCTE is durableSQL for a single statement in a transaction of its
// own, as a CTE it reads from (WITH s AS (DurableCTE) ... FROM ..., s): the
// setting is the transaction's when it commits.
const DurableCTE = `SELECT CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')
  THEN set_config('synchronous_commit', 'on', true) ELSE current_setting('synchronous_commit') END`

// InRecovery reports whether the database is a standby.
func InRecovery(ctx context.Context, db Querier) (bool, error) {
	var standby bool
	err := db.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby)
	return standby, err
}

// Now is the database's now(): inboxkeeper never asks the host clock.
func Now(ctx context.Context, db Querier) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, "SELECT now()").Scan(&now)
	return now, err
}

// SendsCancelRequests reports whether a cancelled context sends conn's
// backend a cancel request (base), as opposed to cutting the connection
// after a delay (ForPooler, and pgx's default). A caller may then send one
// itself (pgconn.PgConn.CancelRequest) where it would cancel a context, so
// long as it closes the connection after the statement returns: pgx waits
// 100 ms after its own cancel request before the connection runs anything
// else, as the request may reach the backend late.
func SendsCancelRequests(conn *pgx.Conn) bool {
	build := conn.Config().BuildContextWatcherHandler
	if build == nil {
		return false
	}
	_, ok := build(conn.PgConn()).(*pgconn.CancelRequestContextWatcherHandler)
	return ok
}
