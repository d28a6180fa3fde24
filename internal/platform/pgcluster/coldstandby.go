package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// StartColdStandby makes a streaming standby of c without pg_basebackup,
// which server binaries without the client tools lack (the npm packages
// of other majors the tests run, internal/testkit/pgmajors): it stops c
// cleanly, copies its data directory, starts c again, and starts the copy
// with standby.signal and a primary_conninfo pointing at c. Stopping c
// ends every session on it: call it before the test connects. Settings
// are extra postgresql.conf lines for the standby, as for StartStandby.
func (c *Cluster) StartColdStandby(ctx context.Context, settings map[string]string) (*Cluster, error) {
	return c.startStandby(ctx, settings, func(s *Cluster) (map[string]string, error) {
		if err := c.StopServer(ctx); err != nil {
			return nil, err
		}
		// A clean shutdown leaves a consistent copy: the standby replays
		// from its last checkpoint, then streams what c writes after it.
		cp := exec.CommandContext(ctx, "cp", "-a", c.DataDir, s.DataDir)
		if s.cred != nil {
			cp.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		}
		out, cpErr := cp.CombinedOutput()
		if err := c.StartServer(ctx); err != nil {
			return nil, err
		}
		if cpErr != nil {
			return nil, fmt.Errorf("copy %s: %w: %s", c.DataDir, cpErr, out)
		}
		signal := filepath.Join(s.DataDir, "standby.signal")
		if err := os.WriteFile(signal, nil, 0o600); err != nil {
			return nil, err
		}
		if s.cred != nil {
			if err := os.Chown(signal, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return nil, err
			}
		}
		return map[string]string{"primary_conninfo": quoteConf(c.standbyConninfo())}, nil
	})
}
