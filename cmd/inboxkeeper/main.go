// Command inboxkeeper keeps PostgreSQL inbox (deduplication) tables from
// growing forever without forgetting a message identity too early.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	_ "time/tzdata" // INBOXKEEPER_ACTIVE_TZ works in images without a zone database

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/render"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	_ "github.com/inboxkeeper/inboxkeeper/internal/sighup" // SIGHUP never ends a command
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/retention"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Exit codes: the same for every command.
const (
	exitOK      = 0
	exitFailure = 1 // something failed at run time
	exitUsage   = 2 // bad command line, environment or policy: nothing was touched
)

// version and revision are set at build time with -ldflags "-X
// main.version=... -X main.revision=..." (the Dockerfile and
// deploy/release/release.sh do). Without them, the Go build info says what
// it knows: the module version of `go install ...@v1.2.3`, or the VCS
// revision of a build in a git checkout.
var (
	version  = ""
	revision = ""
)

func main() {
	// SIGHUP is caught from the process's first moments, before main
	// (internal/sighup): run reloads on it, the other commands ignore it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// A reader that goes away (inboxkeeper demo | head -40) makes a write to
	// stdout fail with EPIPE instead of killing the process with SIGPIPE
	// before it cleans up: the command then ends as on SIGTERM (the demo
	// removes its PostgreSQL, a pass rolls back its batch).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, cancel := context.WithCancelCause(ctx)
	os.Exit(run(ctx, os.Args[1:], &stdoutWriter{File: os.Stdout, closed: func() { cancel(errStdoutClosed) }}, os.Stderr))
}

// errStdoutClosed ends a command whose stdout's reader went away.
var errStdoutClosed = errors.New("stdout closed")

// stdoutWriter is stdout that ends the command when its reader goes away.
type stdoutWriter struct {
	*os.File
	closed func()
}

func (w *stdoutWriter) Write(p []byte) (int, error) {
	n, err := w.File.Write(p)
	if errors.Is(err, syscall.EPIPE) {
		w.closed()
	}
	return n, err
}

