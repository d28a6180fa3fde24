package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgErr(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}) }

func TestKind(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]Kind{
		pgErr(SQLStateLockTimeout):                         KindLockTimeout,
		pgErr(SQLStateDeadlock):                            KindDeadlock,
		pgErr(SQLStateQueryCanceled):                       KindStatementTimeout,
		pgErr(SQLStateSerialization):                       KindSerialization,
		pgErr(SQLStateAdminShutdown):                       KindConnection,
		pgErr("08006"):                                     KindConnection,
		pgErr(SQLStateIdleInTxTimeout):                     KindConnection, // a frozen process's batch
		pgErr("23505"):                                     KindOther,
		pgErr(SQLStateForeignKey):                          KindOther,
		fmt.Errorf("%w: %w", ErrLateWrite, pgErr("23503")): KindSerialization,
		fmt.Errorf("x: %w", ErrLockWait):                   KindLockWait,
		errors.New("plain"):                                KindOther,
		fmt.Errorf("%w (%v)", ErrLockWait, pgErr("57014")): KindLockWait,
		fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback):  KindConnection,
	} {
		if got := KindOf(err); got != want {
			t.Errorf("KindOf(%v) = %s, want %s", err, got, want)
		}
	}
	if !KindLockTimeout.Transient() || KindLockWait.Transient() || KindOther.Transient() {
		t.Error("Transient is wrong")
	}
}

func TestDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fast := Policy{MaxRetries: 3, Base: time.Microsecond}

	var retries []Kind
	p := fast
	p.OnRetry = func(k Kind, attempt int, _ time.Duration, _ error) { retries = append(retries, k) }
	n := 0
	err := Do(ctx, p, func(int) error {
		n++
		if n < 3 {
			return pgErr(SQLStateLockTimeout)
		}
		return nil
	})
	if err != nil || n != 3 || len(retries) != 2 {
		t.Errorf("transient failures then success: err %v after %d attempts, %d retries", err, n, len(retries))
	}

	n = 0
	err = Do(ctx, fast, func(int) error { n++; return pgErr(SQLStateLockTimeout) })
	if KindOf(err) != KindLockTimeout || n != 4 {
		t.Errorf("always failing: %v after %d attempts, want 1 + 3 retries", err, n)
	}

	n = 0
	err = Do(ctx, fast, func(int) error { n++; return pgErr("23505") })
	if n != 1 || err == nil {
		t.Errorf("a permanent failure was retried: %d attempts", n)
	}

	p = fast
	p.Retry = func(_ error, k Kind) bool { return k == KindLockWait }
	n = 0
	err = Do(ctx, p, func(int) error { n++; return ErrLockWait })
	if n != 4 || !errors.Is(err, ErrLockWait) {
		t.Errorf("a custom Retry was not used: %d attempts, %v", n, err)
	}

	cctx, cancel := context.WithCancel(ctx)
	n = 0
	err = Do(cctx, Policy{MaxRetries: 100, Base: time.Hour}, func(int) error {
		n++
		cancel()
		return pgErr(SQLStateLockTimeout)
	})
	if n != 1 || err == nil {
		t.Errorf("a cancelled context went on: %d attempts, %v", n, err)
	}
}

// A negative MaxRetries retries until the attempt succeeds; every wait
// stays within Max, jittered in its upper half.
func TestDoUntilDone(t *testing.T) {
	t.Parallel()
	var waits []time.Duration
	n := 0
	err := Do(context.Background(), Policy{MaxRetries: -1, Base: time.Microsecond, Max: 4 * time.Microsecond,
		OnRetry: func(_ Kind, _ int, wait time.Duration, _ error) { waits = append(waits, wait) }},
		func(int) error {
			if n++; n < 12 {
				return pgErr(SQLStateLockTimeout)
			}
			return nil
		})
	if err != nil || n != 12 {
		t.Fatalf("%d attempts, %v; want success at the 12th", n, err)
	}
	for i, w := range waits {
		if w > 4*time.Microsecond || (i >= 2 && w < 2*time.Microsecond) {
			t.Errorf("wait %d: %s, want within [Max/2, Max] once the base has doubled past it", i, w)
		}
	}
}
