// Package setup is what a command prepares before it runs anything, and the
// checks it makes on the way: the policy file, the connections (and the
// session of its own that partition DDL, compaction and migrate need), the
// control schema, the policy's tables resolved against the catalog, the
// listed standbys, the throttle's query and the lease. Nothing runs before
// all of that holds; what does not hold is a pass.ConfigError or
// pass.UsageError (exit 2), naming the variable or the file.
package setup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/retention"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Command is what one command shares; its connections are opened on first
// use, and closed by Close.
type Command struct {
	Cfg config.Config
	Log *slog.Logger
	// Name names the command's connections (application_name "inboxkeeper
	// run") and the role a refusal says it needs ("hold add").
	Name string

	pool *pgxpool.Pool
	// pooled: the connection goes through a pooler (see dbconn.Pooled), so
	// nothing may rely on session state over DATABASE_URL.
	pooled bool
	// ddl is the pool on INBOXKEEPER_SESSION_DATABASE_URL for partition
	// DDL and compaction, when that is set and needed (SessionFor).
	ddl *pgxpool.Pool
	// unreadAtStart: a listed standby did not answer Preflight's check
	// (and REPLICA_FAIL_OPEN is off); Once checks again at the end.
	unreadAtStart bool
}

// Close closes the command's connections.
func (c *Command) Close() {
	if c.ddl != nil {
		c.ddl.Close()
	}
	if c.pool != nil {
		c.pool.Close()
	}
}

// warmConns is how many connections Connect opens before it returns:
// three for the commands that run passes, whose first pass takes three
// within its first 50 ms (the deleter's, the throttle's first reading, the
// heap's sample read beside the first count: a process's first pass reads
// it whatever is due; dbconn.Open); one for the others.
func (c *Command) warmConns() int32 {
	switch c.Name {
	case "once", "run", "demo":
		return 3
	}
	return 1
}

