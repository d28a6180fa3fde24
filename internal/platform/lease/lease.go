// Package lease makes one instance per database the active one. The lease
// is a row in the control schema with an expiry on the database's clock; the
// holder renews it, and another instance takes it over once it has run out.
//
// Two instances working at once would still be safe (batches skip each
// other's locked rows, holds are fenced for every batch), so the lease is
// about not doing the work twice, not about correctness.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// DB is satisfied by *pgxpool.Pool and *pgx.Conn.
type DB interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Lease is one instance's view of the lease.
type Lease struct {
	db     DB
	holder string
	ttl    time.Duration
	log    *slog.Logger
	// Outages, when set before Start, is the daemon's account of the
	// database's outages: a renewal that fails because the database does
	// not answer is said there, once for the daemon, and one that works
	// ends it.
	Outages *outage.Log
	fails   *outage.Log // the keeper's own: said once, and when it ends

	// attempt serializes the attempts to take or renew the lease, so that
	// Acquire can see what one that ended a moment ago found (tried).
	attempt sync.Mutex
	tried   time.Time // when the last attempt that reached the database ended

	// environment is what this instance publishes with its lease
	// (Publish); nil: nothing.
	environment []byte

	mu         sync.Mutex
	validUntil time.Time // host monotonic clock: when our hold certainly ends
	other      Holder    // the other holder, when we do not hold it
	holding    bool
}

// Holder describes who holds the lease.
type Holder struct {
	Name      string
	ExpiresAt time.Time
	// Environment is what the holder published of the environment it
	// runs with (Publish): a JSON object, or nil when it published none.
	Environment []byte
}

// New returns a lease handle for this process. Holder names are
// hostname/pid plus a start time, so a restarted process is a new holder.
// MaxTTL is the longest INBOXKEEPER_LEASE_TTL: a lease row that runs out
// further ahead than that is not honoured.
const MaxTTL = config.MaxLeaseTTL

func New(db DB, ttl time.Duration, log *slog.Logger) *Lease {
	host, _ := os.Hostname()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Lease{db: db, ttl: ttl, log: log, fails: outage.New(nil),
		holder: fmt.Sprintf("%s/%d/%d", host, os.Getpid(), time.Now().UnixNano())}
}

// Name is this instance's holder name.
func (l *Lease) Name() string { return l.holder }

// Publish has the lease row carry environment (a JSON object) while this
// instance holds it: status and settings, run from another shell, read
// the daemon's environment there instead of their own. Call it before the
// lease is first taken.
func (l *Lease) Publish(environment []byte) { l.environment = environment }

// TryAcquire takes or renews the lease once. It reports whether this
// instance holds it, and otherwise who does.
func (l *Lease) TryAcquire(ctx context.Context) (bool, Holder, error) {
	l.attempt.Lock()
	defer l.attempt.Unlock()
	return l.try(ctx)
}

// Acquire is TryAcquire, unless an attempt ended less than a second ago:
// then what that one found stands. As the daemon starts, its keeper (Keep)
// and its first pass both try to take the lease at once; one statement
// does for both (both ran in some starts, seen in the statement log while
// tracing the variation of cmd/inboxkeeper's TestIdleDaemonIsQuiet).
func (l *Lease) Acquire(ctx context.Context) (bool, Holder, error) {
	l.attempt.Lock()
	defer l.attempt.Unlock()
	if !l.tried.IsZero() && time.Since(l.tried) < time.Second {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.holding && time.Now().Before(l.validUntil) {
			return true, Holder{Name: l.holder}, nil
		}
		if !l.holding && l.other.Name != "" {
			return false, l.other, nil
		}
	}
	return l.try(ctx)
}

// try is TryAcquire under attempt.
func (l *Lease) try(ctx context.Context) (bool, Holder, error) {
	held, h, err := l.tryAcquire(ctx)
	if errors.Is(err, errReleased) {
		// Released between taking and reading it: it is free now.
		held, h, err = l.tryAcquire(ctx)
	}
	if err == nil {
		l.tried = time.Now()
	}
	return held, h, err
}

// errReleased: the lease was held by another instance when this one tried
// to take it, and gone when it read who holds it.
var errReleased = errors.New("released meanwhile")

