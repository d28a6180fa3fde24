package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// TLS that fails is a configuration error (exit 2, nothing touched) that
// names the variable and the CA file, for the database and for a listed
// standby alike, in once and in its dry run: a CA that did not sign the
// server's certificate, a certificate made for another host, a CA file
// that does not exist. On e58e20f the first two exited 1 ("unreachable",
// the TLS lines dropped as noise) and the third said "failed to configure
// TLS" with no path.
func TestTLSFailuresAreConfigurationErrors(t *testing.T) {
	t.Parallel()
	c, dir, pol := clusterFixture(t)
	ca, otherCA := pgtest.EnableTLS(t, c, "127.0.0.1", "db.inboxkeeper.test")
	plain := c.URL("postgres")
	tlsURL := func(host, params string) string {
		u := strings.Replace(plain, "sslmode=disable", params, 1)
		return strings.Replace(u, "@127.0.0.1:", "@"+host+":", 1)
	}
	missing := filepath.Join(t.TempDir(), "no-such-ca.crt")
	good := tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+ca)
	for _, tc := range []struct {
		name, variable, url string
		want                []string
	}{
		{"another CA", "INBOXKEEPER_DATABASE_URL", tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+otherCA),
			[]string{"TLS failed", "certificate signed by unknown authority", "sslrootcert " + otherCA}},
		{"another host", "INBOXKEEPER_DATABASE_URL", tlsURL("localhost", "sslmode=verify-full&sslrootcert="+ca),
			[]string{"TLS failed", "valid for db.inboxkeeper.test, not localhost", "sslrootcert " + ca}},
		{"no CA file", "INBOXKEEPER_DATABASE_URL", tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+missing),
			[]string{"cannot read " + missing + ": no such file or directory"}},
		{"a standby, another CA", "INBOXKEEPER_REPLICA_URLS", tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+otherCA),
			[]string{"INBOXKEEPER_REPLICA_URLS entry 1: ", "TLS failed", "sslrootcert " + otherCA}},
		{"a standby, no CA file", "INBOXKEEPER_REPLICA_URLS", tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+missing),
			[]string{"INBOXKEEPER_REPLICA_URLS entry 1: ", "cannot read " + missing}},
	} {
		env := []string{"INBOXKEEPER_POLICY_FILE=" + pol, "INBOXKEEPER_DATABASE_URL=" + plain}
		if tc.variable == "INBOXKEEPER_DATABASE_URL" {
			env[1] = "INBOXKEEPER_DATABASE_URL=" + tc.url
		} else {
			env[1] = "INBOXKEEPER_DATABASE_URL=" + good
			env = append(env, "INBOXKEEPER_REPLICA_URLS="+tc.url)
		}
		for _, args := range [][]string{{"once", "--dry-run"}, {"once"}} {
			r := runCLI(t, dir, cliEnv(env...), args...)
			if r.code != 2 || !strings.Contains(r.stderr, "configuration error: "+tc.variable) {
				t.Errorf("%s: want exit 2 naming %s\n%s", tc.name, tc.variable, r)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("%s: the error lacks %q\n%s", tc.name, w, r)
				}
			}
		}
	}
	// Verified, it works, and deletes.
	wantExit(t, runCLI(t, dir, cliEnv("INBOXKEEPER_POLICY_FILE="+pol, "INBOXKEEPER_DATABASE_URL="+good, "INBOXKEEPER_REPLICA_URLS="+good), "once"),
		0, "deleted 30")
}

// A listed standby that does not answer: the dry run warns (on e58e20f it
// exited 0 and said nothing), and once waits for it at most
// REPLICA_WAIT, then exits 1 naming it, with nothing deleted (on e58e20f
// it waited for ever at the default RUN_TIME); a pass that RUN_TIME ends
// while the standby holds it fails too (on e58e20f: exit 0, 0 deleted,
// a CronJob that "succeeds" every run and fires no alert).
func TestOnceWithADeadStandby(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	dead := "INBOXKEEPER_REPLICA_URLS=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"

	r := f.runWith([]string{dead}, "once", "--dry-run")
	wantExit(t, r, 0, "would delete 30", "a listed standby does not answer", "INBOXKEEPER_REPLICA_URLS entry 1", "INBOXKEEPER_REPLICA_WAIT")

	start := time.Now()
	r = f.runWith([]string{dead, "INBOXKEEPER_REPLICA_WAIT=2s"}, "once")
	took := time.Since(start)
	wantExit(t, r, 1, "a standby could not be read for 2s (INBOXKEEPER_REPLICA_WAIT); the pass stopped", "127.0.0.1:1")
	if took > 30*time.Second {
		t.Errorf("once took %s with REPLICA_WAIT=2s", took)
	}
	r = f.runWith([]string{dead, "INBOXKEEPER_RUN_TIME=2s"}, "once")
	wantExit(t, r, 1, "the pass ended while a standby could not be read", "127.0.0.1:1")
	f.wantCount("expired rows (every batch waited for the standby)", expiredRows, "SELECT count(*) FROM public.consumer_inbox WHERE remember_until <= now()")

	// Fail open: the standby is said, and the pass goes on without it.
	r = f.runWith([]string{dead, "INBOXKEEPER_REPLICA_FAIL_OPEN=true"}, "once")
	wantExit(t, r, 0, "deleted 30", "batches go on without it")
}
