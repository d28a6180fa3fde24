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
	v, err := readQuery(ctx, t.pool, t.cfg.ThrottleQuery)
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

// Beginner starts transactions: a pool or a connection.
type Beginner interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}

// readQuery runs the custom throttle query, one statement, within 5 s in a
// READ ONLY transaction that it rolls back: the query is a reading, and
// whatever it would write (a DELETE ... RETURNING, a function that inserts,
// nextval, SELECT ... FOR UPDATE, a temporary table) fails instead, and is
// never kept, in the daemon, in `status` and in a dry run alike.
// pgx.ErrNoRows: it returned no row.
func readQuery(ctx context.Context, db Beginner, query string) (v *float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	// The extended protocol takes one statement: a "COMMIT; DELETE ..."
	// sent in the simple protocol (default_query_exec_mode=simple_protocol)
	// would end the READ ONLY transaction and write.
	err = tx.QueryRow(ctx, query, pgx.QueryExecModeExec).Scan(&v)
	return v, err
}

// CheckQuery runs the custom throttle query once, as the daemon starts: a
// query that does not parse, fails, writes or does not return a number is
// a configuration mistake to report at once, not a pause for ever. No row
// passes: it pauses (fail closed) but may be what the query means.
func CheckQuery(ctx context.Context, db Beginner, query string) error {
	if _, err := readQuery(ctx, db, query); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("INBOXKEEPER_THROTTLE_QUERY: %w", err)
	}
	return nil
}
