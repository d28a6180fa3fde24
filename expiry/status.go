package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
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
	// ProtectedByReferences are the expired rows no hold or replay covers
	// that another table's foreign key points at
	// (inboxkeeper_rows_protected{by="reference"}).
	ProtectedByReferences int64
	// ReplaysBeyondWindow are the active replays started with --force past
	// the dedup window (inboxkeeper_replays_beyond_window).
	ReplaysBeyondWindow int
	CleanupLag          time.Duration
	Oldest              *time.Time // oldest expiry present: column + expires_after (NULL expiries are never counted)
	Newest              *time.Time
	Holds               []holds.Hold
	Replays             []holds.Replay
	// FallingDue is the rows a second that fall due over the next
	// FallingDueOver: what the deleter must delete to keep up, and what
	// the table's VACUUM must keep up with (vacuum.Advise).
	FallingDue float64
}

// FallingDueOver is the span over which status counts the rows falling
// due: long enough to smooth a writer's bursts, short enough to be now's.
const FallingDueOver = time.Minute

// FallingDueRate is the rows a second that fall due on t over the next
// FallingDueOver (TableStatus.FallingDue), read by a status of its own.
func FallingDueRate(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table) (float64, error) {
	var rate float64
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		now, err := dbconn.Now(ctx, tx)
		if err != nil {
			return err
		}
		for i := range max(1, len(t.Windows)) {
			r, err := fallingDue(ctx, tx, t.Window(i), now)
			if err != nil {
				return err
			}
			rate += r
		}
		return nil
	})
	return rate, err
}

// fallingDue counts the rows of t whose expiry falls in the
// FallingDueOver after now, through the expiry index (at most
// StatusCountCap), as rows a second: over the part of the span that rows
// reach into. Where every row expires sooner than the span's end (a 30 s
// expiry), the rows that fall due in its last part are not written yet:
// counted over the whole minute, 200 rows/s falling due read as 102.
func fallingDue(ctx context.Context, tx pgx.Tx, t *catalog.Table, now time.Time) (float64, error) {
	var n int64
	var ahead *float64 // seconds from the cutoff to the newest expiry; NULL: no row
	err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM (SELECT 1 FROM %[1]s t WHERE t.%[2]s > %[3]s AND t.%[2]s <= %[4]s AND %[6]s LIMIT $3) soon),
       (SELECT extract(epoch FROM %[5]s - $1::timestamptz)::float8 FROM (SELECT t.%[2]s FROM %[1]s t WHERE t.%[2]s IS NOT NULL AND %[6]s ORDER BY t.%[2]s DESC LIMIT 1) newest)`,
		t.Ident, t.Expiry.Quoted, t.Expiry.Instant("$1::timestamptz"), t.Expiry.Instant("$2::timestamptz"), t.Expiry.AsTimestamptz("newest"), t.Only("t")),
		cutoff(t, now), cutoff(t, now.Add(FallingDueOver)), StatusCountCap).Scan(&n, &ahead)
	if err != nil {
		return 0, fmt.Errorf("count the rows of %s falling due: %w", t.Name, err)
	}
	span := FallingDueOver.Seconds()
	if ahead != nil {
		span = min(span, max(*ahead, 1))
	}
	return float64(n) / span, nil
}

// Status reads the state of table t. It uses the deleter's clock. A table
// with several windows is read window by window, and summed as a result
// is (TableResult.add).
func (d *Deleter) Status(ctx context.Context, t *catalog.Table) (TableStatus, error) {
	st := TableStatus{Table: t.Name}
	err := d.readTx(ctx, func(tx pgx.Tx) error {
		if len(t.Windows) == 0 {
			return d.status(ctx, tx, t, &st)
		}
		for i := range t.Windows {
			var w TableStatus
			if err := d.status(ctx, tx, t.Window(i), &w); err != nil {
				return err
			}
			st.add(w, i == 0)
		}
		return nil
	})
	return st, err
}

// add counts a window's status into the table's.
func (st *TableStatus) add(w TableStatus, first bool) {
	if first {
		st.Now, st.Holds, st.Replays, st.ReplaysBeyondWindow = w.Now, w.Holds, w.Replays, w.ReplaysBeyondWindow
	}
	st.Due += w.Due
	st.DueCapped = st.DueCapped || w.DueCapped
	st.ProtectedByHolds += w.ProtectedByHolds
	st.ProtectedByReplays += w.ProtectedByReplays
	st.ProtectedByReferences += w.ProtectedByReferences
	st.CleanupLag = max(st.CleanupLag, w.CleanupLag)
	st.FallingDue += w.FallingDue
	if w.Oldest != nil && (st.Oldest == nil || w.Oldest.Before(*st.Oldest)) {
		st.Oldest = w.Oldest
	}
	if w.Newest != nil && (st.Newest == nil || w.Newest.After(*st.Newest)) {
		st.Newest = w.Newest
	}
}

func (d *Deleter) status(ctx context.Context, tx pgx.Tx, t *catalog.Table, st *TableStatus) error {
	now, err := d.now(ctx, tx)
	if err != nil {
		return err
	}
	st.Now = now
	cov, err := holds.ActiveAll(ctx, tx, t.Name, now)
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
	if st.ProtectedByReferences, err = countReferenced(ctx, tx, t, now, cov); err != nil {
		return fmt.Errorf("status %s: %w", t.Name, err)
	}
	if st.FallingDue, err = fallingDue(ctx, tx, t, now); err != nil {
		return fmt.Errorf("status %s: %w", t.Name, err)
	}
	st.CleanupLag, err = cleanupLag(ctx, tx, t, now, cov, negInf)
	return err
}
