// Command inboxkeeper keeps PostgreSQL inbox (deduplication) tables from
// growing forever without forgetting a message identity too early.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	_ "time/tzdata" // INBOXKEEPER_ACTIVE_TZ works in images without a zone database

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/app/setup"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	_ "github.com/inboxkeeper/inboxkeeper/internal/platform/sighup" // SIGHUP never ends a command
	"github.com/inboxkeeper/inboxkeeper/migrations"
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
	// (internal/platform/sighup): run reloads on it, the other commands ignore it.
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
		return pass.ExitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		if len(rest) > 0 && rest[0] == "env" {
			if wantsHelp(rest[1:]) {
				fmt.Fprintf(stdout, "Usage:\n%s\n", strings.Join(usageLines("help env"), "\n"))
				return pass.ExitOK
			}
			cfg, err := config.Load()
			config.WriteEnvHelp(stdout, cfg)
			if err != nil {
				fmt.Fprintf(stderr, "\nconfiguration errors:\n%v\n", err)
				return pass.ExitUsage
			}
			return pass.ExitOK
		}
		fmt.Fprint(stdout, usage)
		return pass.ExitOK
	case "version", "--version":
		if wantsHelp(rest) {
			fmt.Fprintf(stdout, "Usage:\n%s\n", strings.Join(usageLines("version"), "\n"))
			return pass.ExitOK
		}
		fmt.Fprintln(stdout, "inboxkeeper", thisBuild())
		return pass.ExitOK
	}

	cfg, err := config.Load()
	if err != nil && !wantsHelp(rest) {
		fmt.Fprintf(stderr, "inboxkeeper: configuration error:\n%v\n", err)
		return pass.ExitUsage
	}
	// --help needs no valid environment: every command parses its flags
	// before it touches anything.
	if render.IsTerminal(stderr) {
		stderr = render.NewTerminal(stderr) // the log and the progress bar take turns
	}
	a := &app{Command: &setup.Command{Cfg: cfg, Log: cfg.Logger(stderr), Name: cmd}, stdout: stdout, stderr: stderr}
	switch cmd {
	case "hold", "replay", "partitions":
		if len(rest) > 0 {
			a.Name += " " + rest[0]
		}
	}
	defer a.Close()

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
		return pass.ExitUsage
	}
	if errors.Is(context.Cause(ctx), errStdoutClosed) {
		return pass.ExitFailure // no one reads what it would say
	}
	return a.exitCode(cmdErr)
}

// say prints a line on stdout.
func (a *app) say(line string) { fmt.Fprintln(a.stdout, line) }

// exitCode is the exit status of a command that ended with err, saying
// why on stderr (pass.Exit).
func (a *app) exitCode(err error) int {
	code, msg := pass.Exit(a.Name, err)
	if msg != "" {
		fmt.Fprintf(a.stderr, "inboxkeeper: %s\n", msg)
	}
	return code
}

// thisBuild is what this binary knows about where it came from: the -X
// stamps above, then the Go build info.
func thisBuild() daemonmetrics.Build {
	bi, _ := debug.ReadBuildInfo()
	return daemonmetrics.DescribeBuild(version, revision, bi)
}

// app is what the commands share: the setup (configuration, log,
// connections opened on first use) and where they print.
type app struct {
	*setup.Command
	stdout io.Writer
	stderr io.Writer
}

func (a *app) migrate(ctx context.Context, args []string) error {
	if err := a.noArgs("migrate", args); err != nil {
		return err
	}
	if _, err := a.Connect(ctx); err != nil {
		return err
	}
	// A dedicated connection: the migration lock is a session lock.
	url, err := a.SessionURL("migrate")
	if err != nil {
		return err
	}
	conn, err := a.SessionConn(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	applied, err := migrations.Migrate(ctx, conn)
	if err != nil {
		return err
	}
	a.MigrateKeyTables(ctx, conn, a.say)
	if len(applied) == 0 {
		fmt.Fprintf(a.stdout, "control schema %s is up to date (version %d)\n", migrations.Schema, migrations.Latest())
		return nil
	}
	fmt.Fprintf(a.stdout, "control schema %s migrated to version %d (applied %v)\n", migrations.Schema, migrations.Latest(), applied)
	return nil
}
