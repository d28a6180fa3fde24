package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
)

// StatusCountCap bounds the count of due rows so that `status` stays cheap on
// a table with a large backlog; a capped count is shown as "more than".
const StatusCountCap = 1_000_000

// TableStatus describes one table right now.
type TableStatus struct {
	Table      string
	Now        time.Time
	Due        int64 // expired rows present, protected ones included; at most StatusCountCap
	DueCapped  bool  // Due reached the cap: the real number is larger
	CleanupLag time.Duration
	Oldest     *time.Time // oldest expiry present: column + expires_after (NULL expiries are never counted)
	Newest     *time.Time
	Holds      []holds.Hold
	Replays    []holds.Replay
}

// Status reads the state of table t. It uses the deleter's clock.
func (d *Deleter) Status(ctx context.Context, t *catalog.Table) (TableStatus, error) {
	st := TableStatus{Table: t.Name}
	err := d.readTx(ctx, func(tx pgx.Tx) error { return d.status(ctx, tx, t, &st) })
	return st, err
}

func (d *Deleter) status(ctx context.Context, tx pgx.Tx, t *catalog.Table, st *TableStatus) error {
	now, err := d.now(ctx, tx)
	if err != nil {
		return err
	}
	st.Now = now
	cov, err := holds.Active(ctx, tx, t.Name, now)
	if err != nil {
		return err
	}
	st.Holds, st.Replays = cov.Holds, cov.Replays

	if st.Oldest, st.Newest, err = retainedRange(ctx, tx, t, negInf); err != nil {
		return fmt.Errorf("status %s: oldest and newest expiry: %w", t.Name, err)
	}
	err = tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s t WHERE t.%s <= %s LIMIT $2) due`,
		t.Ident, t.Expiry.Quoted, t.Expiry.Instant("$1::timestamptz")), cutoff(t, now), StatusCountCap).Scan(&st.Due)
	if err != nil {
		return fmt.Errorf("status %s: count due rows: %w", t.Name, err)
	}
	st.DueCapped = st.Due >= StatusCountCap
	st.CleanupLag, err = cleanupLag(ctx, tx, t, now, cov, negInf)
	return err
}