// Connect opens the pool on INBOXKEEPER_DATABASE_URL, once, and checks the
// server's version.
func (c *Command) Connect(ctx context.Context) (*pgxpool.Pool, error) {
	if c.pool != nil {
		return c.pool, nil
	}
	// The deleter uses one connection; the throttle's collectors a few more.
	pool, pooled, err := dbconn.Open(ctx, c.Cfg.DatabaseURL, 8, c.warmConns(), dbconn.AppName(c.Name))
	if err != nil {
		return nil, connectFailed("INBOXKEEPER_DATABASE_URL", c.Cfg.DatabaseURL, err)
	}
	if err := c.checkServer(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	c.Log.Debug("inboxkeeper: connected", "database", config.RedactURL(c.Cfg.DatabaseURL), "pooler", pooled)
	c.pool, c.pooled = pool, pooled
	return pool, nil
}

// checkServer refuses a PostgreSQL older than the supported majors (exit
// 2, before anything is read or written) and warns about one newer than
// the majors tested: it runs there, as a refusal would stop every cleanup
// on the day of an upgrade and let the inbox grow.
func (c *Command) checkServer(ctx context.Context, pool *pgxpool.Pool) error {
	srv, err := dbconn.PoolServer(ctx, pool)
	if err != nil {
		return connectFailed("INBOXKEEPER_DATABASE_URL", c.Cfg.DatabaseURL, err)
	}
	if err := srv.Check(); err != nil {
		return pass.ConfigError{Err: fmt.Errorf("INBOXKEEPER_DATABASE_URL (%s): %w", config.RedactURL(c.Cfg.DatabaseURL), err)}
	}
	if srv.Untested() {
		c.Log.Warn("inboxkeeper: the server's PostgreSQL is newer than the majors inboxkeeper is tested with; it runs, untested",
			"server_version", srv.Version, "tested", fmt.Sprintf("%d to %d", dbconn.OldestMajor, dbconn.NewestMajor))
	}
	return nil
}

// SessionURL is the connection string for what needs a session of its own
// (DETACH ... CONCURRENTLY and its session-level fence, the migration
// lock): INBOXKEEPER_SESSION_DATABASE_URL when set, else DATABASE_URL unless
// that goes through a pooler, where a session-level lock or setting would
// leak to whichever client gets the server connection next. Then the
// caller is refused before it touches anything. Call Connect first.
func (c *Command) SessionURL(what string) (string, error) {
	if c.Cfg.SessionURL != "" {
		return c.Cfg.SessionURL, nil
	}
	if c.pooled {
		return "", pass.ConfigError{Err: fmt.Errorf("%s needs a database session of its own, but INBOXKEEPER_DATABASE_URL (%s) goes through a connection pooler, "+
			"where session state leaks between clients; set INBOXKEEPER_SESSION_DATABASE_URL to a direct connection (or a session-mode pool) for it",
			what, config.RedactURL(c.Cfg.DatabaseURL))}
	}
	return c.Cfg.DatabaseURL, nil
}

// TxSettings are the settings of the transactions a command opens itself.
func (c *Command) TxSettings() dbconn.TxSettings {
	return dbconn.TxSettings{StatementTimeout: c.Cfg.StatementTimeout, IdleInTx: c.Cfg.IdleTimeout}
}

// SessionConn opens a connection of its own to url (from SessionURL).
func (c *Command) SessionConn(ctx context.Context, url string) (*pgx.Conn, error) {
	conn, err := dbconn.Dial(ctx, url, dbconn.AppName(c.Name))
	if err != nil {
		name := "INBOXKEEPER_DATABASE_URL"
		if url == c.Cfg.SessionURL {
			name = "INBOXKEEPER_SESSION_DATABASE_URL"
		}
		return nil, connectFailed(name, url, err)
	}
	return conn, nil
}

// connectFailed names the variable of a connection that failed. A string
// that does not parse, and a failure that is the configuration's (the
// password, the role's grants, the database's name: dbconn.IsConfigError),
// are configuration errors: exit 2.
func connectFailed(variable, url string, err error) error {
	switch red := config.RedactURL(url); {
	case errors.Is(err, dbconn.ErrBadURL) && strings.HasPrefix(red, "("):
		// Not even redacted: it is not shown, as it may hold a password.
		return pass.ConfigError{Err: fmt.Errorf("%s: %w; the string is not shown, as it may hold a password", variable, err)}
	case errors.Is(err, dbconn.ErrBadURL):
		return pass.ConfigError{Err: fmt.Errorf("%s %s: %w", variable, red, err)}
	case dbconn.IsConfigError(err):
		return pass.ConfigError{Err: fmt.Errorf("%s: %w", variable, err)}
	}
	return fmt.Errorf("%s: %w", variable, err)
}

// LoadPolicy reads and checks INBOXKEEPER_POLICY_FILE, its retention
// section included: a broken one makes the whole file suspect.
func (c *Command) LoadPolicy() (*policy.Policy, error) {
	p, err := policy.Load(c.Cfg.PolicyFile)
	var unreadable *fs.PathError
	if errors.As(err, &unreadable) {
		// Named by its variable: the default (./inboxkeeper.yaml) is
		// relative to wherever the command runs.
		return nil, pass.ConfigError{Err: fmt.Errorf("INBOXKEEPER_POLICY_FILE: cannot read the policy file %s: %v", c.Cfg.PolicyFile, unreadable.Err)}
	}
	if err != nil {
		return nil, pass.ConfigError{Err: err}
	}
	if _, err := retention.Load(p); err != nil {
		return nil, pass.ConfigError{Err: err}
	}
	return p, nil
}

// Prepare loads the policy, connects, checks the control schema and
// resolves every table against the catalog: nothing runs before all of
// that holds.
func (c *Command) Prepare(ctx context.Context) (*pgxpool.Pool, []*catalog.Table, error) {
	p, err := c.LoadPolicy()
	if err != nil {
		return nil, nil, err
	}
	pool, err := c.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	// A missing or old control schema and a policy that does not match the
	// catalog are reported together: fixing one must not reveal the other
	// only on the next try.
	schemaErr := migrations.Check(ctx, pool)
	if schemaErr != nil && !pass.IsSetupError(schemaErr) {
		return nil, nil, schemaErr
	}
	tables, err := catalog.ResolveAll(ctx, pool, p)
	if err != nil || schemaErr != nil {
		return nil, nil, errors.Join(schemaErr, err)
	}
	catalog.WarnLocalTime(ctx, pool, tables, c.Log)
	return pool, tables, nil
}

// PreparePrimary is Prepare for commands that change the database: against
// a standby the pool is nil, and the command does nothing
// (OnStandby says so).
func (c *Command) PreparePrimary(ctx context.Context) (*pgxpool.Pool, []*catalog.Table, error) {
	pool, tables, err := c.Prepare(ctx)
	if err != nil {
		return nil, nil, err
	}
	if standby, err := dbconn.InRecovery(ctx, pool); err != nil || standby {
		return nil, nil, err
	}
	return pool, tables, nil
}

// OnStandby is what a command that changes the database says when it finds
// a standby.
const OnStandby = "the database is a standby (in recovery): nothing to do here; run inboxkeeper against the primary"

// PrepareWithRetry is Prepare for a daemon: what is not there yet is
// waited for (pass.WaitForSetup), and the policy file is read again on
// every try, so a corrected ConfigMap is picked up. A bad environment or a
// policy file that does not parse still ends it (exit 2). The permanent
// key tables must exist too: a deletion writes its keys in the same
// statement. Nil tables and no error: ctx ended.
func (c *Command) PrepareWithRetry(ctx context.Context, ms *pass.Metrics) (pool *pgxpool.Pool, tables []*catalog.Table, err error) {
	err = pass.WaitForSetup(ctx, c.Log, ms.Daemon.PolicyMismatch, func(err error) bool {
		// A connection refused for a reason of the configuration's is waited
		// for: a password, a grant or a database can change while it runs.
		var ce pass.ConfigError
		var ue pass.UsageError
		var conn *dbconn.ConnectError
		return (errors.As(err, &ce) || errors.As(err, &ue)) && !errors.As(err, &conn)
	}, func() error {
		if pool, tables, err = c.Prepare(ctx); err != nil {
			return err
		}
		return tiering.EnsureKeyTables(ctx, pool, tables, c.Log)
	})
	if ctx.Err() != nil {
		return nil, nil, nil
	}
	if err == nil {
		err = c.SessionForPartitions(ctx, tables)
	}
	return pool, tables, err
}

// ReloadPolicy loads and checks the policy file against the database, as
// at startup, without touching anything: pass.Schedule's Reload.
func (c *Command) ReloadPolicy(ctx context.Context) ([]*catalog.Table, error) {
	p, err := c.LoadPolicy()
	if err != nil {
		return nil, err
	}
	tables, err := catalog.ResolveAll(ctx, c.pool, p)
	if err != nil {
		return nil, err
	}
	if err := tiering.EnsureKeyTables(ctx, c.pool, tables, c.Log); err != nil {
		return nil, err
	}
	if err := c.SessionForPartitions(ctx, tables); err != nil {
		return nil, err
	}
	catalog.WarnLocalTime(ctx, c.pool, tables, c.Log)
	return tables, nil
}

// SessionForPartitions makes sure, before anything is touched, that the
// partition DDL of tables can have sessions of its own (DETACH ...
// CONCURRENTLY cannot run in a transaction, and its fence is a session
// lock), and so can the compaction of a table whose policy asks for one
// (CompactionSession), and opens a pool on INBOXKEEPER_SESSION_DATABASE_URL
// for them when that is set. A dry run does no DDL, but checks the same: it
// is how a change is tried before it runs.
func (c *Command) SessionForPartitions(ctx context.Context, tables []*catalog.Table) error {
	switch {
	case slices.ContainsFunc(tables, (*catalog.Table).Partitioned):
		return c.SessionFor(ctx, "partition DDL (DETACH ... CONCURRENTLY under the hold fence)")
	case slices.ContainsFunc(tables, func(t *catalog.Table) bool { return t.Policy.Compact != nil }):
		return c.SessionFor(ctx, CompactionSession)
	}
	return nil
}

// CompactionSession is what the compaction needs a session for: its VACUUM
// cannot run in a transaction, so its settings are the session's.
const CompactionSession = "compaction (its VACUUM cannot run in a transaction, so its lock_timeout and cost delay are session settings)"

// SessionFor opens the pool of sessions of their own that what needs, or
// says why there can be none (SessionURL).
func (c *Command) SessionFor(ctx context.Context, what string) error {
	if c.ddl != nil {
		return nil
	}
	url, err := c.SessionURL(what)
	if err != nil || url != c.Cfg.SessionURL {
		return err // DATABASE_URL is direct: the main pool serves
	}
	pool, err := dbconn.OpenDirect(ctx, url, 4, dbconn.AppName(c.Name))
	if err != nil {
		return connectFailed("INBOXKEEPER_SESSION_DATABASE_URL", url, err)
	}
	c.ddl = pool
	return nil
}

// ControlPool connects and checks the control schema: for the commands
// that read or write only it.
func (c *Command) ControlPool(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return pool, migrations.Check(ctx, pool)
}

// Wiring is what the services of a pass share.
func (c *Command) Wiring(pool *pgxpool.Pool, dryRun bool, ms *pass.Metrics, progress func(expiry.Progress)) pass.Wiring {
	return pass.Wiring{Pool: pool, DDLPool: c.ddl, Log: c.Log, DryRun: dryRun, Metrics: ms, Progress: progress}
}

// MigrateKeyTables is the part of `migrate` that creates the permanent key
// tables the policy names, as the owner, so that the daemon's role needs no
// CREATE privilege; say is given a line for each. migrate does not need a
// policy: without a readable policy file, or with tables not created yet,
// it says so and goes on. It says so loudly, because a migrate Job without
// the policy mounted leaves a tiered policy's daemon waiting for its key
// table.
func (c *Command) MigrateKeyTables(ctx context.Context, conn *pgx.Conn, say func(string)) {
	if _, err := os.Stat(c.Cfg.PolicyFile); errors.Is(err, os.ErrNotExist) {
		say(fmt.Sprintf("permanent key tables: none checked, no policy file at %s (INBOXKEEPER_POLICY_FILE); "+
			"with a tiers: section in the policy, mount it and run migrate again", c.Cfg.PolicyFile))
		return
	}
	p, err := c.LoadPolicy()
	if err != nil {
		say(fmt.Sprintf("permanent key tables: skipped, the policy file does not load: %v", err))
		return
	}
	for _, pt := range p.Tables {
		if pt.Tiers == nil || pt.Tiers.PermanentKey == nil {
			continue
		}
		t, err := catalog.Resolve(ctx, conn, pt)
		if err != nil {
			say(fmt.Sprintf("permanent key table of %s: skipped: %v", pt.Name, err))
			continue
		}
		created, err := tiering.EnsureKeyTable(ctx, conn, t)
		switch {
		case err != nil:
			say(fmt.Sprintf("permanent key table of %s: %v", pt.Name, err))
		case created:
			say(fmt.Sprintf("permanent key table %s created for %s", tiering.KeyOf(t).Name, t.Name))
		default:
			say(fmt.Sprintf("permanent key table %s of %s exists", tiering.KeyOf(t).Name, t.Name))
		}
	}
}
