// Package batchloop is the loop the row deleter and the demoter share: wait
// for the lease and the throttle, size the batch, run it as one short
// transaction, retry what is transient with backoff, advance the keyset,
// and stop when a batch comes back short, when RUN_TIME runs out or when the
// lease is lost.
package batchloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// Batch runs one batch transaction of at most size rows starting at the
// keyset position lower. It returns the rows it changed, the newest key
// among them, and the WAL it wrote (0 when unmeasured).
//
// A batch that commits in parts (a Citus distributed batch commits window
// by window) and fails after some part committed returns the error with
// the rows those parts changed and the keyset position they end at: the
// loop counts them, and its retry starts there. Any other failed batch
// returns n = 0.
type Batch func(ctx context.Context, lower pgtype.Timestamptz, size int) (n int64, newest time.Time, wal float64, err error)

// Loop is one pass over one table.
type Loop struct {
	What       string // "delete", "demotion": names the batch in errors and logs
	Sizer      *Sizer
	Throttle   service.Gate // nil: never waits
	Active     func() error // nil: always active; an error stops the pass
	Deadline   time.Time    // zero: no RUN_TIME
	MaxRetries int
	BatchPause time.Duration
	// Pause, when set, is asked after every batch how long to wait before
	// the next, at least BatchPause (a rate the caller keeps).
	Pause func() time.Duration
	Log   *slog.Logger

	// BeforeBatch is told the size of the next batch (a gauge).
	BeforeBatch func(size int)
	// AfterBatch is told of every committed batch, including empty ones.
	AfterBatch func(n int64, took time.Duration)
	// OnError is told of every failed attempt (a counter by kind).
	OnError func(kind string)
	// OnRetry is told before a failed batch is retried (tests).
	OnRetry func(kind string)
	// Shards is how many shards a batch spans (a Citus distributed table):
	// the size the sizer and the throttle deal in counts rows per shard, and
	// a batch of size rows per shard changes up to size*Shards rows. 0 or
	// 1: a table on one node.
	Shards int
	// Exhausted, when set, is asked after every batch whether nothing is
	// left (batches by expiry window can come back short with rows still
	// due, and full with nothing left); nil: a batch that comes back short
	// ends the pass.
	Exhausted func() bool
}

// Result is what the loop did.
type Result struct {
	Rows         int64
	Batches      int // batches that changed at least one row
	Retries      int
	StoppedEarly retry.Early
	// Resume is the keyset position the pass ended at.
	Resume pgtype.Timestamptz
}

// NegInf is the keyset position before every row.
var NegInf = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}

// Run runs batches until one comes back short. The error is non-nil when a
// batch failed for good (its kind is retry.Kind of it) or ctx ended.
func (l *Loop) Run(ctx context.Context, batch Batch) (res Result, err error) {
	res.Resume = NegInf
	for {
		if !l.Deadline.IsZero() && time.Now().After(l.Deadline) {
			res.StoppedEarly = retry.AtRunTime
			return res, nil
		}
		if l.Active != nil {
			if err := l.Active(); err != nil {
				res.StoppedEarly = retry.Inactive(err)
				return res, nil
			}
		}
		size, early, err := l.waitThrottle(ctx)
		if err != nil || early.Stopped() {
			res.StoppedEarly = early
			return res, err
		}
		if l.BeforeBatch != nil {
			l.BeforeBatch(size)
		}
		n, newest, size, err := l.withRetry(ctx, batch, res.Resume, size, &res)
		if errors.Is(err, retry.ErrSettingsChanged) {
			// Read in the batch's transaction (TxOptions.Watch), which
			// rolled back before its statement.
			res.StoppedEarly = retry.Inactive(err)
			return res, nil
		}
		if err != nil {
			return res, err
		}
		if n > 0 {
			res.Rows += n
			res.Batches++
			res.Resume = pgtype.Timestamptz{Time: newest, Valid: true}
		}
		if l.Exhausted != nil {
			if l.Exhausted() {
				return res, nil
			}
		} else if n < int64(size) {
			return res, nil
		}
		pause := l.BatchPause
		if l.Pause != nil {
			pause = max(pause, l.Pause())
		}
		if pause > 0 {
			if err := retry.Sleep(ctx, pause); err != nil {
				return res, err
			}
		}
	}
}

