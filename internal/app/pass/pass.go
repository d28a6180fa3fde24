// Package pass is the engine: it runs passes over the policy's tables, in
// the one order the daemon, `once` and the demo share (Stages, Runner):
//
//  1. partitions: premake the months ahead, then retire expired ones (a
//     missing month makes inserts fail, an expired row only waits);
//  2. tiering: demote payloads (a row due for both loses its payload first,
//     then goes with its permanent key);
//  3. expiry: delete expired rows in batches;
//  4. compaction: give back the empty space of a table whose policy asks
//     for it, once the deletions left enough (it moves rows, so it comes
//     after them).
//
// Every stage shares one deadline, RUN_TIME from the start of the pass, and
// reports one result per table. The lease, the settings watch and the
// throttle are asked by the services themselves before every batch or DDL
// statement (their service.Base's Active and Throttle).
//
// Around the order: Wiring builds the services from a configuration (the
// one place a setting goes from config.Config into a service), Driver keeps
// the stages built for the runtime settings in force and runs `once`'s
// pass (Once), Daemon runs `run`'s (Pass: not on a standby, only under the
// lease, then the per-table facts), Schedule says when `run` runs them and
// reloads its policy, Metrics is every metric of a pass on one registry,
// ReadStatus reads what `status` shows (a dry-run partition pass, not a
// pass), and Exit is the exit status of every command's error. Daemon
// internals.
package pass

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// TableResult is what one stage did to one table.
type TableResult struct {
	Stage        string // StagePartitions, StageTiering, StageExpiry or StageCompaction
	Table        string
	Err          error
	StoppedEarly retry.Early
	// Detail is the stage's own result: partitions.TableResult,
	// tiering.Result, expiry.TableResult or compact.Result.
	Detail any
}

// The stages, by name.
const (
	StagePartitions = "partitions"
	StageTiering    = "tiering"
	StageExpiry     = "expiry"
	StageCompaction = "compaction"
)

// Stage is one step of a pass.
type Stage interface {
	Name() string
	// Run works through every table the stage manages. The error is non-nil
	// only when ctx ended the stage; a table that failed says so in its
	// result.
	Run(ctx context.Context, deadline time.Time) ([]TableResult, error)
}

// Result is one pass: every stage's table results, in stage order.
type Result struct {
	Tables []TableResult
}

// Counts says how many table results failed, how many stopped early
// (RUN_TIME, the lease, the throttle, a session queued behind a batch), and
// how many there are.
func (r Result) Counts() (failed, early, total int) {
	for _, t := range r.Tables {
		switch {
		case t.Err != nil:
			failed++
		case t.StoppedEarly.Stopped():
			early++
		}
	}
	return failed, early, len(r.Tables)
}

// Outcome is the pass's label for inboxkeeper_passes_total.
func (r Result) Outcome() string {
	failed, early, total := r.Counts()
	switch {
	case failed == total && failed > 0:
		return daemonmetrics.PassFailed
	case failed > 0 || early > 0:
		return daemonmetrics.PassPartial
	}
	return daemonmetrics.PassOK
}

// Of returns the details of a stage's results, typed:
// Of[expiry.TableResult](rs).
func Of[T any](rs []TableResult) []T {
	var out []T
	for _, t := range rs {
		if d, ok := t.Detail.(T); ok {
			out = append(out, d)
		}
	}
	return out
}

// Runner runs the stages in order within one RUN_TIME.
type Runner struct {
	Stages  []Stage
	RunTime time.Duration // 0: no limit
	// AfterStage, when set, is told each stage's results as soon as the
	// stage ends (once prints them as the pass goes).
	AfterStage func(stage string, results []TableResult)
}

// Run does one pass. The error is non-nil only when ctx ended it; the
// results so far are returned with it.
func (r Runner) Run(ctx context.Context) (Result, error) {
	deadline := batchloop.Deadline(r.RunTime)
	var res Result
	for _, s := range r.Stages {
		trs, err := s.Run(ctx, deadline)
		res.Tables = append(res.Tables, trs...)
		if r.AfterStage != nil {
			r.AfterStage(s.Name(), trs)
		}
		if err != nil {
			return res, fmt.Errorf("pass interrupted (%s): %w", s.Name(), err)
		}
	}
	return res, nil
}

// Partitions is the partitions stage. Premaking is not bounded by RUN_TIME:
// a missing month makes inserts fail.
func Partitions(m *partitions.Manager) Stage {
	return stage{StagePartitions, func(ctx context.Context, _ time.Time) ([]TableResult, error) {
		rs, err := m.RunPass(ctx)
		return wrap(StagePartitions, rs, func(r partitions.TableResult) (string, error, retry.Early) { return r.Table, r.Err, r.StoppedEarly }), err
	}}
}

// Tiering is the demotion stage; a nil demoter demotes nothing.
func Tiering(d *tiering.Demoter) Stage {
	return stage{StageTiering, func(ctx context.Context, deadline time.Time) ([]TableResult, error) {
		if d == nil {
			return nil, nil
		}
		rs, err := d.RunPassUntil(ctx, deadline)
		return wrap(StageTiering, rs, func(r tiering.Result) (string, error, retry.Early) { return r.Table, r.Err, r.StoppedEarly }), err
	}}
}

// Expiry is the deletion stage.
func Expiry(d *expiry.Deleter) Stage {
	return stage{StageExpiry, func(ctx context.Context, deadline time.Time) ([]TableResult, error) {
		rs, err := d.RunPassUntil(ctx, deadline)
		return wrap(StageExpiry, rs, func(r expiry.TableResult) (string, error, retry.Early) { return r.Table, r.Err, r.StoppedEarly }), err
	}}
}

// Compaction is the compaction stage.
func Compaction(c *compact.Compactor) Stage {
	return stage{StageCompaction, func(ctx context.Context, deadline time.Time) ([]TableResult, error) {
		rs, err := c.RunPassUntil(ctx, deadline)
		return wrap(StageCompaction, rs, func(r compact.Result) (string, error, retry.Early) { return r.Table, r.Err, r.StoppedEarly }), err
	}}
}

// Limit bounds a stage to d from when it starts, within the pass's own
// deadline: a table with a RUN_TIME of its own.
func Limit(s Stage, d time.Duration) Stage {
	return stage{s.Name(), func(ctx context.Context, deadline time.Time) ([]TableResult, error) {
		if own := time.Now().Add(d); deadline.IsZero() || own.Before(deadline) {
			deadline = own
		}
		return s.Run(ctx, deadline)
	}}
}

type stage struct {
	name string
	run  func(ctx context.Context, deadline time.Time) ([]TableResult, error)
}

func (s stage) Name() string { return s.name }

func (s stage) Run(ctx context.Context, deadline time.Time) ([]TableResult, error) {
	return s.run(ctx, deadline)
}

// wrap turns a stage's own results into TableResults; Detail holds each.
func wrap[R any](stage string, rs []R, fields func(R) (table string, err error, stopped retry.Early)) []TableResult {
	out := make([]TableResult, len(rs))
	for i, r := range rs {
		table, err, stopped := fields(r)
		out[i] = TableResult{Stage: stage, Table: table, Err: err, StoppedEarly: stopped, Detail: r}
	}
	return out
}
