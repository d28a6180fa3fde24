package service

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Clock is the one idea of "now" every service has (River's time
// generator): the real time unless a test pins it. What is expired is
// decided by the database's clock, never the host's: SQL receives Pinned
// as a parameter and falls back to now() (coalesce($1::timestamptz,
// now())). What the daemon times itself (the throttle's windows and rates,
// log rate limits) reads Now, the host's clock.
type Clock func() time.Time

// At is a clock pinned at t: how tests fix "now".
func At(t time.Time) Clock { return func() time.Time { return t } }

// Now is the pinned time, or the host's.
func (c Clock) Now() time.Time {
	if c == nil {
		return time.Now()
	}
	return c()
}

// Pinned is the pinned time, or nil for the database's clock: the argument
// of a coalesce($n::timestamptz, now()).
func (c Clock) Pinned() *time.Time {
	if c == nil {
		return nil
	}
	t := c()
	return &t
}

// Querier reads a row: pgx.Tx, *pgx.Conn, *pgxpool.Pool.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// DBNow is the pinned time, or db's now() (the transaction's start).
func (c Clock) DBNow(ctx context.Context, db Querier) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, "SELECT coalesce($1::timestamptz, now())", c.Pinned()).Scan(&now)
	return now, err
}
