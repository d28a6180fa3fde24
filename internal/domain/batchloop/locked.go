package batchloop

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Stepping over locked rows on a Citus distributed table, for the deleter
// (expiry/citus.go) and the demoter (tiering/citus.go) alike.
//
// Citus refuses FOR UPDATE SKIP LOCKED across shards, so a batch that meets
// a row another session holds locked cannot skip it. It waits for it at
// most OptimisticLockWait, rolls back and narrows until it commits without
// the row; narrowed down to the held row alone, it steps over that row, to
// just after its anchor (LockedRows.StepOver), and goes on from there. The
// held row is left for a later pass, as SKIP LOCKED would leave it, and
// every transaction stays short.

// OptimisticLockWait is how long an optimistic batch waits for a row lock
// before it narrows (Citus) or falls back to SKIP LOCKED: the longest a
// batch waits on an application's row and, while it waits, the longest an
// application session waits on a row the batch already changed.
const OptimisticLockWait = 50 * time.Millisecond

// MaxLockedSteps is how many locked rows one batch steps over before it
// gives up with the lock timeout (the loop retries it smaller, and the
// table's pass fails after MaxRetries): past that many, more likely a table
// lock is in the way than a few rows in use.
const MaxLockedSteps = 16

// ReferenceLocked is the error of a batch on a Citus reference table
// (catalog.Table.CitusReference) that met a lock, err. Citus locks such a
// table whole for a session that writes to it or holds a row of it locked,
// so no narrower batch gets past that session: the batch loop tries again
// after a pause, and past MaxRetries the table's pass ends with the lock
// timeout, saying why.
func ReferenceLocked(table string, err error) error {
	return fmt.Errorf("Citus locks the reference table %s whole while another session writes to it or holds a row of it locked: %w", table, err)
}

// LockedRows counts the locked rows one batch has stepped over; its zero
// value is a batch that has stepped over none.
type LockedRows struct{ steps int }

// StepOver steps over the row another session holds locked, which is the
// first due row from the batch's keyset: first finds its anchor (ok false:
// no row is due from there any more). It returns that anchor and the keyset
// just after it; past MaxLockedSteps rows in one batch it fails instead,
// wrapping cause, the lock timeout the batch met.
func (l *LockedRows) StepOver(cause error, first func() (anchor time.Time, ok bool, err error)) (held time.Time, next pgtype.Timestamptz, ok bool, err error) {
	if l.steps++; l.steps > MaxLockedSteps {
		return time.Time{}, pgtype.Timestamptz{}, false, fmt.Errorf("%d rows held locked by other sessions in one batch: %w", l.steps-1, cause)
	}
	held, ok, err = first()
	if err != nil || !ok {
		return held, pgtype.Timestamptz{}, false, err
	}
	// timestamptz has microseconds: nothing lies strictly between.
	return held, pgtype.Timestamptz{Time: held.Add(time.Microsecond), Valid: true}, true, nil
}
