package main

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// A server older than the supported majors is refused by every command
// before it reads or writes anything: exit 2, naming the server's version
// and the range. The server is the test's own PostgreSQL behind a proxy
// that reports another server_version (versionProxy): no PostgreSQL 13
// binaries are needed, and the command runs exactly as it would against
// one.
func TestServerOlderThanSupportedRefused(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	old := versionProxy(t, f.url, "13.16")
	for _, args := range [][]string{{"once"}, {"once", "--dry-run"}, {"status"}, {"migrate"}, {"run"}} {
		r := f.runWith([]string{"INBOXKEEPER_DATABASE_URL=" + old}, args...)
		wantExit(t, r, 2, "inboxkeeper: configuration error: INBOXKEEPER_DATABASE_URL (postgres://postgres@"+hostOf(t, old)+"/",
			"unsupported PostgreSQL version: the server is PostgreSQL 13.16; inboxkeeper supports PostgreSQL 14 to 18")
	}
	if n := f.rows(); n != allRows {
		t.Errorf("%d rows left, want all %d", n, allRows)
	}
}

// A server newer than the majors tested gets a warning, and the command
// goes on; the tested majors get none.
func TestServerNewerThanTestedWarns(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	const warning = `level=WARN msg="inboxkeeper: the server's PostgreSQL is newer than the majors inboxkeeper is tested with; it runs, untested" server_version=19.0 tested="14 to 18"`
	r := f.runWith([]string{"INBOXKEEPER_DATABASE_URL=" + versionProxy(t, f.url, "19.0")}, "once")
	wantExit(t, r, 0, warning)
	wantResult(t, r, "public.consumer_inbox", "deleted", expiredRows, 0, 0)
	r = f.run("status")
	wantExit(t, r, 0)
	if strings.Contains(r.output(), "untested") {
		t.Errorf("a tested major was warned about\n%s", r)
	}
}

func hostOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Host
}

// versionProxy forwards connections to the server of dsn (a URL) and
// reports version as its server_version when a session starts; it returns
// dsn with the proxy's address. Everything else passes through unchanged.
func versionProxy(t *testing.T, dsn, version string) string {
	t.Helper()
	target, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		open = append(open, c)
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target.Host)
			if err != nil {
				client.Close()
				continue
			}
			track(client)
			track(server)
			wg.Add(2)
			go func() {
				defer wg.Done()
				defer server.Close()
				if startup(client, server) == nil {
					_, _ = io.Copy(server, client)
				}
			}()
			go func() {
				defer wg.Done()
				defer client.Close()
				if rewriteVersion(server, client, version) == nil {
					_, _ = io.Copy(client, server)
				}
			}()
		}
	}()
	p := *target
	p.Host = l.Addr().String()
	return p.String()
}

// startup passes the client's startup packet to the server, after
// declining TLS and GSS encryption if the client asks for them first.
func startup(client, server net.Conn) error {
	for {
		var head [8]byte
		if _, err := io.ReadFull(client, head[:]); err != nil {
			return err
		}
		if code := binary.BigEndian.Uint32(head[4:]); code == 80877103 || code == 80877104 { // SSLRequest, GSSENCRequest
			if _, err := client.Write([]byte{'N'}); err != nil {
				return err
			}
			continue
		}
		rest := make([]byte, binary.BigEndian.Uint32(head[:4])-8)
		if _, err := io.ReadFull(client, rest); err != nil {
			return err
		}
		_, err := server.Write(append(head[:], rest...))
		return err
	}
}

// rewriteVersion passes the server's messages to the client up to the
// first ReadyForQuery, with version in place of its server_version.
func rewriteVersion(server, client net.Conn, version string) error {
	for {
		var head [5]byte
		if _, err := io.ReadFull(server, head[:]); err != nil {
			return err
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return err
		}
		if head[0] == 'S' && strings.HasPrefix(string(body), "server_version\x00") {
			body = []byte("server_version\x00" + version + "\x00")
			binary.BigEndian.PutUint32(head[1:], uint32(len(body)+4))
		}
		if _, err := client.Write(append(head[:], body...)); err != nil {
			return err
		}
		switch head[0] {
		case 'Z':
			return nil
		case 'E':
			return errors.New("the server refused the session")
		}
	}
}
