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
// a table with a large backlog; a capped count is shown as "more than". It
// is the cap of inboxkeeper_rows_due.
const StatusCountCap = DueCap

// TableStatus describes one table right now, in the words the metrics use:
// due (deletable now), protected by holds, protected by replays, and the
// replays beyond the window.
type TableStatus struct {
	Table string
	Now   time.Time
	// Due are the expired rows no hold or replay covers: what the next
	// pass deletes (inboxkeeper_rows_due); at most StatusCountCap.
	Due       int64
	DueCapped bool // Due reached the cap: the real number is larger
	// ProtectedByHolds are the expired rows a hold covers, and
	// ProtectedByReplays those only a replay covers
	// (inboxkeeper_rows_protected{by="hold"}, {by="replay"}).
	ProtectedByHolds, ProtectedByReplays int64
	// ReplaysBeyondWindow are the active replays started with --force past
	// the dedup window (inboxkeeper_replays_beyond_window).
	ReplaysBeyondWindow int
	CleanupLag          time.Duration
	Oldest              *time.Time // oldest expiry present: column + expires_after (NULL expiries are never counted)
	Newest              *time.Time
	Holds               []holds.Hold
	Replays             []holds.Replay
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
	for _, r := range st.Replays {
		if r.BeyondWindow {
			st.ReplaysBeyondWindow++
		}
	}
	if st.Oldest, st.Newest, err = retainedRange(ctx, tx, t, negInf); err != nil {
		return fmt.Errorf("status %s: oldest and newest expiry: %w", t.Name, err)
	}
	if st.Due, st.DueCapped, err = countDue(ctx, tx, t, now, cov, negInf); err != nil {
		return fmt.Errorf("status %s: %w", t.Name, err)
	}
	if st.ProtectedByHolds, st.ProtectedByReplays, _, err = countProtected(ctx, tx, t, now, cov); err != nil {
		return fmt.Errorf("status %s: %w", t.Name, err)
	}
	st.CleanupLag, err = cleanupLag(ctx, tx, t, now, cov, negInf)
	return err
}