func (l *Lease) tryAcquire(ctx context.Context) (bool, Holder, error) {
	start := time.Now()
	var got string
	var beyond *time.Time
	// A lease that runs out further ahead than MaxTTL from now was not
	// written by an instance renewing it: a row is data to check, not an
	// order to wait for ever. It is taken over, and said so.
	err := l.db.QueryRow(ctx, `
WITH old AS (SELECT holder, expires_at FROM inboxkeeper.lease)
INSERT INTO inboxkeeper.lease AS l (holder, acquired_at, renewed_at, expires_at, environment)
VALUES ($1, now(), now(), now() + $2 * interval '1 millisecond', $4::jsonb)
ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, renewed_at = now(), expires_at = excluded.expires_at,
    environment = excluded.environment,
    acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE now() END
WHERE l.holder = excluded.holder OR l.expires_at < now() OR l.expires_at > now() + $3 * interval '1 millisecond'
RETURNING holder, (SELECT o.expires_at FROM old o WHERE o.holder <> $1 AND o.expires_at > now() + $3 * interval '1 millisecond')`,
		l.holder, l.ttl.Milliseconds(), max(l.ttl, MaxTTL).Milliseconds(), l.published()).Scan(&got, &beyond)
	if err == nil && beyond != nil {
		l.log.Warn("lease: took over a lease that ran out further ahead than the longest INBOXKEEPER_LEASE_TTL allows; no instance renewing it writes that, so it is not honoured",
			"holder", l.holder, "expires_at", beyond.UTC().Format(time.RFC3339), "max_lease_ttl", MaxTTL)
	}
	if err == nil {
		l.mu.Lock()
		was := l.holding
		// The database's expiry is its now + ttl, and its now is no earlier
		// than our start; a fifth of the ttl is kept as slack for clock rate.
		l.validUntil = start.Add(l.ttl * 4 / 5)
		l.holding = true
		l.mu.Unlock()
		if !was {
			l.log.Info("lease: this instance is now the active one", "holder", l.holder)
		}
		return true, Holder{Name: l.holder}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		l.lost()
		return false, Holder{}, fmt.Errorf("lease: %w", err)
	}
	var h Holder
	if err := l.db.QueryRow(ctx, "SELECT holder, expires_at FROM inboxkeeper.lease").Scan(&h.Name, &h.ExpiresAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			err = errReleased
		}
		l.lost()
		return false, Holder{}, fmt.Errorf("lease: read holder: %w", err)
	}
	l.mu.Lock()
	was, prev := l.holding, l.other
	l.holding, l.other = false, h
	l.mu.Unlock()
	if was || prev.Name != h.Name {
		l.log.Info("lease: another instance is active; waiting", "holder", h.Name, "expires_at", h.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return false, h, nil
}

// published is the environment as the statement's parameter: NULL when
// there is none.
func (l *Lease) published() *string {
	if l.environment == nil {
		return nil
	}
	s := string(l.environment)
	return &s
}

func (l *Lease) lost() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holding && time.Now().After(l.validUntil) {
		l.holding = false
		l.log.Warn("lease: could not renew; no longer active", "holder", l.holder)
	}
}

// Held reports whether this instance certainly holds the lease right now.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holding && time.Now().Before(l.validUntil)
}

// fresh says the lease was taken or renewed less than a third of its ttl
// ago (validUntil is that moment plus 4/5 of the ttl).
func (l *Lease) fresh() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holding && time.Until(l.validUntil) > l.ttl*4/5-l.ttl/3
}

// activeFor is how much longer this instance certainly holds the lease
// without a renewal: 0 when it does not.
func (l *Lease) activeFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.holding {
		return 0
	}
	return max(time.Until(l.validUntil), 0).Round(time.Millisecond)
}

// Check returns nil while the lease is held; the deleter asks before every
// batch.
func (l *Lease) Check() error {
	if l.Held() {
		return nil
	}
	return errors.New("this instance no longer holds the lease")
}

