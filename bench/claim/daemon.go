package main

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/syncbuf"
)

// daemon is `inboxkeeper run` beside the claims, for the whole run.
type daemon struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // its exit, once exited is closed
	out    syncbuf.Buffer
}

func startDaemon(bin string, env []string) (*daemon, error) {
	d := &daemon{exited: make(chan struct{})}
	d.cmd = exec.Command(bin, "run")
	d.cmd.Env, d.cmd.Stdout, d.cmd.Stderr = env, &d.out, &d.out
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("inboxkeeper run: %w", err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

// healthy is nil while the daemon runs and has logged no error.
func (d *daemon) healthy() error {
	select {
	case <-d.exited:
		return fmt.Errorf("inboxkeeper run beside the claims exited (%v):\n%s", d.err, d.out.String())
	default:
	}
	if strings.Contains(d.out.String(), "level=ERROR") {
		return errors.New("inboxkeeper run beside the claims logged an error:\n" + d.out.String())
	}
	return nil
}

// stop ends it with SIGTERM, SIGKILL after 30 s.
func (d *daemon) stop() { pgcluster.Terminate(d.cmd.Process, d.exited, 30*time.Second) }
