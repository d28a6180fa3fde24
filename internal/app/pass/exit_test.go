package pass

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/retention"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Every kind of error a command can end with has its one exit status, and
// what is said of it.
func TestExit(t *testing.T) {
	t.Parallel()
	denied := &pgconn.PgError{Code: "42501", Message: "permission denied for table settings"}
	for _, c := range []struct {
		name    string
		command string
		err     error
		code    int
		says    string
	}{
		{"ok", "once", nil, ExitOK, ""},
		{"help", "once", fmt.Errorf("x: %w", ErrHelpShown), ExitOK, ""},
		{"usage", "once", Usagef("once: unexpected argument %q", "x"), ExitUsage, `once: unexpected argument "x"`},
		{"config", "once", ConfigError{errors.New("INBOXKEEPER_X: bad")}, ExitUsage, "configuration error: INBOXKEEPER_X: bad"},
		{"catalog", "once", fmt.Errorf("t: %w", catalog.ErrInvalid), ExitUsage, "configuration error: "},
		{"not migrated", "status", migrations.ErrNotMigrated, ExitUsage, "configuration error: "},
		{"too new", "status", migrations.ErrTooNew, ExitUsage, "configuration error: "},
		{"key table", "once", tiering.ErrKeyTable, ExitUsage, "configuration error: "},
		{"settings", "once", SettingsError{errors.New("batch_size: bad")}, ExitUsage, "configuration error: batch_size: bad"},
		{"record table", "plan", retention.BadTableError{Err: errors.New("no schema")}, ExitUsage, "configuration error: no schema"},
		{"runtime", "once", errors.New("1 of 2 tables failed"), ExitFailure, "1 of 2 tables failed"},
		{"grant", "set", fmt.Errorf("set: %w", denied), ExitFailure, "set needs the operator's role"},
		{"grant of the daemon", "once", denied, ExitFailure, "once needs the daemon's role"},
	} {
		code, says := Exit(c.command, c.err)
		if code != c.code || !strings.Contains(says, c.says) || (c.says == "") != (says == "") {
			t.Errorf("%s: Exit(%q, %v) = %d, %q; want %d, saying %q", c.name, c.command, c.err, code, says, c.code, c.says)
		}
	}
}
