package retry

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Kind names how a piece of work ended short: an attempt that failed (the
// kind label of inboxkeeper_errors_total, and what the retry decisions go
// by), or a table's pass that stopped early (Early). One event has one
// name: a session queued behind the daemon is KindLockWait whether it
// failed a batch or ended a pass.
type Kind string

// Kinds of failed attempts.
const (
	KindLockTimeout      Kind = "lock_timeout"      // our lock_timeout ran out (55P03)
	KindDeadlock         Kind = "deadlock"          // 40P01
	KindStatementTimeout Kind = "statement_timeout" // our statement_timeout, or a cancel (57014)
	KindSerialization    Kind = "serialization"     // 40001
	KindConnection       Kind = "connection"        // the connection broke, or the server is going away
	// KindPrivilege: the role lacks a privilege or an ownership (42501).
	// Trying again changes nothing until a grant does: a failure, never
	// a wait.
	KindPrivilege Kind = "privilege"
	// KindFence: the hold fence was held against the step past its lock
	// timeout (a hold or replay being written, or a session holding a
	// conflicting lock on inboxkeeper.fence).
	KindFence Kind = "fence"
	KindOther Kind = "other"
)

// KindLockWait is a session that queued behind a lock the daemon held: the
// batch or DDL statement was cancelled to let it through (ErrLockWait), and
// the table's pass stops there.
const KindLockWait Kind = "lock_wait"

// Kinds of early stops: why a table's pass ended before its work was done.
const (
	// KindRunTime: INBOXKEEPER_RUN_TIME was reached between batches.
	KindRunTime Kind = "run_time"
	// KindThrottled: the throttle held the work back until the run time
	// was reached, or a partition DDL step gave up waiting on it.
	KindThrottled Kind = "throttled"
	// KindLease: this instance no longer holds the lease.
	KindLease Kind = "lease"
	// KindSettingsChanged: the runtime settings changed; the next pass
	// applies them.
	KindSettingsChanged Kind = "settings_changed"
	// KindShutdown: a signal ended the process's work; the batch in flight
	// rolled back.
	KindShutdown Kind = "shutdown"
)

// ErrorKinds are the kinds of failed attempts, as label values.
var ErrorKinds = []string{string(KindLockTimeout), string(KindDeadlock), string(KindStatementTimeout), string(KindSerialization),
	string(KindConnection), string(KindLockWait), string(KindPrivilege), string(KindFence), string(KindOther)}

// ErrPrivilege marks a failure for want of a privilege that the code
// found itself (a dry run's check), as a 42501 from the server is.
var ErrPrivilege = errors.New("insufficient privilege")

// ErrFence marks a step that could not take the hold fence in time
// (holds.ErrFenceBlocked wraps it).
var ErrFence = errors.New("the hold fence (inboxkeeper.fence) is held against the cleanup")

// ErrLockWait marks a transaction or statement cancelled because another
// session queued behind a lock it held (the throttle's lock-wait watch).
var ErrLockWait = errors.New("a session waited on a lock this transaction held; cancelled and rolled back")

// ErrLateWrite marks a statement that failed on a row another session
// committed after the statement's snapshot was taken, which the statement
// could not see (a row that began to point at a row it deleted): run again,
// with a new snapshot, it sees the row. Transient, and counted as
// KindSerialization, the other conflict with a snapshot.
var ErrLateWrite = errors.New("a row committed after the statement's snapshot")

// SQLSTATEs the project tells apart.
const (
	SQLStateLockTimeout      = "55P03" // lock_not_available: lock_timeout ran out
	SQLStateDeadlock         = "40P01"
	SQLStateQueryCanceled    = "57014" // statement_timeout, or a cancel request
	SQLStateSerialization    = "40001"
	SQLStateAdminShutdown    = "57P01"
	SQLStateCrashShutdown    = "57P02"
	SQLStateCannotConnectNow = "57P03"
	// The server ended the session for sitting idle: in a transaction
	// (idle_in_transaction_session_timeout: a frozen process, whose batch
	// rolled back) or outside one (idle_session_timeout). The connection is
	// gone, as in a restart.
	SQLStateIdleInTxTimeout    = "25P03"
	SQLStateIdleSessionTimeout = "57P05"
	SQLStateDuplicateTable     = "42P07"
	SQLStateInvalidDefinition  = "42P17" // invalid_object_definition: a partition range that overlaps another
	SQLStateUniqueViolation    = "23505"
	SQLStateForeignKey         = "23503" // foreign_key_violation: a row another table points at
	SQLStateInsufficientPriv   = "42501"
	SQLStateInvalidSchemaName  = "3F000"
)

// Code is the SQLSTATE of err, or "" when it is not a server's error.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// KindOf classifies an error.
func KindOf(err error) Kind {
	if errors.Is(err, ErrLockWait) {
		return KindLockWait
	}
	if errors.Is(err, ErrFence) {
		return KindFence
	}
	if errors.Is(err, ErrPrivilege) {
		return KindPrivilege
	}
	if errors.Is(err, ErrLateWrite) {
		return KindSerialization
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == SQLStateInsufficientPriv:
			return KindPrivilege
		case pgErr.Code == SQLStateLockTimeout:
			return KindLockTimeout
		case pgErr.Code == SQLStateDeadlock:
			return KindDeadlock
		case pgErr.Code == SQLStateQueryCanceled:
			return KindStatementTimeout
		case pgErr.Code == SQLStateSerialization:
			return KindSerialization
		case pgErr.Code == SQLStateAdminShutdown, pgErr.Code == SQLStateCrashShutdown, pgErr.Code == SQLStateCannotConnectNow,
			pgErr.Code == SQLStateIdleInTxTimeout, pgErr.Code == SQLStateIdleSessionTimeout,
			strings.HasPrefix(pgErr.Code, "08"): // connection exceptions
			return KindConnection
		}
		return KindOther
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrTxClosed) {
		return KindConnection
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		// COMMIT answered ROLLBACK: on a Citus coordinator, a worker went
		// away during the two-phase commit (its warnings name it). Nothing
		// committed, so the batch may run again.
		return KindConnection
	}
	var netErr interface{ Timeout() bool }
	if errors.As(err, &netErr) {
		return KindConnection
	}
	return KindOther
}

// Transient reports whether an attempt that failed with this kind may
// succeed when repeated. lock_wait is not among them: whoever waited on us
// comes first, and the caller decides when to come back.
func (k Kind) Transient() bool {
	switch k {
	case KindLockTimeout, KindDeadlock, KindStatementTimeout, KindSerialization, KindConnection, KindFence:
		return true
	}
	return false
}
