package pgtest

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// Roles are the login users ApplyRoleScript made, as connection strings:
// Daemon is a member of the daemon's role (inboxkeeper), Operator of the
// operator's (inboxkeeper_operator), Consumer of the claim path's
// (inboxkeeper_consumer).
type Roles struct {
	Daemon, Operator, Consumer string
	// DaemonRole, OperatorRole and ConsumerRole are the NOLOGIN roles
	// role.sql made.
	DaemonRole, OperatorRole, ConsumerRole string
}

// ApplyRoleScript runs deploy/sql/role.sql with psql against the database
// at url, as its owner, the way the script says to (after migrate, once per
// managed table: vars are its psql variables, table_name and the like), with
// role names of the test's own: roles are cluster-wide, and other tests
// share the server. On a Citus coordinator, Citus sends the roles, their
// memberships and the grants on distributed tables to the workers. It
// returns a login user of each role; the roles stay with the throwaway
// server.
func ApplyRoleScript(t testing.TB, dbURL string, vars ...map[string]string) Roles {
	t.Helper()
	bin, err := pgcluster.FindBinDir()
	if err != nil {
		t.Fatalf("pgtest: psql: %v", err)
	}
	script := filepath.Join(moduleRoot(t), "deploy", "sql", "role.sql")
	n := seq.Add(1)
	r := Roles{DaemonRole: fmt.Sprintf("ik%d_%d_daemon", os.Getpid(), n), OperatorRole: fmt.Sprintf("ik%d_%d_operator", os.Getpid(), n),
		ConsumerRole: fmt.Sprintf("ik%d_%d_consumer", os.Getpid(), n)}
	names := map[string]string{"role": r.DaemonRole, "operator_role": r.OperatorRole, "consumer_role": r.ConsumerRole}
	if len(vars) == 0 {
		vars = []map[string]string{nil} // the control schema's part only
	}
	for _, v := range vars {
		args := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1"}
		all := map[string]string{}
		for k, x := range names {
			all[k] = x
		}
		for k, x := range v {
			all[k] = x
		}
		keys := make([]string, 0, len(all))
		for k := range all {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			args = append(args, "-v", k+"="+all[k])
		}
		args = append(args, "-f", script, dbURL)
		if out, err := exec.Command(filepath.Join(bin, "psql"), args...).CombinedOutput(); err != nil {
			t.Fatalf("pgtest: psql -f %s: %v\n%s", script, err, out)
		}
	}
	login := func(role, user string) string {
		ExecOn(t, dbURL, fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", pgx.Identifier{user}.Sanitize(), pgx.Identifier{role}.Sanitize()))
		return WithUser(t, dbURL, user)
	}
	r.Daemon = login(r.DaemonRole, r.DaemonRole+"_app")
	r.Operator = login(r.OperatorRole, r.OperatorRole+"_app")
	r.Consumer = login(r.ConsumerRole, r.ConsumerRole+"_app")
	return r
}

// WithUser is the connection string dbURL with another user.
func WithUser(t testing.TB, dbURL, user string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.User = url.User(user)
	return u.String()
}

// moduleRoot is the directory of the go.mod above the test's package
// directory, where go test runs it (the source file's own path is no help
// under -trimpath).
func moduleRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			t.Fatalf("pgtest: no go.mod above %s", wd)
		}
	}
}

// Pool opens a pool on url (a login of ApplyRoleScript's), closed at the
// end of the test.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	return poolOn(t, url)
}
