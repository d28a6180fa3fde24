// Package retry classifies PostgreSQL errors into the kinds the metrics and
// the retry decisions of every batch and DDL statement use, and paces the
// retries.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrLockWait marks a transaction or statement cancelled because another
// session queued behind a lock it held (the throttle's lock-wait watch).
var ErrLockWait = errors.New("a session waited on a lock this transaction held; cancelled and rolled back")

// ErrorKind is what kind of failure an error is: the kind label of
// inboxkeeper_errors_total, and what the retry decisions go by.
type ErrorKind string

// The kinds.
const (
	KindLockTimeout      ErrorKind = "lock_timeout"      // our lock_timeout ran out (55P03)
	KindDeadlock         ErrorKind = "deadlock"          // 40P01
	KindStatementTimeout ErrorKind = "statement_timeout" // our statement_timeout, or a cancel (57014)
	KindSerialization    ErrorKind = "serialization"     // 40001
	KindConnection       ErrorKind = "connection"        // the connection broke, or the server is going away
	KindLockWait         ErrorKind = "lock_wait"         // someone queued behind us, and we were cancelled (ErrLockWait)
	KindOther            ErrorKind = "other"
)

// Kinds are every ErrorKind, as label values.
var Kinds = []string{string(KindLockTimeout), string(KindDeadlock), string(KindStatementTimeout), string(KindSerialization),
	string(KindConnection), string(KindLockWait), string(KindOther)}

// SQLSTATEs the kinds are made of.
const (
	SQLStateLockTimeout       = "55P03" // lock_not_available: lock_timeout ran out
	SQLStateDeadlock          = "40P01"
	SQLStateQueryCanceled     = "57014" // statement_timeout, or a cancel request
	SQLStateSerialization     = "40001"
	SQLStateAdminShutdown     = "57P01"
	SQLStateCrashShutdown     = "57P02"
	SQLStateCannotConnectNow  = "57P03"
	SQLStatePreparedStmtTaken = "42P05" // duplicate_prepared_statement: a pooler shared a server connection
)

// Kind classifies an error.
func Kind(err error) ErrorKind {
	if errors.Is(err, ErrLockWait) {
		return KindLockWait
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == SQLStateLockTimeout:
			return KindLockTimeout
		case pgErr.Code == SQLStateDeadlock:
			return KindDeadlock
		case pgErr.Code == SQLStateQueryCanceled:
			return KindStatementTimeout
		case pgErr.Code == SQLStateSerialization:
			return KindSerialization
		case pgErr.Code == SQLStateAdminShutdown, pgErr.Code == SQLStateCrashShutdown, pgErr.Code == SQLStateCannotConnectNow,
			strings.HasPrefix(pgErr.Code, "08"): // connection exceptions
			return KindConnection
		}
		return KindOther
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrTxClosed) {
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
func (k ErrorKind) Transient() bool {
	switch k {
	case KindLockTimeout, KindDeadlock, KindStatementTimeout, KindSerialization, KindConnection:
		return true
	}
	return false
}

// Transient is ErrorKind.Transient, for a kind given as a label value.
func Transient(kind ErrorKind) bool { return kind.Transient() }

// Policy is how Do retries.
type Policy struct {
	MaxRetries int           // retries after the first attempt
	Base       time.Duration // the first wait; it doubles (see Backoff)
	// Retry decides whether a failure is worth another attempt; nil means
	// its kind is Transient.
	Retry func(err error, kind ErrorKind) bool
	// OnRetry is told before each wait: logs, metrics.
	OnRetry func(kind ErrorKind, attempt int, wait time.Duration, err error)
}

// Do runs attempt (numbered from 0) until it succeeds, fails in a way the
// policy does not retry, has been retried MaxRetries times, or ctx ends,
// and returns the last error. Every retry loop of the daemon, batch or DDL,
// goes through it.
func Do(ctx context.Context, p Policy, attempt func(n int) error) error {
	for n := 0; ; n++ {
		err := attempt(n)
		if err == nil || ctx.Err() != nil || n >= p.MaxRetries {
			return err
		}
		kind := Kind(err)
		retryable := kind.Transient()
		if p.Retry != nil {
			retryable = p.Retry(err, kind)
		}
		if !retryable {
			return err
		}
		wait := Backoff(n, p.Base)
		if p.OnRetry != nil {
			p.OnRetry(kind, n, wait, err)
		}
		if err := Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// Backoff is the wait before retry number attempt (from 0): base doubling,
// at most 5 s, with the upper half jittered.
func Backoff(attempt int, base time.Duration) time.Duration {
	d := base << min(attempt, 6)
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Millis spells d as a PostgreSQL setting value (lock_timeout and the like).
func Millis(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }
