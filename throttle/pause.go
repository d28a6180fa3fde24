package throttle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
)

// A manual pause: `inboxkeeper pause`, stored in the control schema, so
// every instance on the database obeys it until `inboxkeeper resume` or
// until its --for runs out.
const ManualPause = "manual_pause"

func init() {
	register(kind{name: ManualPause, poll: (*Throttler).measurePause, interval: time.Second})
}

func (t *Throttler) measurePause(ctx context.Context) {
	p, err := ActivePause(ctx, t.pool)
	if !t.recorded(ctx, readPause, err) {
		return
	}
	r := Reading{Kind: ManualPause, Threshold: 0}
	if p != nil {
		r.Value, r.Detail = 1, p.String()
	}
	t.set(r)
}

// Querier is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Pause is a manual pause stored in the control schema, so every instance
// on the database obeys it.
type Pause struct {
	Reason   string
	PausedBy string
	PausedAt time.Time
	Until    *time.Time
}

func (p Pause) String() string {
	s := fmt.Sprintf("paused by %s since %s: %s", p.PausedBy, p.PausedAt.UTC().Format(time.RFC3339), p.Reason)
	if p.Until != nil {
		s += " (until " + p.Until.UTC().Format(time.RFC3339) + ")"
	}
	return s
}

// SetPause pauses every instance, replacing any earlier pause. A zero for
// means until `inboxkeeper resume`.
//
// by names who asked (the host's user and name); the record says which
// database role wrote it too. The commit is durable (dbconn.Durable): a
// pause that was reported holds after a crash.
func SetPause(ctx context.Context, db TxStarter, reason, by string, forDur time.Duration) (Pause, error) {
	if reason == "" {
		return Pause{}, errors.New("a pause needs a reason")
	}
	var micros *int64
	if forDur > 0 {
		m := forDur.Microseconds()
		micros = &m
	}
	var p Pause
	err := dbconn.Durable(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `INSERT INTO inboxkeeper.pause (reason, paused_by, paused_at, until)
VALUES ($1, 'role ' || current_user || ' (' || $2 || ')', now(), now() + $3::int8 * interval '1 microsecond')
ON CONFLICT (id) DO UPDATE SET reason = excluded.reason, paused_by = excluded.paused_by,
  paused_at = excluded.paused_at, until = excluded.until
RETURNING reason, paused_by, paused_at, until`, reason, by, micros).Scan(&p.Reason, &p.PausedBy, &p.PausedAt, &p.Until)
	})
	return p, err
}

// TxStarter starts a transaction: *pgxpool.Pool, *pgx.Conn.
type TxStarter interface {
	Begin(context.Context) (pgx.Tx, error)
}

// ClearPause resumes every instance; it reports whether a pause was active.
func ClearPause(ctx context.Context, db TxStarter) (bool, error) {
	var n int
	err := dbconn.Durable(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `WITH d AS (DELETE FROM inboxkeeper.pause RETURNING until)
SELECT count(*) FROM d WHERE until IS NULL OR until > now()`).Scan(&n)
	})
	return n > 0, err
}

// ActivePause returns the pause in force at the database's now, or nil.
func ActivePause(ctx context.Context, db Querier) (*Pause, error) {
	var p Pause
	err := db.QueryRow(ctx, `SELECT reason, paused_by, paused_at, until FROM inboxkeeper.pause
WHERE until IS NULL OR until > now()`).Scan(&p.Reason, &p.PausedBy, &p.PausedAt, &p.Until)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &p, nil
}
