package pgtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// EnableTLS turns ssl on in c with a server certificate for hosts (DNS
// names or IP addresses) signed by a CA made for the test, and returns
// the files of that CA (for sslrootcert) and of another CA, which signed
// nothing of c's: a client that trusts only that one refuses the server.
func EnableTLS(t testing.TB, c *pgcluster.Cluster, hosts ...string) (ca, otherCA string) {
	t.Helper()
	dir := t.TempDir()
	caCert, caKey := newCA(t, "inboxkeeper test CA")
	ca = writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", caCert.Raw)
	other, _ := newCA(t, "inboxkeeper other CA")
	otherCA = writePEM(t, filepath.Join(dir, "other-ca.crt"), "CERTIFICATE", other.Raw)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(2, hosts[0])
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// The server reads them as the data directory's owner, and refuses a
	// key others may read.
	owner, _ := os.Stat(c.DataDir)
	for name, f := range map[string]struct {
		kind string
		der  []byte
	}{"server.crt": {"CERTIFICATE", der}, "server.key": {"EC PRIVATE KEY", keyDER}} {
		p := writePEM(t, filepath.Join(c.DataDir, name), f.kind, f.der)
		if st, ok := owner.Sys().(*syscall.Stat_t); ok {
			if err := os.Chown(p, int(st.Uid), int(st.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	conn := Connect(t, c.URL("postgres"))
	for _, sql := range []string{"ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("pgtest: %s: %v", sql, err)
		}
	}
	// The postmaster takes the reload on its own time; new sessions see it.
	required := strings.Replace(c.URL("postgres"), "sslmode=disable", "sslmode=require", 1)
	WaitFor(t, 30*time.Second, "ssl on after the reload", func() bool {
		cc, err := pgx.Connect(ctx, required)
		if err == nil {
			_ = cc.Close(ctx)
		}
		return err == nil
	})
	return ca, otherCA
}

// newCA makes a self-signed CA certificate and its key.
func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(1, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// template is a certificate valid from an hour ago for a day.
func template(serial int64, name string) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
}

// writePEM writes one PEM block to path, readable by its owner alone.
func writePEM(t testing.TB, path, kind string, der []byte) string {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
