// Package stop names why a table's pass ended before its work was done: a
// typed reason for programs (metrics, tests, the pass's outcome) and the
// detail people read. It is the daemon's internals, not a library API.
package stop

import "errors"

// Reason is the kind of early stop.
type Reason string

// The reasons. The zero Reason means the pass did not stop early.
const (
	// RunTime: INBOXKEEPER_RUN_TIME was reached between batches.
	RunTime Reason = "run_time"
	// Throttled: the throttle held the work back until the run time was
	// reached, or a partition DDL step gave up waiting on it.
	Throttled Reason = "throttled"
	// Lease: this instance no longer holds the lease.
	Lease Reason = "lease"
	// SettingsChanged: the runtime settings changed; the next pass applies
	// them.
	SettingsChanged Reason = "settings_changed"
	// LockWait: a session queued behind a lock the daemon held, and the
	// batch or DDL statement was cancelled to let it through.
	LockWait Reason = "lock_wait"
	// Shutdown: a signal ended the process's work; the batch in flight
	// rolled back.
	Shutdown Reason = "shutdown"
)

// Early says whether and why a table's pass stopped early.
type Early struct {
	Reason Reason
	// Detail is the human text ("run time reached while throttled (replica
	// lag 2.1s)"); empty: the reason's own text.
	Detail string
}

// Stopped reports whether the pass stopped early.
func (e Early) Stopped() bool { return e.Reason != "" }

// String is what the CLI prints after "stopped early: ", and "" when the
// pass did not stop early.
func (e Early) String() string {
	if e.Detail != "" {
		return e.Detail
	}
	switch e.Reason {
	case RunTime:
		return "run time reached"
	case Throttled:
		return "throttled"
	case Lease:
		return "the lease was lost"
	case SettingsChanged:
		return ErrSettingsChanged.Error()
	case LockWait:
		return "a session waited on a lock the daemon held"
	}
	return string(e.Reason)
}

// MarshalText keeps the JSON and log forms the readable text.
func (e Early) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// The usual stops.
var (
	AtRunTime  = Early{Reason: RunTime}
	AtShutdown = Early{Reason: Shutdown}
	AtLockWait = Early{Reason: LockWait}
)

// Throttle is a stop while throttled, with the throttle's reason.
func Throttle(detail string) Early {
	return Early{Reason: Throttled, Detail: detail}
}

// ErrSettingsChanged is what an active check returns when the runtime
// settings changed since the pass began.
var ErrSettingsChanged = errors.New("the runtime settings changed; the next pass applies them")

// Inactive is the stop for an error of the active check run before each
// batch: the runtime settings changed, or else the lease is no longer ours.
func Inactive(err error) Early {
	if errors.Is(err, ErrSettingsChanged) {
		return Early{Reason: SettingsChanged}
	}
	return Early{Reason: Lease, Detail: err.Error()}
}
