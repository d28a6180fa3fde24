package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// HowToFixBouncer says how to get the pgbouncer binary the pooler tests need.
const HowToFixBouncer = "install PgBouncer (Debian: apt-get install pgbouncer; .ci/run does it), or put pgbouncer on the PATH"

// Bouncer is a PgBouncer in transaction pool mode in front of a cluster,
// the way many production databases are reached: every transaction may land
// on another server connection, and nothing of a session survives it.
type Bouncer struct {
	Port int
	user string
	root string
	cmd  *exec.Cmd
	done chan struct{}
}

// FindBouncer returns the path of the pgbouncer binary (Debian puts it in
// /usr/sbin, which is not on every PATH).
func FindBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no pgbouncer binary found; " + HowToFixBouncer)
}

// StartBouncer starts a PgBouncer in transaction mode that forwards every
// database to the server at host:port, trusting user and others (the
// server checks the password, if any, itself), and waits until it listens.
func StartBouncer(ctx context.Context, host string, serverPort int, user string, others ...string) (*Bouncer, error) {
	bin, err := FindBouncer()
	if err != nil {
		return nil, err
	}
	root, cred, err := workDir("inboxkeeper-pgbouncer-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	b := &Bouncer{Port: port, user: user, root: root, done: make(chan struct{})}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_reset_query =
logfile = %s
pidfile = %s
admin_users = postgres
`, host, serverPort, port, filepath.Join(root, "users.txt"), filepath.Join(root, "pgbouncer.log"), filepath.Join(root, "pgbouncer.pid"))
	for name, content := range map[string]string{"pgbouncer.ini": ini, "users.txt": authFile(append([]string{user}, others...))} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			os.RemoveAll(root)
			return nil, err
		}
	}
	b.cmd = exec.Command(bin, filepath.Join(root, "pgbouncer.ini"))
	b.cmd.Dir = root
	// PgBouncer refuses to run as root, like PostgreSQL.
	if cred != nil {
		b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("start pgbouncer: %w; %s", err, HowToFixBouncer)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	// The port was free a moment ago; another server started meanwhile may
	// have taken it, so a successful dial proves nothing: wait for the
	// pooler's own word that it listens.
	logFile := filepath.Join(root, "pgbouncer.log")
	listening := fmt.Sprintf("listening on 127.0.0.1:%d", port)
	for {
		if log, _ := os.ReadFile(logFile); strings.Contains(string(log), listening) {
			return b, nil
		}
		select {
		case <-b.done:
			log := tail(logFile, 2000)
			os.RemoveAll(root)
			return nil, fmt.Errorf("pgbouncer exited at start:\n%s", log)
		case <-ctx.Done():
			b.Stop()
			return nil, fmt.Errorf("pgbouncer did not listen on port %d: %w", port, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// authFile is PgBouncer's auth_file for users, without passwords.
func authFile(users []string) string {
	var b strings.Builder
	for _, u := range users {
		b.WriteString(strconv.Quote(u) + ` ""` + "\n")
	}
	return b.String()
}

// URL is a connection string for database db through the pooler.
func (b *Bouncer) URL(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.PathEscape(b.user), b.Port, url.PathEscape(db))
}

// Log is the end of the pooler's log, for a failing test's output.
func (b *Bouncer) Log() string { return tail(filepath.Join(b.root, "pgbouncer.log"), 4000) }

// Stop ends the pooler and removes its files.
func (b *Bouncer) Stop() {
	Terminate(b.cmd.Process, b.done, 5*time.Second)
	_ = os.RemoveAll(b.root)
}

// Terminate ends a child process the way its server would be stopped:
// SIGTERM, then SIGKILL if it has not exited within grace. exited closes
// when the process's Wait has returned; Terminate returns once it has, and
// says whether it took the SIGKILL.
func Terminate(p *os.Process, exited <-chan struct{}, grace time.Duration) (killed bool) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return false
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
		return true
	}
}
