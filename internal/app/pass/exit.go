package pass

import (
	"errors"
	"fmt"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/retention"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Exit statuses: the same for every command (the table of
// docs/reference/commands.md).
const (
	ExitOK      = 0
	ExitFailure = 1 // something failed at run time
	ExitUsage   = 2 // bad command line, environment or policy: nothing was touched
)

// ErrHelpShown ends a command whose --help was printed: exit 0.
var ErrHelpShown = errors.New("help shown")

// UsageError is a mistake on the command line: exit 2.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Usagef is a UsageError.
func Usagef(format string, args ...any) error { return UsageError{fmt.Sprintf(format, args...)} }

// ConfigError is a bad environment, policy file or policy/catalog
// mismatch: exit 2, and nothing was deleted.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// IsSetupError reports errors that mean "fix the setup, nothing was
// touched": exit 2.
func IsSetupError(err error) bool {
	var ue UsageError
	var ce ConfigError
	var bt retention.BadTableError
	return errors.As(err, &ue) || errors.As(err, &ce) || dbconn.IsConfigError(err) || errors.Is(err, catalog.ErrInvalid) ||
		errors.Is(err, migrations.ErrNotMigrated) || errors.Is(err, migrations.ErrTooNew) || errors.Is(err, tiering.ErrKeyTable) ||
		IsSettingsError(err) || errors.As(err, &bt)
}

// Exit is the one classification of a command's error: its exit status,
// and what the command says of it on stderr ("" for nothing). A refusal
// for want of a privilege names the role command needs.
func Exit(command string, err error) (code int, message string) {
	if err == nil || errors.Is(err, ErrHelpShown) {
		return ExitOK, ""
	}
	err = needsRole(command, err)
	var ue UsageError
	switch {
	case errors.As(err, &ue):
		return ExitUsage, err.Error()
	case IsSetupError(err):
		return ExitUsage, "configuration error: " + err.Error()
	}
	return ExitFailure, err.Error()
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
