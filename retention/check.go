package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
)

// RowCheckCap bounds CheckRows's count, like status does: "more than"
// instead of scanning a huge table to the end.
const RowCheckCap = 1_000_000

// ErrNoAnchor: the rule counts from a first_seen or event_time column the
// table's policy does not name.
var ErrNoAnchor = errors.New("the table lacks the first_seen or event_time column the rule counts from")

// RowsCheck is what CheckRows found.
type RowsCheck struct {
	// NoScenario: the rule has no inbox scenario and the table no
	// first_seen column; there is nothing to compare.
	NoScenario bool
	Early      int64 // rows whose expiry comes before the rule's (at most RowCheckCap+1)
	Capped     bool  // Early is past RowCheckCap
	// First is the earliest of them: its key (as text), expiry and the
	// rule's remember_until for it.
	First struct {
		Key           []*string
		Expiry, Until time.Time
	}
}

// CheckRows counts the rows of the rule's scope whose expiry comes before
// the rule computed from their own anchors, in SQL, in a read-only
// transaction. Rows whose expiry is NULL are never deleted, and rows whose
// anchors are all NULL cannot be judged: the comparison is NULL for both, so
// neither counts.
func CheckRows(ctx context.Context, pool *pgxpool.Pool, r Rule, t *catalog.Table, s dbconn.TxSettings) (RowsCheck, error) {
	var rc RowsCheck
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	micros := func(d time.Duration) string { return arg(d.Microseconds()) + "::bigint * interval '1 microsecond'" }

	// Each window's offset; NULL for a row the policy does not manage
	// (never deleted, so never early).
	expiry := t.ExpiryInstant("", micros)
	// Load refuses a scenario whose column the table lacks.
	if r.PostReceipt > 0 && t.FirstSeen == nil || r.Replay > 0 && t.EventTime == nil {
		return rc, ErrNoAnchor
	}
	var terms []string
	if r.PostReceipt > 0 {
		terms = append(terms, t.FirstSeen.AsTimestamptz("")+" + "+micros(r.PostReceipt))
	}
	if r.Replay > 0 {
		terms = append(terms, t.EventTime.AsTimestamptz("")+" + "+micros(r.Replay))
	}
	if r.Deadline != nil {
		terms = append(terms, arg(*r.Deadline)+"::timestamptz")
	}
	if len(terms) == 0 {
		if t.FirstSeen == nil {
			rc.NoScenario = true
			return rc, nil
		}
		terms = append(terms, t.FirstSeen.AsTimestamptz(""))
	}
	rule := "(greatest(" + strings.Join(terms, ", ") + ") + " + micros(r.Margin) + ")"
	where := expiry + " < " + rule
	if t.Scope != nil {
		where += " AND " + t.Scope.Quoted + "::text = " + arg(r.Scope)
	}
	keys := make([]string, len(t.Key))
	for i, k := range t.Key {
		keys[i] = k.Quoted + "::text"
	}
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := s.Apply(ctx, tx); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM (SELECT 1 FROM %s WHERE %s LIMIT %d) s", t.Ident, where, RowCheckCap+1), args...).Scan(&rc.Early); err != nil {
			return err
		}
		if rc.Early == 0 {
			return nil
		}
		// The first to be deleted is the example.
		rc.First.Key = make([]*string, len(keys))
		dst := []any{&rc.First.Expiry, &rc.First.Until}
		for i := range rc.First.Key {
			dst = append(dst, &rc.First.Key[i])
		}
		return tx.QueryRow(ctx, fmt.Sprintf("SELECT %s, %s, %s FROM %s WHERE %s ORDER BY 1 LIMIT 1",
			expiry, rule, strings.Join(keys, ", "), t.Ident, where), args...).Scan(dst...)
	})
	rc.Capped = rc.Early > RowCheckCap
	return rc, err
}
