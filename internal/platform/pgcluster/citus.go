package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// CitusHowToFix is appended to errors when the Citus extension is missing:
// the Citus tests fail and say what to do, never skip.
const CitusHowToFix = "build and install Citus into the local PostgreSQL with ../shared/citus/build.sh " +
	"(as root; idempotent, about 3 minutes the first time); .ci/run does this"

// Citus is a throwaway Citus cluster on this machine: a coordinator and
// workers, each a Cluster of its own with the citus library preloaded.
type Citus struct {
	Coordinator *Cluster
	Workers     []*Cluster
}

// CitusLockVariable names a file that a Citus build in progress holds
// locked (flock, exclusive): .ci/run builds Citus while the first packages'
// tests run, and the Citus tests wait for the build to end.
const CitusLockVariable = "INBOXKEEPER_TEST_CITUS_LOCK"

// citusBuildWait bounds that wait: the build takes about 3 minutes on 2
// cores, more on a machine busy with the tests.
const citusBuildWait = 15 * time.Minute

// waitForCitusBuild returns once no build holds the lock file that
// INBOXKEEPER_TEST_CITUS_LOCK names (at once when it is unset).
func waitForCitusBuild() error {
	path := os.Getenv(CitusLockVariable)
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", CitusLockVariable, path, err)
	}
	locked := make(chan error, 1)
	go func() {
		defer f.Close()
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		}
		locked <- err
	}()
	select {
	case err := <-locked:
		return err
	case <-time.After(citusBuildWait):
		return fmt.Errorf("the Citus build still holds %s (%s) after %s", path, CitusLockVariable, citusBuildWait)
	}
}

// CitusInstalled reports an error naming the fix when the newest local
// PostgreSQL has no Citus extension, after waiting for a build in progress.
func CitusInstalled() error {
	if err := waitForCitusBuild(); err != nil {
		return err
	}
	bin, err := FindBinDir()
	if err != nil {
		return err
	}
	out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output()
	if err != nil {
		return fmt.Errorf("pg_config --pkglibdir: %w", err)
	}
	lib := filepath.Join(strings.TrimSpace(string(out)), "citus.so")
	if _, err := os.Stat(lib); err != nil {
		return fmt.Errorf("Citus is not installed (%s is missing): %s", lib, CitusHowToFix)
	}
	return nil
}

// StartCitus starts a coordinator and n workers. Every node allows prepared
// transactions: Citus commits a write that spans workers in two phases.
func StartCitus(ctx context.Context, workers int, opts Options) (_ *Citus, err error) {
	if err := CitusInstalled(); err != nil {
		return nil, err
	}
	settings := map[string]string{
		"shared_preload_libraries":  "'citus'",
		"max_prepared_transactions": "100",
		// The cluster's own maintenance must not race the tests' DROP DATABASE.
		"citus.enable_statistics_collection": "off",
		// Nodes talk over loopback without TLS (the throwaway servers have
		// no certificates).
		"citus.node_conninfo": "'sslmode=disable'",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	opts.Settings = settings
	c := &Citus{}
	defer func() {
		if err != nil {
			c.Destroy()
		}
	}()
	if c.Coordinator, err = Start(ctx, opts); err != nil {
		return nil, fmt.Errorf("citus coordinator: %w", err)
	}
	for i := 0; i < workers; i++ {
		w, err := Start(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("citus worker %d: %w", i+1, err)
		}
		c.Workers = append(c.Workers, w)
	}
	return c, nil
}

// Nodes is the coordinator followed by the workers.
func (c *Citus) Nodes() []*Cluster {
	return append([]*Cluster{c.Coordinator}, c.Workers...)
}

// CreateDatabase creates database name on every node with the citus
// extension in it, and registers the coordinator and the workers in the
// coordinator's copy: the returned URL is the coordinator's, where
// inboxkeeper connects.
func (c *Citus) CreateDatabase(ctx context.Context, name string) (string, error) {
	for _, n := range c.Nodes() {
		if err := execOn(ctx, n.URL("postgres"), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
			return "", err
		}
		if err := execOn(ctx, n.URL(name), "CREATE EXTENSION citus"); err != nil {
			return "", err
		}
	}
	stmts := []string{fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", c.Coordinator.Port)}
	for _, w := range c.Workers {
		stmts = append(stmts, fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port))
	}
	for _, s := range stmts {
		if err := execOn(ctx, c.Coordinator.URL(name), s); err != nil {
			return "", err
		}
	}
	return c.Coordinator.URL(name), nil
}

// DropDatabase drops database name on every node.
func (c *Citus) DropDatabase(ctx context.Context, name string) error {
	var errs []error
	for _, n := range c.Nodes() {
		errs = append(errs, DropDatabase(ctx, n.URL("postgres"), name))
	}
	return errors.Join(errs...)
}

// Destroy removes every node.
func (c *Citus) Destroy() {
	for _, n := range c.Nodes() {
		if n != nil {
			n.Destroy()
		}
	}
}

func execOn(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}
