// Package pgcluster starts throwaway PostgreSQL clusters from the local server
// binaries. Tests, benchmarks and `inboxkeeper demo` use it so that nothing
// depends on a database someone else set up.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// HowToFix is appended to errors about missing server binaries: a test run
// without PostgreSQL must fail and say what to do, never skip.
const HowToFix = "install the PostgreSQL server binaries (Debian: apt-get install postgresql-15; " +
	"they land in /usr/lib/postgresql/<version>/bin), set INBOXKEEPER_PG_BINDIR to their directory, " +
	"or point INBOXKEEPER_TEST_DATABASE_URL at a server where this user may CREATE DATABASE"

// Options tune a cluster. The zero value is a small, fast, non-durable cluster.
type Options struct {
	// Settings are extra postgresql.conf lines (name -> value).
	Settings map[string]string
	// Durable keeps fsync on; benchmarks that measure WAL want the same
	// settings a production server has.
	Durable bool
	// Log receives the server's log file path on failures; may be nil.
	Log func(format string, args ...any)
	// BinDir is the directory of the server binaries to run; empty:
	// FindBinDir's.
	BinDir string
}

// Cluster is a running throwaway server listening on 127.0.0.1.
type Cluster struct {
	BinDir  string
	DataDir string
	Port    int
	root    string
	cred    *syscall.Credential
}

// FindBinDir locates initdb and pg_ctl: INBOXKEEPER_PG_BINDIR, then the
// newest /usr/lib/postgresql/*/bin, then the PATH.
func FindBinDir() (string, error) {
	if d := os.Getenv("INBOXKEEPER_PG_BINDIR"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("INBOXKEEPER_PG_BINDIR=%s has no initdb: %s", d, HowToFix)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries found (initdb, pg_ctl): " + HowToFix)
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start creates and starts a new cluster in a temporary directory. When the
// process runs as root, the server runs as the "postgres" user, because
// PostgreSQL refuses to run as root.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	bin := opts.BinDir
	if bin == "" {
		if bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	c, err := newCluster(bin, "inboxkeeper-pg-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Destroy()
		}
	}()
	if err = c.initdb(ctx, opts); err != nil {
		return nil, err
	}
	if err = c.StartServer(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// newCluster is a cluster not yet initialised, in a new temporary
// directory named by prefix (workDir).
func newCluster(bin, prefix string) (*Cluster, error) {
	root, cred, err := workDir(prefix)
	if err != nil {
		return nil, err
	}
	return &Cluster{BinDir: bin, root: root, DataDir: filepath.Join(root, "data"), cred: cred}, nil
}

// workDir makes a new temporary directory named by prefix for a server or
// a pooler, and says who that runs as: this process (nil) or, when it runs
// as root, which PostgreSQL and PgBouncer refuse, the postgres user, who
// then owns the directory.
func workDir(prefix string) (root string, cred *syscall.Credential, err error) {
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", nil, fmt.Errorf("running as root, and there is no postgres user to run the server as: %w; %s", err, HowToFix)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if root, err = os.MkdirTemp("", prefix); err != nil {
		return "", nil, err
	}
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(root)
			return "", nil, err
		}
	}
	return root, cred, nil
}

