package dbconn

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// TLS that was asked for and failed is the configuration's (exit 2 in the
// commands), and says why and which CA file the server's certificate was
// checked against: a CA that did not sign it, a certificate for another
// host, a server without TLS. A CA file that does not exist is named too.
func TestTLSFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.NewCluster(t)
	ca, otherCA := pgtest.EnableTLS(t, c, "127.0.0.1", "db.inboxkeeper.test")
	tlsURL := func(host, params string) string {
		u := strings.Replace(c.URL("postgres"), "sslmode=disable", params, 1)
		return strings.Replace(u, "@127.0.0.1:", "@"+host+":", 1)
	}
	dial := func(url string) error {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		conn, err := Dial(cctx, url)
		if err == nil {
			_ = conn.Close(ctx)
		}
		return err
	}
	if err := dial(tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+ca)); err != nil {
		t.Fatalf("verify-full with the CA that signed the server's certificate: %v", err)
	}
	for _, tc := range []struct {
		name, url string
		want      []string
	}{
		{"another CA", tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+otherCA),
			[]string{"TLS failed", "unknown authority", "sslrootcert " + otherCA}},
		{"verify-ca, another CA", tlsURL("127.0.0.1", "sslmode=verify-ca&sslrootcert="+otherCA),
			[]string{"TLS failed", "unknown authority", "sslrootcert " + otherCA}},
		{"another host name", tlsURL("localhost", "sslmode=verify-full&sslrootcert="+ca),
			[]string{"TLS failed", "valid for db.inboxkeeper.test, not localhost", "sslrootcert " + ca}},
		{"no TLS on the server", strings.Replace(pgtest.NewDatabase(t), "sslmode=disable", "sslmode=require", 1),
			[]string{"TLS failed", "does not offer TLS"}},
	} {
		err := dial(tc.url)
		var ce *ConnectError
		if !errors.As(err, &ce) || ce.Cause != CauseTLS || !IsConfigError(err) {
			t.Errorf("%s: %v, want a TLS failure of the configuration's", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, err, w)
			}
		}
	}

	missing := filepath.Join(t.TempDir(), "no-such-ca.crt")
	err := dial(tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+missing))
	if !errors.Is(err, ErrBadURL) || !IsConfigError(err) || !strings.Contains(err.Error(), "cannot read "+missing+": no such file or directory") {
		t.Errorf("a missing sslrootcert: %v, want its path named", err)
	}
	if _, _, err := Open(ctx, tlsURL("127.0.0.1", "sslmode=verify-full&sslrootcert="+missing), 2, 1); !strings.Contains(fmtErr(err), missing) {
		t.Errorf("Open with a missing sslrootcert: %v, want its path named", err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