func (l *Loop) shards() int { return max(1, l.Shards) }

// waitThrottle blocks while the throttle says so, and until the next batch
// fits the standbys' WAL window; it returns the batch's size. It returns a
// reason to stop the pass when RUN_TIME ran out while waiting.
func (l *Loop) waitThrottle(ctx context.Context) (int, retry.Early, error) {
	if l.Throttle == nil {
		return l.Sizer.Size(), retry.Early{}, nil
	}
	wctx := ctx
	if !l.Deadline.IsZero() {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, l.Deadline)
		defer cancel()
	}
	rows, err := l.Throttle.Admit(wctx, l.Sizer)
	if err != nil {
		if ctx.Err() != nil {
			return 0, retry.Early{}, ctx.Err()
		}
		reason, _ := service.Held(err)
		return 0, retry.Throttled("run time reached while throttled (" + reason + ")"), nil
	}
	return rows, retry.Early{}, nil
}

// withRetry runs one batch, retrying transient failures (retry.Do) with a
// smaller size after pressure. It returns the size the successful attempt
// used.
func (l *Loop) withRetry(ctx context.Context, batch Batch, lower pgtype.Timestamptz, size int, res *Result) (int64, time.Time, int, error) {
	var (
		n        int64
		newest   time.Time
		kind     retry.Kind
		attempts int
	)
	policy := retry.Policy{MaxRetries: l.MaxRetries, Base: 100 * time.Millisecond,
		Retry: func(err error, kind retry.Kind) bool {
			return kind.Transient() && !errors.Is(err, retry.ErrSettingsChanged)
		},
		OnRetry: func(kind retry.Kind, attempt int, wait time.Duration, err error) {
			res.Retries++
			if l.OnRetry != nil {
				l.OnRetry(string(kind))
			}
			if l.Log != nil {
				l.Log.Warn(l.What+": batch failed, retrying", "kind", kind, "attempt", attempt+1, "wait", wait, "error", err)
			}
		}}
	err := retry.Do(ctx, policy, func(attempt int) error {
		attempts = attempt
		began := time.Now()
		var wal float64
		var err error
		n, newest, wal, err = batch(ctx, lower, size)
		err = dbconn.OnNode(err)
		if err != nil && n > 0 {
			// Part of it committed before it failed: those rows are gone
			// and counted now; the retry starts after them.
			l.committedPart(n, newest, wal, time.Since(began), res)
			lower = res.Resume
		}
		if err == nil {
			took := time.Since(began)
			perShard := int((n + int64(l.shards()) - 1) / int64(l.shards()))
			l.Sizer.Observe(perShard, took)
			l.Sizer.ObserveWAL(perShard, wal)
			if l.Throttle != nil {
				l.Throttle.Wrote(wal)
			}
			if l.AfterBatch != nil {
				l.AfterBatch(n, took)
			}
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, retry.ErrSettingsChanged) {
			return err // not a failure: the pass stops (Run)
		}
		kind = retry.KindOf(err)
		if l.OnError != nil {
			l.OnError(string(kind))
		}
		switch kind {
		case retry.KindLockWait:
			// Someone queued behind the batch: the pass stops here (not
			// transient, so no retry).
			l.Sizer.Pressure()
		case retry.KindLockTimeout, retry.KindStatementTimeout, retry.KindDeadlock:
			l.Sizer.Pressure()
			size = l.Sizer.Size()
		}
		return err
	})
	switch {
	case err == nil:
		return n, newest, size, nil
	case ctx.Err() != nil:
		return 0, time.Time{}, size, ctx.Err()
	case kind == retry.KindLockWait:
		return 0, time.Time{}, size, err
	}
	return 0, time.Time{}, size, fmt.Errorf("%s batch (%s, after %d retries): %w", l.What, kind, attempts, err)
}

// committedPart counts the part of a failed batch that committed (see
// Batch) as a batch of its own, and moves the keyset to where it ends.
func (l *Loop) committedPart(n int64, newest time.Time, wal float64, took time.Duration, res *Result) {
	res.Rows += n
	res.Batches++
	res.Resume = pgtype.Timestamptz{Time: newest, Valid: true}
	if l.Throttle != nil {
		l.Throttle.Wrote(wal)
	}
	if l.AfterBatch != nil {
		l.AfterBatch(n, took)
	}
}

// LogEnd logs how a table's pass that failed with err ended, for the
// deleter and the demoter alike (what names them in the message; attrs are
// their counts so far), and returns retry.AtShutdown when ctx ended it: a
// signal, not a failure, whose batch in flight rolled back. A lock wait
// (a session queued behind the batch, which was cancelled) is the design
// and logs a warning, and so does a lost connection (retry.KindConnection:
// the next pass tries again); anything else is an error.
func LogEnd(ctx context.Context, log *slog.Logger, what string, err error, attrs ...any) retry.Early {
	switch {
	case ctx.Err() != nil:
		log.Info(what+": table stopped for shutdown", attrs...)
		return retry.AtShutdown
	case errors.Is(err, retry.ErrLockWait):
		log.Warn(what+": table stopped early: a session queued behind the batch, which was cancelled and rolled back", append([]any{"error", err}, attrs...)...)
	case retry.KindOf(err) == retry.KindConnection:
		// A restart, a failover, a frozen process's session ended by the
		// server: nothing to fix here, and the next pass tries again (the
		// daemon then says once that the database does not answer, and
		// skips its passes until it does).
		log.Warn(what+": table failed: the connection to the database was lost or refused; the next pass tries again", append([]any{"error", err}, attrs...)...)
	default:
		log.Error(what+": table failed", append([]any{"error", err}, attrs...)...)
	}
	return retry.Early{}
}

// Deadline is when a pass that starts now must stop: RUN_TIME from now, or
// never (zero) without one.
func Deadline(runTime time.Duration) time.Time {
	if runTime <= 0 {
		return time.Time{}
	}
	return time.Now().Add(runTime)
}

// Outcome is how one table's part of a pass ended. Every runner's result
// embeds it, so that Pass can read and mark it.
type Outcome struct {
	StoppedEarly retry.Early // set when RUN_TIME, the lease, the throttle, a lock wait or shutdown ended the pass early
	Err          error
}

func (o *Outcome) outcome() *Outcome { return o }

// outcomer is a result that embeds an Outcome.
type outcomer interface{ outcome() *Outcome }

// Pass runs one table after the other, in policy order, with one RUN_TIME
// deadline for them all (zero: none). A table whose error is a lock wait
// ends the pass at once (someone queued behind the daemon: the next pass
// starts with a smaller batch), and its result says it stopped early. The
// error is non-nil only when ctx ended the pass.
func Pass[T any, R any, PR interface {
	*R
	outcomer
}](ctx context.Context, tables []T, deadline time.Time, run func(ctx context.Context, t T, deadline time.Time) R) ([]R, error) {
	var out []R
	for _, t := range tables {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, run(ctx, t, deadline))
		if o := PR(&out[len(out)-1]).outcome(); errors.Is(o.Err, retry.ErrLockWait) {
			o.StoppedEarly, o.Err = retry.AtLockWait, nil
			break
		}
	}
	return out, ctx.Err()
}

// Sizing bounds the adaptive batch size.
type Sizing struct {
	Min, Max int
	Target   time.Duration
}

// Sizers keeps one batch sizer per table across passes, so that what a
// pass learnt about a table's batches is where the next one starts.
type Sizers struct {
	start  int
	sizing *Sizing // nil: every batch has start rows
	mu     sync.Mutex
	m      map[string]*Sizer
}

// NewSizers starts every table's batches at start rows, adapting within
// sizing when it is set.
func NewSizers(start int, sizing *Sizing) *Sizers {
	return &Sizers{start: start, sizing: sizing, m: map[string]*Sizer{}}
}

// For returns table's sizer.
func (s *Sizers) For(table string) *Sizer {
	s.mu.Lock()
	defer s.mu.Unlock()
	z := s.m[table]
	if z == nil {
		if s.sizing != nil {
			z = NewSizer(s.start, s.sizing.Min, s.sizing.Max, s.sizing.Target)
		} else {
			z = NewSizer(s.start, s.start, s.start, 0)
		}
		s.m[table] = z
	}
	return z
}
