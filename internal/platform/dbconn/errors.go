package dbconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
)

// ErrBadURL is returned for a connection string pgx cannot parse. Its text
// never repeats the string, which may hold a password.
var ErrBadURL = errors.New("cannot parse the connection string")

// badURL is ErrBadURL with pgx's reason ("sslmode is invalid"), which
// never holds the string, and the file it could not read (a missing
// sslrootcert, sslcert or sslkey): a path, never a secret.
func badURL(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return ErrBadURL
	}
	var file *fs.PathError
	if errors.As(err, &file) {
		return fmt.Errorf("%w: %s: cannot read %s: %v", ErrBadURL, reason(pe), file.Path, file.Err)
	}
	if r := reason(pe); r != "" {
		return fmt.Errorf("%w: %s", ErrBadURL, r)
	}
	return ErrBadURL
}

// reason is pgx's reason a connection string did not parse, without the
// string: "" when it cannot be told apart.
func reason(pe *pgconn.ParseConfigError) string {
	// pgx writes "cannot parse `<string, redacted as best it can>`: <reason>
	// (<inner error>)"; only the reason is sure to hold no password.
	s := pe.Error()
	if inner := errors.Unwrap(pe); inner != nil {
		s = strings.TrimSuffix(s, " ("+inner.Error()+")")
	}
	i := strings.LastIndex(s, "`: ")
	if i < 0 {
		return ""
	}
	return s[i+3:]
}

// Cause is why a connection failed.
type Cause string

// The causes of a failed connection. The first four are the
// configuration's (ConnectError.Config): trying again changes nothing until
// the connection string, the password or the database's roles and grants
// change.
const (
	// CauseAuthentication: a wrong password, a role that does not exist, no
	// pg_hba.conf entry (SQLSTATE 28P01, 28000).
	CauseAuthentication Cause = "authentication failed"
	// CauseAuthorization: the role may not connect to the database
	// (SQLSTATE 42501: no CONNECT privilege, or not a login role).
	CauseAuthorization Cause = "not allowed to connect"
	// CauseUnknownDatabase: the database does not exist (SQLSTATE 3D000).
	CauseUnknownDatabase Cause = "unknown database"
	// CauseUnreachable: no server answered (refused, timed out, no such
	// host).
	CauseUnreachable Cause = "unreachable"
	// CauseRefused: the server answered but refused for now (starting up,
	// shutting down, too many connections).
	CauseRefused Cause = "refused"
	// CauseTLS: the connection string asks for TLS (sslmode require,
	// verify-ca or verify-full) and it failed: the server's certificate is
	// not signed by a CA of sslrootcert, names another host, has expired,
	// or the server does not offer TLS. The configuration's: a certificate
	// does not change by itself.
	CauseTLS Cause = "TLS failed"
)

// ConnectError is a connection that failed, with its cause and the one
// message that says why: the server's, or the network's, once, without the
// attempts pgx makes with and without TLS.
type ConnectError struct {
	URL    string // redacted (config.RedactURL)
	Cause  Cause
	Detail string
	Err    error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("connect to %s: %s: %s", e.URL, e.Cause, e.Detail)
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Config reports a failure that is the configuration's: trying again as is
// cannot help.
func (e *ConnectError) Config() bool {
	switch e.Cause {
	case CauseAuthentication, CauseAuthorization, CauseUnknownDatabase, CauseTLS:
		return true
	}
	return false
}

// IsConfigError reports whether err is a connection string that does not
// parse, or a connection that failed for a reason of the configuration's
// (authentication, authorization, an unknown database, TLS).
func IsConfigError(err error) bool {
	var ce *ConnectError
	return errors.Is(err, ErrBadURL) || (errors.As(err, &ce) && ce.Config())
}

// Classify is err as a ConnectError when it is a failed connection (a
// pool's, say, while the daemon runs), named by its user, host, port and
// database; any other error unchanged.
func Classify(err error) error {
	var ce *ConnectError
	var pce *pgconn.ConnectError
	if errors.As(err, &ce) || !errors.As(err, &pce) {
		return err
	}
	c := pce.Config
	return classify(fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database), "", err)
}

