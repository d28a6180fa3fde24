package retry

import "errors"

// Early says whether and why a table's pass stopped early: a typed kind
// for programs (metrics, tests, the pass's outcome) and the detail people
// read.
type Early struct {
	// Kind is one of the early-stop kinds (KindRunTime, KindLockWait...);
	// empty: the pass did not stop early.
	Kind Kind
	// Detail is the human text ("run time reached while throttled (replica
	// lag 2.1s)"); empty: the kind's own text.
	Detail string
}

// Stopped reports whether the pass stopped early.
func (e Early) Stopped() bool { return e.Kind != "" }

// String is what the CLI prints after "stopped early: ", and "" when the
// pass did not stop early.
func (e Early) String() string {
	if e.Detail != "" {
		return e.Detail
	}
	switch e.Kind {
	case KindRunTime:
		return "run time reached"
	case KindThrottled:
		return "throttled"
	case KindLease:
		return "the lease was lost"
	case KindSettingsChanged:
		return ErrSettingsChanged.Error()
	case KindLockWait:
		return "a session waited on a lock the daemon held"
	}
	return string(e.Kind)
}

// MarshalText keeps the JSON and log forms the readable text.
func (e Early) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// The usual stops.
var (
	AtRunTime  = Early{Kind: KindRunTime}
	AtShutdown = Early{Kind: KindShutdown}
	AtLockWait = Early{Kind: KindLockWait}
)

// Throttled is a stop while throttled, with the throttle's reason.
func Throttled(detail string) Early { return Early{Kind: KindThrottled, Detail: detail} }

// ErrSettingsChanged is what an active check returns when the runtime
// settings changed since the pass began.
var ErrSettingsChanged = errors.New("the runtime settings changed; the next pass applies them")

// Inactive is the stop for an error of the active check run before each
// batch: the runtime settings changed, or else the lease is no longer ours.
func Inactive(err error) Early {
	if errors.Is(err, ErrSettingsChanged) {
		return Early{Kind: KindSettingsChanged}
	}
	return Early{Kind: KindLease, Detail: err.Error()}
}

// StopError ends a piece of work early without being a failure (the lease
// was lost, the throttle held it until shutdown): retry.Do does not retry
// it, and the table's result says how it stopped.
type StopError struct{ Early Early }

func (e StopError) Error() string { return e.Early.String() }
