// Package retry classifies PostgreSQL errors into the kinds the metrics and
// the retry decisions of every batch and DDL statement use, and paces the
// retries.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrLockWait marks a transaction or statement cancelled because another
// session queued behind a lock it held (the throttle's lock-wait watch).
var ErrLockWait = errors.New("a session waited on a lock this transaction held; cancelled and rolled back")

// Kinds are the values of the kind label of inboxkeeper_errors_total.
var Kinds = []string{"lock_timeout", "deadlock", "statement_timeout", "serialization", "connection", "lock_wait", "other"}

// SQLSTATEs the retry decisions and the fence read.
const (
	SQLStateLockTimeout = "55P03" // lock_not_available: lock_timeout ran out
)

// Kind classifies an error.
func Kind(err error) string {
	if errors.Is(err, ErrLockWait) {
		return "lock_wait"
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case SQLStateLockTimeout:
			return "lock_timeout"
		case "40P01":
			return "deadlock"
		case "57014":
			return "statement_timeout"
		case "40001":
			return "serialization"
		case "57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004":
			return "connection"
		}
		return "other"
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrTxClosed) {
		return "connection"
	}
	var netErr interface{ Timeout() bool }
	if errors.As(err, &netErr) {
		return "connection"
	}
	return "other"
}

// Transient reports whether an attempt that failed with this kind may
// succeed when repeated. lock_wait is not among them: whoever waited on us
// comes first, and the caller decides when to come back.
func Transient(kind string) bool {
	switch kind {
	case "lock_timeout", "deadlock", "statement_timeout", "serialization", "connection":
		return true
	}
	return false
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
