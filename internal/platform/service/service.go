// Package service is the base every service of a pass embeds: the row
// deleter (expiry), the demoter (tiering), the partition manager and the
// throttle, in the manner of River's baseservice. It holds what they share,
// in one shape: the logger, the clock, and what a pass tells a service
// before its work (the throttle to wait on, the check that this instance is
// still the active one, dry run, the timeouts and retries of its
// statements). Each service keeps its own hooks for tests in an exported
// TestSignals struct. Daemon internals.
package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// Base is embedded by every service. The zero value works: WithDefaults
// fills in what is unset.
type Base struct {
	Logger *slog.Logger // nil: discard
	// Clock pins "now" for tests; nil: the real time (the database's, for
	// what is expired).
	Clock Clock
	// Throttle, when set, is waited on before every batch or DDL statement
	// and watches each one's backend for sessions waiting on its locks.
	Throttle Gate
	// Active, when set, is asked before every batch or DDL statement; an
	// error stops the table's pass (this instance lost the lease, or the
	// runtime settings changed).
	Active func() error
	// Watch, when set, is the runtime settings watch that Active asks
	// after the lease, and BatchActive is Active without it (the lease
	// alone): a batch loop asks BatchActive before every batch, and its
	// transaction reads Watch in the round trip that opens it
	// (LoopActive). The DDL of partitions asks Active.
	Watch       TxWatch
	BatchActive func() error
	// DryRun counts or lists what a pass would change, and changes nothing.
	DryRun bool
	// The timeouts of every transaction the service opens, and how often a
	// failed batch or DDL step is retried.
	LockTimeout      time.Duration
	StatementTimeout time.Duration
	IdleTimeout      time.Duration // idle_in_transaction_session_timeout
	MaxRetries       int
}

// DefaultMaxRetries is how often a failed batch or DDL step is retried by
// default; the other defaults are the environment's (config), the lock
// timeout each service's own.
const DefaultMaxRetries = 5

// WithDefaults returns b with the documented defaults for what is unset,
// lockTimeout the service's own.
func (b Base) WithDefaults(lockTimeout time.Duration) Base {
	if b.Logger == nil {
		b.Logger = slog.New(slog.DiscardHandler)
	}
	b.LockTimeout = Or(b.LockTimeout, lockTimeout)
	b.StatementTimeout = Or(b.StatementTimeout, config.DefaultStatementTimeout)
	b.IdleTimeout = Or(b.IdleTimeout, config.DefaultIdleTimeout)
	b.MaxRetries = Or(b.MaxRetries, DefaultMaxRetries)
	return b
}

// TxSettings are the settings of the service's own transactions.
func (b Base) TxSettings() dbconn.TxSettings {
	return dbconn.TxSettings{LockTimeout: b.LockTimeout, StatementTimeout: b.StatementTimeout, IdleInTx: b.IdleTimeout}
}

// CheckActive asks the active check, if any: an error is the early stop
// of the table's pass.
func (b Base) CheckActive() (retry.Early, bool) {
	if b.Active == nil {
		return retry.Early{}, true
	}
	if err := b.Active(); err != nil {
		return retry.Inactive(err), false
	}
	return retry.Early{}, true
}

// TxWatch is the runtime settings watch as a batch transaction reads it
// (settings.Watch): its statement queued on b, in the pipeline that opens
// the transaction; *stop is set to its error when the settings changed.
type TxWatch interface {
	QueueCheck(b *pgx.Batch, stop *error)
}

// LoopActive is what a batch loop asks before every batch: Active, or,
// where its batch transactions read the settings watch in the round trip
// that opens them (Watch, batchloop.TxOptions.Watch), BatchActive: a round
// trip fewer a batch.
func (b Base) LoopActive() func() error {
	if b.Watch == nil {
		return b.Active
	}
	return b.BatchActive
}

// Or is v, or def when v is zero or negative: an unset option takes its
// documented default.
func Or[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Gate is the throttle as a service sees it (*throttle.Throttler).
type Gate interface {
	// Admit waits until no throttle signal holds work back and, for a
	// batch (a non-nil sizer), until the batch fits the standbys' WAL
	// window; it returns how many rows the batch may have. A pause for a
	// backlog shrinks the sizer. When ctx ends first, the error is a
	// *HeldError.
	Admit(ctx context.Context, sizer Sizer) (rows int, err error)
	// Watch registers the backend running a statement of ours: while it is
	// registered, a session that queues behind its locks gets it cancelled,
	// and blocked then reports true. done unregisters it. xactStart is the
	// transaction's start (zero for a session watched as a whole).
	Watch(pid uint32, xactStart time.Time) (done func(), blocked func() bool)
	// Wrote tells the throttle the WAL a batch wrote.
	Wrote(bytes float64)
}

// WriterGate is what a writer whose WAL cannot be split into batches (the
// VACUUM after a pass, a DDL statement, a slice of permanent keys) asks of
// the throttle (*throttle.Throttler), where Gate's admission of rows does
// not fit.
type WriterGate interface {
	// PaceWriter waits until no signal throttles and every streaming
	// standby's queue is within half its WAL window, then returns the rate
	// the writer may write at. When ctx ends first, the error is a
	// *HeldError.
	PaceWriter(ctx context.Context) (WriterPace, error)
	// Overrun says why a writer that is running must stop now: a signal
	// over its threshold, or a standby that fell too far behind anyway.
	// Empty while it may go on.
	Overrun() string
}

// WriterPace is the rate a writer may write WAL at so that no standby
// falls further behind than it is when the writer starts.
type WriterPace struct {
	// Rate is WAL bytes a second: what the tightest standby applies, as
	// its WAL window measures it (+Inf when no standby streams).
	Rate    float64
	Window  float64 // that standby's WAL window, bytes (+Inf when none streams)
	Standby string  // the tightest standby; empty when none streams
	// Measured: the rate comes from a busy standby. Otherwise it is a
	// lower bound (what the standby replayed lately), or the window's
	// floor.
	Measured bool
}

// Paced reports whether a standby streams: the writer must keep to Rate.
func (p WriterPace) Paced() bool { return p.Standby != "" }

// AdmitWrite waits until g lets a small write that cannot be split start (a
// DDL statement, whose WAL is some hundred kB): no signal over its
// threshold and, where g paces writers (WriterGate), every standby's queue
// within half its WAL window, which is room for it. When ctx ends first,
// the error is a *HeldError.
func AdmitWrite(ctx context.Context, g Gate) error {
	if wg, ok := g.(WriterGate); ok {
		_, err := wg.PaceWriter(ctx)
		return err
	}
	_, err := g.Admit(ctx, nil)
	return err
}

// Sizer is the adaptive batch size as the throttle sees it
// (batchloop.Sizer).
type Sizer interface {
	Size() int       // the next batch's
	Min() int        // the smallest batch
	PerRow() float64 // the WAL a row costs, averaged; 0 until measured
	Pressure()       // halve the size: the throttle saw a backlog
}

// HeldError is why Admit returned without admitting: its context ended
// while the throttle held the work back.
type HeldError struct {
	Reason string // every signal over its threshold, or what the WAL window waits for
	Err    error  // the context's
}

func (e *HeldError) Error() string { return "throttled (" + e.Reason + "): " + e.Err.Error() }
func (e *HeldError) Unwrap() error { return e.Err }

// Held reports the reason of a *HeldError in err.
func Held(err error) (string, bool) {
	var h *HeldError
	if errors.As(err, &h) {
		return h.Reason, true
	}
	return "", false
}
