package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// runPassName is the method -run-pass adds: a pass of `inboxkeeper run`,
// the daemon a sidecar keeps running, which pays its process's start, its
// connections and the catalog once, not once a pass.
const runPassName = "inboxkeeper run, a pass"

// runPassInterval is the daemon's INTERVAL in a -run-pass measurement: how
// long after an idle pass it starts the next, which reloads the policy
// first when the file changed.
const runPassInterval = "1s"

// runPass measures a pass of `inboxkeeper run` over inbox in db. The daemon
// starts on a policy naming an empty table of inbox's shape (idle) and runs
// its first pass over it: the process started, its connections open, the
// catalog read and a pass done, as in a daemon that has been running. Then
// the benchmark takes its checkpoint and its readings and points the policy
// file at inbox (written aside, then renamed); the daemon reloads it before
// its next pass, and that pass is the measurement. Its wall time is the
// pass's duration from the daemon's own "pass done" line (JSON, at debug),
// from the pass's start to its end: no process start, no connection, no
// catalog, as the statements are timed on a connection opened before them.
// CPU is the server's and the daemon process's from the readings to the end
// of the pass, WAL and pages from the checkpoint: they include the reload
// and the idle passes (an empty table's look) that ran meanwhile.
func (b *bench) runPass(ctx context.Context, db string) (r result, err error) {
	if err := b.inDB(ctx, db, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CREATE TABLE idle (LIKE inbox INCLUDING ALL)")
		return err
	}); err != nil {
		return r, err
	}
	policy := filepath.Join(b.Dir, db+"-run.yaml")
	if err := benchdata.WritePolicy(policy, "idle"); err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	d, err := startDaemon(b.Bin, benchdata.DaemonEnv(true, append(b.daemonSettings(db, policy),
		"INBOXKEEPER_INTERVAL="+runPassInterval, "INBOXKEEPER_LOG_LEVEL=debug", "INBOXKEEPER_LOG_FORMAT=json")...))
	if err != nil {
		return r, err
	}
	defer func() {
		rss, stopErr := d.stop()
		r.rss = rss
		if err == nil && stopErr != nil {
			err = stopErr
		}
	}()
	if first, err := d.await(ctx, "inboxkeeper: pass done", nil); err != nil {
		return r, fmt.Errorf("the daemon's first (idle) pass: %w", err)
	} else if first["outcome"] != "ok" {
		return r, fmt.Errorf("the daemon's first (idle) pass ended %v:\n%s", first["outcome"], d.output())
	}
	lsn, cpu, err := b.before(ctx)
	if err != nil {
		return r, err
	}
	own, err := benchdata.ProcessCPU(d.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	next := policy + ".next"
	if err := benchdata.WritePolicy(next, "inbox"); err != nil {
		return r, err
	}
	if err := os.Rename(next, policy); err != nil {
		return r, err
	}
	// The pass after the reload is the one over inbox; its table's line
	// comes before its own (a table that failed has none: the pass then
	// ends failed).
	if _, err := d.await(ctx, "inboxkeeper: policy reloaded", nil); err != nil {
		return r, err
	}
	var done map[string]any
	pass, err := d.await(ctx, "inboxkeeper: pass done", func(rec map[string]any) bool {
		if rec["msg"] == "expiry: table done" && rec["table"] == "public.inbox" {
			done = rec
		}
		return true
	})
	if err != nil {
		return r, fmt.Errorf("the pass over inbox: %w", err)
	}
	if pass["outcome"] != "ok" || done == nil {
		return r, fmt.Errorf("the pass over inbox ended %v:\n%s", pass["outcome"], d.output())
	}
	cpu2, err := b.serverCPU()
	if err != nil {
		return r, err
	}
	own2, err := benchdata.ProcessCPU(d.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	r.wall = seconds(pass["duration_seconds"])
	r.cpu = cpu2 - cpu + own2 - own
	r.batches = int(number(done["batches"]))
	r.swept = int(number(done["sweep_batches"]))
	r.longest = seconds(done["longest_batch_seconds"])
	if r.wall <= 0 {
		return r, fmt.Errorf("the daemon's pass done line gives no duration_seconds:\n%s", d.output())
	}
	if r.wal, err = benchdata.WALSince(ctx, b.pool, lsn); err != nil {
		return r, err
	}
	r.pages, r.dirtied, err = b.pages(ctx, db)
	return r, err
}

// runningDaemon is `inboxkeeper run` started by runPass, its log read line
// by line.
type runningDaemon struct {
	cmd     *exec.Cmd
	records chan map[string]any // the JSON log lines; closed at exit
	exited  chan struct{}       // closed once the process has been waited for
	waitErr error

	mu  sync.Mutex
	out strings.Builder // everything it wrote, for errors
}

func startDaemon(bin string, env []string) (*runningDaemon, error) {
	d := &runningDaemon{records: make(chan map[string]any, 1024), exited: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(bin, "run")
	d.cmd.Env, d.cmd.Stdout, d.cmd.Stderr = env, w, w
	err = d.cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("inboxkeeper run: %w", err)
	}
	go func() {
		defer close(d.records)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.out.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil {
				d.records <- rec
			}
		}
	}()
	go func() {
		d.waitErr = d.cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

func (d *runningDaemon) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// await returns the next log record whose msg is msg and for which match,
// when not nil, holds; an error when the daemon logs an ERROR, exits or
// ctx ends first. match sees every record on the way, msg or not.
func (d *runningDaemon) await(ctx context.Context, msg string, match func(map[string]any) bool) (map[string]any, error) {
	for {
		select {
		case rec, ok := <-d.records:
			if !ok {
				<-d.exited
				return nil, fmt.Errorf("inboxkeeper run exited (%v) before %q:\n%s", d.waitErr, msg, d.output())
			}
			if rec["level"] == "ERROR" {
				return nil, fmt.Errorf("inboxkeeper run logged an error before %q: %v:\n%s", msg, rec["msg"], d.output())
			}
			if (match == nil || match(rec)) && rec["msg"] == msg {
				return rec, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %q: %w:\n%s", msg, ctx.Err(), d.output())
		}
	}
}

// stop ends the daemon with SIGTERM (SIGKILL after 30 s) and returns its
// peak RSS; an error when it did not exit 0 on SIGTERM.
func (d *runningDaemon) stop() (int64, error) {
	go func() {
		for range d.records { // the pipe must not fill while it exits
		}
	}()
	var err error
	if pgcluster.Terminate(d.cmd.Process, d.exited, 30*time.Second) {
		err = errors.New("inboxkeeper run did not stop within 30 s of SIGTERM")
	} else if d.waitErr != nil {
		err = fmt.Errorf("inboxkeeper run on SIGTERM: %w:\n%s", d.waitErr, d.output())
	}
	var rss int64
	if ru, ok := d.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = int64(ru.Maxrss) * 1024 // KiB on Linux
	}
	return rss, err
}

func number(v any) float64 {
	f, _ := v.(float64)
	return f
}

func seconds(v any) time.Duration {
	return time.Duration(number(v) * float64(time.Second))
}