// Keep renews (or tries to take) the lease every third of its ttl until ctx
// ends. A lease taken less than a third of its ttl ago (Wait, just before)
// is first renewed a third of its ttl from now: a renewal at once would be
// a round trip (and a connection) for nothing, and a `once` that ends
// before it would cancel it mid-statement. A lease not held it tries to
// take at once, as Acquire does: the daemon's first pass tries too.
func (l *Lease) Keep(ctx context.Context) {
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	for fresh, first := l.fresh(), true; ; fresh, first = false, false {
		if fresh {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		try := l.TryAcquire
		if first && !fresh {
			try = l.Acquire // the daemon's first pass may have just tried
		}
		_, _, err := try(ctx)
		if retry.KindOf(err) == retry.KindConnection && ctx.Err() == nil {
			// Once more at once, on another connection: the pool's may
			// have been closed under it (idle_session_timeout, a restart
			// long over), which is no outage.
			_, _, err = l.TryAcquire(ctx)
		}
		if ctx.Err() == nil {
			l.kept(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// kept logs how an attempt of the keeper went, once per cause of failure
// (on a standby every attempt fails the same way until promotion; while
// the database is down, every one until it is back) and once when it
// works again.
func (l *Lease) kept(err error) {
	const subject = "lease"
	switch {
	case err == nil:
		l.Outages.DatabaseAnswers()
		if e, ok := l.fails.Ended(subject); ok && e.Said {
			l.log.Info("lease: taken or renewed again", "failed_for", e.Lasted, "attempts_failed", e.Failures)
		}
	case l.Outages.DatabaseFailed(err):
	default:
		if cause := outage.Cause(err); l.fails.Failed(subject, cause) {
			l.log.Warn("lease: cannot take or renew the lease; said once until it works again", "cause", cause, "error", err,
				"active_for_at_most", l.activeFor())
		}
	}
}

// Start keeps the lease in the background (Keep) until the returned stop,
// which waits for the keeper and then releases the lease, so that the next
// instance need not wait for it to run out.
func (l *Lease) Start(ctx context.Context) (stop func()) {
	keepCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Keep(keepCtx) }()
	return func() {
		cancel()
		<-done
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		l.Release(rctx)
	}
}

// ErrHeld is Wait's error when another instance held the lease for as long
// as it waited.
type ErrHeld struct {
	Holder Holder
	For    time.Duration
}

func (e ErrHeld) Error() string {
	return fmt.Sprintf("another instance (%s) held the lease for %s", e.Holder.Name, humantime.Format(e.For))
}

// Wait takes the lease, trying again every third of its ttl while another
// instance holds it, for at most giveUp (0: until ctx ends). It returns
// ErrHeld when giveUp ran out first.
func (l *Lease) Wait(ctx context.Context, giveUp time.Duration) error {
	wctx := ctx
	if giveUp > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, giveUp)
		defer cancel()
	}
	var holder Holder
	err := retry.Do(wctx, retry.Policy{MaxRetries: -1, Base: l.ttl / 3, Max: l.ttl / 3,
		Retry: func(err error, _ retry.Kind) bool { return errors.Is(err, errHeldNow) }},
		func(int) error {
			held, h, err := l.TryAcquire(wctx)
			switch {
			case err != nil:
				return err
			case !held:
				holder = h
				return errHeldNow
			}
			return nil
		})
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return ErrHeld{Holder: holder, For: giveUp}
	}
	return err
}

// errHeldNow is one attempt of Wait that found the lease held.
var errHeldNow = errors.New("lease: held by another instance")

// Release gives the lease up, so that another instance need not wait for it
// to run out.
func (l *Lease) Release(ctx context.Context) {
	var n int
	// Durable (dbconn.DurableCTE): a release that comes back after a crash
	// makes the next instance wait for the lease to run out.
	if err := l.db.QueryRow(ctx, "WITH s AS ("+dbconn.DurableCTE+"), d AS (DELETE FROM inboxkeeper.lease WHERE holder = $1 RETURNING 1) SELECT count(*) FROM d, s", l.holder).Scan(&n); err != nil {
		// The next instance waits for the lease to run out instead.
		l.log.Warn("lease: could not release", "error", err, "runs_out_within", l.ttl)
	}
	l.mu.Lock()
	l.holding = false
	l.mu.Unlock()
}

// Current reads who holds the lease, for status.
func Current(ctx context.Context, db DB) (*Holder, error) {
	var h Holder
	err := db.QueryRow(ctx, "SELECT holder, expires_at, environment FROM inboxkeeper.lease WHERE expires_at > now()").Scan(&h.Name, &h.ExpiresAt, &h.Environment)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &h, nil
}