const usage = `inboxkeeper: forget expired inbox rows safely.

Usage:
  inboxkeeper migrate                 create or upgrade the control schema
  inboxkeeper once [--dry-run] [--metrics-file PATH] [--pushgateway URL [--push-instance NAME]]   one pass over every table, then exit
  inboxkeeper run                     the daemon: a pass every INTERVAL or on SCHEDULE
  inboxkeeper status [--json | --watch [INTERVAL]]   what is due, cleanup lag, holds and replays per table; partitions and why they wait
  inboxkeeper partitions ensure [--dry-run]   create the missing monthly partitions now (retires nothing)
  inboxkeeper compact --table T [--dry-run] [--allow-triggers] [--allow-publication]   give a purged table's empty space back to the disk, online
  inboxkeeper hold add --table T [--scope V] [--from TIME --to TIME] --reason TEXT --owner NAME [--expires TIME | --for DURATION] [--blocks delete|all]
  inboxkeeper hold list [--all]
  inboxkeeper hold release ID
  inboxkeeper replay start --table T --scope V --from TIME --to TIME --owner NAME [--force]
  inboxkeeper replay finish ID
  inboxkeeper replay list [--all]
  inboxkeeper plan [FILE] [--json] [--apply]   the retention record of each consumer scope (Markdown or JSON)
  inboxkeeper plan [FILE] --check [--redis-url URL]   compare the records with the deployment; exit 1 if a promise is not kept
  inboxkeeper set [--table T] KEY=VALUE ... --reason TEXT   change a tunable for every instance, within seconds and across restarts
  inboxkeeper set [--table T] --unset KEY ... --reason TEXT   back to the policy's tuning, the environment or the default
  inboxkeeper settings [--json] [--history]   every tunable in force, globally and per table, and where it comes from
  inboxkeeper pause --reason TEXT [--for DURATION]   pause every instance (until resume, or for DURATION)
  inboxkeeper resume                  end a pause
  inboxkeeper demo                    a throwaway PostgreSQL, a sample inbox, one pass
  inboxkeeper help env                the environment variables and the values in effect
  inboxkeeper version

Times are RFC 3339 (2026-01-31T00:00:00Z) or a date (2026-01-31: 00:00 UTC); durations
are like 90d, 36h or 1d12h. Configuration comes from INBOXKEEPER_*
environment variables and the policy file (INBOXKEEPER_POLICY_FILE).
Exit status: 0 ok, 1 runtime failure, 2 usage or configuration error.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		if len(rest) > 0 && rest[0] == "env" {
			if wantsHelp(rest[1:]) {
				fmt.Fprintf(stdout, "Usage:\n%s\n", strings.Join(usageLines("help env"), "\n"))
				return exitOK
			}
			cfg, err := config.Load()
			config.WriteEnvHelp(stdout, cfg)
			if err != nil {
				fmt.Fprintf(stderr, "\nconfiguration errors:\n%v\n", err)
				return exitUsage
			}
			return exitOK
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	case "version", "--version":
		if wantsHelp(rest) {
			fmt.Fprintf(stdout, "Usage:\n%s\n", strings.Join(usageLines("version"), "\n"))
			return exitOK
		}
		fmt.Fprintln(stdout, "inboxkeeper", thisBuild())
		return exitOK
	}

	cfg, err := config.Load()
	if err != nil && !wantsHelp(rest) {
		fmt.Fprintf(stderr, "inboxkeeper: configuration error:\n%v\n", err)
		return exitUsage
	}
	// --help needs no valid environment: every command parses its flags
	// before it touches anything.
	if render.IsTerminal(stderr) {
		stderr = render.NewTerminal(stderr) // the log and the progress bar take turns
	}
	log := cfg.Logger(stderr)
	a := &app{cfg: cfg, log: log, stdout: stdout, stderr: stderr, command: cmd}
	switch cmd {
	case "hold", "replay", "partitions":
		if len(rest) > 0 {
			a.command += " " + rest[0]
		}
	}
	defer a.close()

	var cmdErr error
	switch cmd {
	case "migrate":
		cmdErr = a.migrate(ctx, rest)
	case "once":
		cmdErr = a.once(ctx, rest)
	case "run":
		cmdErr = a.daemon(ctx, rest)
	case "status":
		cmdErr = a.status(ctx, rest)
	case "partitions":
		cmdErr = a.partitionsCmd(ctx, rest)
	case "compact":
		cmdErr = a.compactCmd(ctx, rest)
	case "hold":
		cmdErr = a.hold(ctx, rest)
	case "replay":
		cmdErr = a.replay(ctx, rest)
	case "demo":
		cmdErr = a.demo(ctx, rest)
	case "plan":
		cmdErr = a.plan(ctx, rest)
	case "set":
		cmdErr = a.set(ctx, rest)
	case "settings":
		cmdErr = a.settingsCmd(ctx, rest)
	case "pause":
		cmdErr = a.pause(ctx, rest)
	case "resume":
		cmdErr = a.resume(ctx, rest)
	default:
		fmt.Fprintf(stderr, "inboxkeeper: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	if errors.Is(context.Cause(ctx), errStdoutClosed) {
		return exitFailure // no one reads what it would say
	}
	return exitCode(needsRole(a.command, cmdErr), stderr)
}

// needsRole adds to a refusal for want of a privilege (42501) which of
// deploy/sql/role.sql's roles the command needs: "permission denied for
// table settings" alone does not say that `set` is the operator's.
func needsRole(command string, err error) error {
	if retry.Code(err) != retry.SQLStateInsufficientPriv {
		return err
	}
	role := "the operator's role (inboxkeeper_operator in deploy/sql/role.sql) or the daemon's (inboxkeeper)"
	switch command {
	case "hold add", "hold release", "replay start", "replay finish", "pause", "resume", "set", "plan":
		role = "the operator's role (inboxkeeper_operator in deploy/sql/role.sql); the daemon's may not"
	case "run", "once", "partitions ensure":
		role = "the daemon's role (inboxkeeper in deploy/sql/role.sql), and for partitions the tables' owner role"
	case "migrate":
		role = "the owner of the database objects, with CREATE on the database (no role of deploy/sql/role.sql)"
	}
	return fmt.Errorf("%w\n%s needs %s: run it as a login that is a member of that role (docs/operations/least-privilege.md)", err, command, role)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var ue usageError
	var ce configError
	switch {
	case errors.Is(err, errHelpShown):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "inboxkeeper: %v\n", err)
		return exitUsage
	case errors.As(err, &ce), isSetupError(err):
		fmt.Fprintf(stderr, "inboxkeeper: configuration error: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "inboxkeeper: %v\n", err)
	return exitFailure
}

// thisBuild is what this binary knows about where it came from: the -X
// stamps above, then the Go build info.
func thisBuild() daemonmetrics.Build {
	bi, _ := debug.ReadBuildInfo()
	return daemonmetrics.DescribeBuild(version, revision, bi)
}

// app holds what the commands share; connections are opened on first use.
type app struct {
	cfg    config.Config
	log    *slog.Logger
	stdout io.Writer
	stderr io.Writer
	pool   *pgxpool.Pool
	// command names the connections (application_name "inboxkeeper run").
	command string
	// pooled: the connection goes through a pooler (see dbconn.Pooled), so
	// nothing may rely on session state over DATABASE_URL.
	pooled bool
	// ddl is the pool on INBOXKEEPER_SESSION_DATABASE_URL for partition
	// DDL, when that is set and needed (sessionForPartitions).
	ddl *pgxpool.Pool
}

func (a *app) close() {
	if a.ddl != nil {
		a.ddl.Close()
	}
	if a.pool != nil {
		a.pool.Close()
	}
}

// warmConns is how many connections connect opens before it returns:
// three for the commands that run passes, whose first pass takes three
// within its first 50 ms (the deleter's, the throttle's first reading, the
// heap's sample read beside the first count: a process's first pass reads
// it whatever is due; dbconn.Open); one for the others.
func (a *app) warmConns() int32 {
	switch a.command {
	case "once", "run", "demo":
		return 3
	}
	return 1
}

func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	// The deleter uses one connection; the throttle's collectors a few more.
	pool, pooled, err := dbconn.Open(ctx, a.cfg.DatabaseURL, 8, a.warmConns(), dbconn.AppName(a.command))
	if err != nil {
		return nil, connectFailed("INBOXKEEPER_DATABASE_URL", a.cfg.DatabaseURL, err)
	}
	if err := a.checkServer(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	a.log.Debug("inboxkeeper: connected", "database", config.RedactURL(a.cfg.DatabaseURL), "pooler", pooled)
	a.pool, a.pooled = pool, pooled
	return pool, nil
}

// checkServer refuses a PostgreSQL older than the supported majors (exit
// 2, before anything is read or written) and warns about one newer than
// the majors tested: it runs there, as a refusal would stop every cleanup
// on the day of an upgrade and let the inbox grow.
func (a *app) checkServer(ctx context.Context, pool *pgxpool.Pool) error {
	srv, err := dbconn.PoolServer(ctx, pool)
	if err != nil {
		return connectFailed("INBOXKEEPER_DATABASE_URL", a.cfg.DatabaseURL, err)
	}
	if err := srv.Check(); err != nil {
		return configError{fmt.Errorf("INBOXKEEPER_DATABASE_URL (%s): %w", config.RedactURL(a.cfg.DatabaseURL), err)}
	}
	if srv.Untested() {
		a.log.Warn("inboxkeeper: the server's PostgreSQL is newer than the majors inboxkeeper is tested with; it runs, untested",
			"server_version", srv.Version, "tested", fmt.Sprintf("%d to %d", dbconn.OldestMajor, dbconn.NewestMajor))
	}
	return nil
}

// sessionURL is the connection string for what needs a session of its own
// (DETACH ... CONCURRENTLY and its session-level fence, the migration
// lock): INBOXKEEPER_SESSION_DATABASE_URL when set, else DATABASE_URL unless
// that goes through a pooler, where a session-level lock or setting would
// leak to whichever client gets the server connection next. Then the
// caller is refused before it touches anything. Call connect first.
func (a *app) sessionURL(what string) (string, error) {
	if a.cfg.SessionURL != "" {
		return a.cfg.SessionURL, nil
	}
	if a.pooled {
		return "", configError{fmt.Errorf("%s needs a database session of its own, but INBOXKEEPER_DATABASE_URL (%s) goes through a connection pooler, "+
			"where session state leaks between clients; set INBOXKEEPER_SESSION_DATABASE_URL to a direct connection (or a session-mode pool) for it",
			what, config.RedactURL(a.cfg.DatabaseURL))}
	}
	return a.cfg.DatabaseURL, nil
}

// txSettings are the settings of the transactions a command opens itself.
func (a *app) txSettings() dbconn.TxSettings {
	return dbconn.TxSettings{StatementTimeout: a.cfg.StatementTimeout, IdleInTx: a.cfg.IdleTimeout}
}

// sessionConn opens a connection of its own to url (from sessionURL).
func (a *app) sessionConn(ctx context.Context, url string) (*pgx.Conn, error) {
	conn, err := dbconn.Dial(ctx, url, dbconn.AppName(a.command))
	if err != nil {
		name := "INBOXKEEPER_DATABASE_URL"
		if url == a.cfg.SessionURL {
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
		return configError{fmt.Errorf("%s: %w; the string is not shown, as it may hold a password", variable, err)}
	case errors.Is(err, dbconn.ErrBadURL):
		return configError{fmt.Errorf("%s %s: %w", variable, red, err)}
	case dbconn.IsConfigError(err):
		return configError{fmt.Errorf("%s: %w", variable, err)}
	}
	return fmt.Errorf("%s: %w", variable, err)
}

func (a *app) loadPolicy() (*policy.Policy, error) {
	p, err := policy.Load(a.cfg.PolicyFile)
	var unreadable *fs.PathError
	if errors.As(err, &unreadable) {
		// Named by its variable: the default (./inboxkeeper.yaml) is
		// relative to wherever the command runs.
		return nil, configError{fmt.Errorf("INBOXKEEPER_POLICY_FILE: cannot read the policy file %s: %v", a.cfg.PolicyFile, unreadable.Err)}
	}
	if err != nil {
		return nil, configError{err}
	}
	// A broken retention section makes the whole file suspect.
	if _, err := retention.Load(p); err != nil {
		return nil, configError{err}
	}
	return p, nil
}

// prepare loads the policy, connects, checks the control schema and resolves
// every table against the catalog: nothing runs before all of that holds.
func (a *app) prepare(ctx context.Context) (*pgxpool.Pool, []*catalog.Table, error) {
	p, err := a.loadPolicy()
	if err != nil {
		return nil, nil, err
	}
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	// A missing or old control schema and a policy that does not match the
	// catalog are reported together: fixing one must not reveal the other
	// only on the next try.
	schemaErr := migrations.Check(ctx, pool)
	if schemaErr != nil && !isSetupError(schemaErr) {
		return nil, nil, schemaErr
	}
	tables, err := catalog.ResolveAll(ctx, pool, p)
	if err != nil || schemaErr != nil {
		return nil, nil, errors.Join(schemaErr, err)
	}
	catalog.WarnLocalTime(ctx, pool, tables, a.log)
	return pool, tables, nil
}

// isSetupError reports errors that mean "fix the setup, nothing was
// touched": exit 2.
func isSetupError(err error) bool {
	var ue usageError
	var ce configError
	return errors.As(err, &ue) || errors.As(err, &ce) || dbconn.IsConfigError(err) || errors.Is(err, catalog.ErrInvalid) || errors.Is(err, migrations.ErrNotMigrated) ||
		errors.Is(err, migrations.ErrTooNew) || errors.Is(err, tiering.ErrKeyTable) || pass.IsSettingsError(err)
}

func (a *app) migrate(ctx context.Context, args []string) error {
	if err := a.noArgs("migrate", args); err != nil {
		return err
	}
	if _, err := a.connect(ctx); err != nil {
		return err
	}
	// A dedicated connection: the migration lock is a session lock.
	url, err := a.sessionURL("migrate")
	if err != nil {
		return err
	}
	conn, err := a.sessionConn(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	applied, err := migrations.Migrate(ctx, conn)
	if err != nil {
		return err
	}
	a.migrateKeyTables(ctx, conn)
	if len(applied) == 0 {
		fmt.Fprintf(a.stdout, "control schema %s is up to date (version %d)\n", migrations.Schema, migrations.Latest())
		return nil
	}
	fmt.Fprintf(a.stdout, "control schema %s migrated to version %d (applied %v)\n", migrations.Schema, migrations.Latest(), applied)
	return nil
}

// migrateKeyTables is the part of `migrate` that creates the permanent key
// tables the policy names, as the owner, so that the daemon's role needs no
// CREATE privilege. migrate does not need a policy: without a readable
// policy file, or with tables not created yet, it says so and goes on. It
// says so loudly, because a migrate Job without the policy mounted leaves a
// tiered policy's daemon waiting for its key table.
func (a *app) migrateKeyTables(ctx context.Context, conn *pgx.Conn) {
	if _, err := os.Stat(a.cfg.PolicyFile); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(a.stdout, "permanent key tables: none checked, no policy file at %s (INBOXKEEPER_POLICY_FILE); "+
			"with a tiers: section in the policy, mount it and run migrate again\n", a.cfg.PolicyFile)
		return
	}
	p, err := a.loadPolicy()
	if err != nil {
		fmt.Fprintf(a.stdout, "permanent key tables: skipped, the policy file does not load: %v\n", err)
		return
	}
	for _, pt := range p.Tables {
		if pt.Tiers == nil || pt.Tiers.PermanentKey == nil {
			continue
		}
		t, err := catalog.Resolve(ctx, conn, pt)
		if err != nil {
			fmt.Fprintf(a.stdout, "permanent key table of %s: skipped: %v\n", pt.Name, err)
			continue
		}
		created, err := tiering.EnsureKeyTable(ctx, conn, t)
		switch {
		case err != nil:
			fmt.Fprintf(a.stdout, "permanent key table of %s: %v\n", pt.Name, err)
		case created:
			fmt.Fprintf(a.stdout, "permanent key table %s created for %s\n", t.Tiers.Key.Name, t.Name)
		default:
			fmt.Fprintf(a.stdout, "permanent key table %s of %s exists\n", t.Tiers.Key.Name, t.Name)
		}
	}
}