func (c *Cluster) initdb(ctx context.Context, opts Options) error {
	if _, err := c.run(ctx, "initdb", "-D", c.DataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	c.Port = port
	settings := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"port":                    strconv.Itoa(port),
		"unix_socket_directories": quoteConf(c.root),
		"max_connections":         "200",
		"max_wal_senders":         "10",
		"max_replication_slots":   "10",
		"wal_level":               "logical",
		"hot_standby":             "on",
		"log_min_messages":        "warning",
		"logging_collector":       "off",
	}
	if !opts.Durable {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	return c.appendConf("postgresql.conf", settings)
}

// StartStandby makes a streaming standby of c with pg_basebackup -R and
// starts it. Settings are extra postgresql.conf lines for the standby (for
// example recovery_min_apply_delay).
func (c *Cluster) StartStandby(ctx context.Context, settings map[string]string) (*Cluster, error) {
	return c.startStandby(ctx, settings, func(s *Cluster) (map[string]string, error) {
		_, err := s.run(ctx, "pg_basebackup", "-D", s.DataDir, "-R", "-X", "stream", "-c", "fast", "-d", c.standbyConninfo())
		return nil, err
	})
}

// startStandby makes a new cluster whose data directory fill makes a
// standby of c (returning the postgresql.conf lines that takes, if any),
// gives it a port of its own and settings, and starts it.
func (c *Cluster) startStandby(ctx context.Context, settings map[string]string, fill func(s *Cluster) (map[string]string, error)) (_ *Cluster, err error) {
	s, err := newCluster(c.BinDir, "inboxkeeper-standby-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Destroy()
		}
	}()
	filled, err := fill(s)
	if err != nil {
		return nil, err
	}
	if s.Port, err = freePort(); err != nil {
		return nil, err
	}
	conf := map[string]string{"port": strconv.Itoa(s.Port), "unix_socket_directories": quoteConf(s.root), "hot_standby_feedback": "off"}
	for _, more := range []map[string]string{filled, settings} {
		for k, v := range more {
			conf[k] = v
		}
	}
	if err = s.appendConf("postgresql.conf", conf); err != nil {
		return nil, err
	}
	if err = s.StartServer(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// standbyConninfo is how a standby of c connects to it.
func (c *Cluster) standbyConninfo() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby_%d", c.Port, os.Getpid())
}

// AppendConf adds settings to postgresql.conf; they apply at the next
// start or reload.
func (c *Cluster) appendConf(file string, settings map[string]string) error {
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("\n# inboxkeeper throwaway cluster\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	f, err := os.OpenFile(filepath.Join(c.DataDir, file), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(b.Bytes())
	return err
}

func quoteConf(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// StartServer starts (or restarts after StopServer) the server and waits
// until it accepts connections.
func (c *Cluster) StartServer(ctx context.Context) error {
	logFile := c.LogFile()
	if _, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-l", logFile, "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("%w\nserver log:\n%s", err, tail(logFile, 2000))
	}
	return nil
}

// StopServer stops the server ("fast": sessions are disconnected, in-flight
// transactions roll back) and leaves the data directory in place.
func (c *Cluster) StopServer(ctx context.Context) error {
	_, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-m", "fast", "-w", "-t", "60", "stop")
	return err
}

// Crash stops the server the way a power cut would ("immediate": no
// checkpoint, no flush of what is still in the WAL buffers); StartServer
// then runs crash recovery.
func (c *Cluster) Crash(ctx context.Context) error {
	_, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-m", "immediate", "-w", "-t", "60", "stop")
	return err
}

// Destroy stops the server if it runs and removes every file of the cluster.
func (c *Cluster) Destroy() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := os.Stat(filepath.Join(c.DataDir, "postmaster.pid")); err == nil {
		_, _ = c.run(ctx, "pg_ctl", "-D", c.DataDir, "-m", "immediate", "-w", "-t", "30", "stop")
	}
	_ = os.RemoveAll(c.root)
}

// LogFile is the server's log.
func (c *Cluster) LogFile() string { return filepath.Join(c.root, "server.log") }

// RequirePassword makes role log in over TCP with a password
// (scram-sha-256) instead of trust, and has the server reload its
// configuration.
func (c *Cluster) RequirePassword(ctx context.Context, role string) error {
	hba := filepath.Join(c.DataDir, "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		return err
	}
	// The first line that matches decides: before the trust lines.
	lines := fmt.Sprintf("host all %[1]s 127.0.0.1/32 scram-sha-256\nhost all %[1]s ::1/128 scram-sha-256\n", role)
	if err := os.WriteFile(hba, append([]byte(lines), b...), 0o600); err != nil {
		return err
	}
	_, err = c.run(ctx, "pg_ctl", "-D", c.DataDir, "reload")
	return err
}

// URL is a connection string for database db as the superuser postgres.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

func (c *Cluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, prog), args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
