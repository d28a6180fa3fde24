// Package redistest starts throwaway redis-server processes for tests. A
// missing redis-server fails the test with how to install it: it never
// skips, like the PostgreSQL tests.
package redistest

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/syncbuf"
)

// HowToFix is the message for a machine without redis-server.
const HowToFix = "redis-server is not on the PATH; install it (Debian: apt-get install redis-server)"

// Start runs redis-server on a free local port with the extra arguments
// (for example "--maxmemory-policy", "allkeys-lru"), waits until it
// answers, stops it at the end of the test, and returns its address
// (127.0.0.1:port).
func Start(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(HowToFix)
	}
	dir := t.TempDir() // removed after the server is stopped (cleanups run last-in first-out)
	// The port is free when picked; another process could take it before
	// redis-server binds it, so try a few.
	var lastErr error
	for range 5 {
		port := FreePort(t)
		out := &syncbuf.Buffer{}
		cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--daemonize", "no"}, args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-done
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := waitReady(addr, done); err != nil {
			stop()
			lastErr = fmt.Errorf("%v\n%s", err, out.String())
			continue
		}
		t.Cleanup(stop)
		return addr
	}
	t.Fatalf("redis-server did not start: %v", lastErr)
	return ""
}

func waitReady(addr string, done <-chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited", addr)
		default:
		}
		if ping(addr) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on %s did not accept connections within 10s", addr)
}

// ping reports whether a Redis server answers on addr: PONG, or NOAUTH when
// it wants a password.
func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	reply := string(buf[:n])
	return strings.HasPrefix(reply, "+PONG") || strings.HasPrefix(reply, "-NOAUTH")
}

// FreePort returns a local TCP port nothing listens on (for now: another
// process may take it).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
