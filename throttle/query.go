package throttle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// INBOXKEEPER_THROTTLE_QUERY: SQL run every second on the primary; a first
// column above 0 pauses, and so does a query that fails.
const CustomQuery = "custom_query"

func init() {
	register(kind{name: CustomQuery, poll: (*Throttler).measureQuery, interval: time.Second,
		on:     func(t *Throttler) bool { return t.cfg.ThrottleQuery != "" },
		format: func(r Reading) string { return fmt.Sprintf(": %g (throttles above 0)", r.Value) }})
}

// measureQuery runs the custom throttle query; an error throttles (fail
// closed), and says why.
func (t *Throttler) measureQuery(ctx context.Context) {
	var v *float64
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := t.pool.QueryRow(qctx, t.cfg.ThrottleQuery).Scan(&v)
	if ctx.Err() != nil {
		return
	}
	r := Reading{Kind: CustomQuery, Threshold: 0}
	switch {
	case err != nil:
		r.Value, r.Detail = unknown, "query failed: "+err.Error()
	case v != nil:
		r.Value = *v
	}
	t.set(r)
}

// CheckQuery runs the custom throttle query once, as the daemon starts: a
// query that does not parse, fails or does not return a number is a
// configuration mistake to report at once, not a pause for ever. No row
// passes: it pauses (fail closed) but may be what the query means.
func CheckQuery(ctx context.Context, db Querier, query string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var v *float64
	if err := db.QueryRow(ctx, query).Scan(&v); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("INBOXKEEPER_THROTTLE_QUERY: %w", err)
	}
	return nil
}
