// Package retry names how work ends short, and retries what is transient.
//
// One set of kinds (Kind) names both a failed attempt, classified from its
// SQLSTATE (the kind label of inboxkeeper_errors_total), and the reason a
// table's pass stopped early (Early): a session queued behind the daemon is
// KindLockWait in both. Do is the one retry loop of the daemon: batches,
// partition DDL, waiting for the database at startup and for the lease.
// Daemon internals.
package retry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy is how Do retries.
type Policy struct {
	MaxRetries int           // retries after the first attempt; negative: until ctx ends
	Base       time.Duration // the first wait; it doubles (see Backoff)
	Max        time.Duration // the longest wait; 0: 5 s
	// Retry decides whether a failure is worth another attempt; nil means
	// its kind is Transient.
	Retry func(err error, kind Kind) bool
	// OnRetry is told before each wait: logs, metrics.
	OnRetry func(kind Kind, attempt int, wait time.Duration, err error)
}

// Do runs attempt (numbered from 0) until it succeeds, fails in a way the
// policy does not retry, has been retried MaxRetries times, or ctx ends,
// and returns the last error (ctx's, when it ended a wait).
func Do(ctx context.Context, p Policy, attempt func(n int) error) error {
	for n := 0; ; n++ {
		err := attempt(n)
		if err == nil || ctx.Err() != nil || (p.MaxRetries >= 0 && n >= p.MaxRetries) {
			return err
		}
		kind := KindOf(err)
		retryable := kind.Transient()
		if p.Retry != nil {
			retryable = p.Retry(err, kind)
		}
		if !retryable {
			return err
		}
		wait := Backoff(n, p.Base, p.Max)
		if p.OnRetry != nil {
			p.OnRetry(kind, n, wait, err)
		}
		if err := Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// Backoff is the wait before retry number attempt (from 0): base doubling,
// at most max (0: 5 s), with the upper half jittered.
func Backoff(attempt int, base, max time.Duration) time.Duration {
	if max <= 0 {
		max = 5 * time.Second
	}
	d := min(base<<min(attempt, 10), max)
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