// connectError classifies a failed connection to url.
func connectError(url string, err error) error {
	return classify(config.RedactURL(url), url, err)
}

// classify classifies a failed connection to where, made from the
// connection string url ("": not known).
func classify(where, url string, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	ce := &ConnectError{URL: where, Err: err}
	var pe *pgconn.PgError
	var ne net.Error
	var oe *net.OpError
	var de *net.DNSError
	// With sslmode=prefer (the default) pgx tries TLS, then without: the
	// server's answer to the second attempt says more than the first's.
	switch {
	case errors.As(err, &pe):
		ce.Detail = fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
		switch pe.Code {
		case "28P01", "28000":
			ce.Cause = CauseAuthentication
		case "42501":
			ce.Cause = CauseAuthorization
		case "3D000":
			ce.Cause = CauseUnknownDatabase
		default:
			ce.Cause = CauseRefused
		}
	case certificateRefused(err):
		ce.Cause, ce.Detail = CauseTLS, tlsDetail(err, url)
	case errors.As(err, &de):
		ce.Cause, ce.Detail = CauseUnreachable, de.Error()
	case errors.As(err, &oe):
		ce.Cause, ce.Detail = CauseUnreachable, oe.Error()
	case strings.Contains(err.Error(), tlsRefused):
		ce.Cause, ce.Detail = CauseTLS, tlsDetail(err, url)
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		ce.Cause, ce.Detail = CauseUnreachable, fmt.Sprintf("no answer within %s", connectTimeout)
	default:
		ce.Cause, ce.Detail = CauseUnreachable, withoutTLSNoise(err)
	}
	return ce
}

// certificateRefused reports whether err is the server's certificate not
// accepted: signed by no CA of sslrootcert, made for another host, expired.
// Only a connection that verifies (sslmode verify-ca, verify-full, or
// require with a sslrootcert) meets it, and tries nothing else after.
func certificateRefused(err error) bool {
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknownCA) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify)
}

// tlsRefused is what pgconn says, in an error of no type of its own, when
// the connection requires TLS and the server offers none.
const tlsRefused = "server refused TLS connection"

// tlsDetail is why TLS failed, and the CA certificates the server's was
// checked against: the file of sslrootcert, as libpq finds it (the
// connection string, PGSSLROOTCERT, ~/.postgresql/root.crt), or the
// system's.
func tlsDetail(err error, url string) string {
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var why string
	switch {
	case errors.As(err, &host):
		why = host.Error()
	case errors.As(err, &unknownCA):
		why = unknownCA.Error()
	case errors.As(err, &invalid):
		why = invalid.Error()
	case errors.As(err, &verify):
		why = verify.Err.Error()
	default:
		return "the server does not offer TLS, which the connection string's sslmode requires (turn ssl on on the server, or change sslmode)"
	}
	switch ca := rootCert(url); ca {
	case "", "system":
		return why + " (checked against the system's CA certificates: no sslrootcert)"
	default:
		return why + " (checked against sslrootcert " + ca + ")"
	}
}

// rootCert is the file of CA certificates a connection made from url
// checks the server's against, as libpq finds it: url's sslrootcert,
// PGSSLROOTCERT, or ~/.postgresql/root.crt when it exists; "" for none.
func rootCert(url string) string {
	if v, ok := config.ConnParam(url, "sslrootcert"); ok {
		return v
	}
	if v := os.Getenv("PGSSLROOTCERT"); v != "" {
		return v
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".postgresql", "root.crt")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// withoutTLSNoise is err's message without the lines of the attempt pgx
// makes with TLS first (sslmode=prefer), when another attempt says more,
// and without repeated lines.
func withoutTLSNoise(err error) string {
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.Contains(l, "tls error") && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return err.Error()
	}
	return strings.Join(lines, "; ")
}

// OnNode adds to err the node of a Citus cluster a failed statement ran on:
// Citus reports a worker's error with the node in its context ("while
// executing command on host:port"), which the error's text leaves out.
func OnNode(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	for _, line := range strings.Split(pe.Where, "\n") {
		if strings.Contains(line, "executing command on ") {
			return fmt.Errorf("%w (%s)", err, strings.TrimSpace(line))
		}
	}
	return err
}
