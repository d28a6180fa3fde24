package expiry

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
)

// DueCap bounds the exact count of due rows, like status's: past it the
// count says "more than" (inboxkeeper_rows_due_capped). The demoter's
// count stops there too (batchloop.DueCountCap).
const DueCap = batchloop.DueCountCap

// Due is what is left to do on a table: the rows whose expiry has passed and
// that no hold or replay covers (due: deletable now), counted exactly
// through the expiry index up to DueCap, and the cleanup lag.
type Due struct {
	Rows   int64 // at most DueCap
	Capped bool  // Rows stopped at DueCap: there are more
	Lag    time.Duration

	now time.Time      // the database's now the count was taken at
	cov holds.Coverage // the holds and replays it left out
	// bounded: the look counted up to its bound only (lookBound), and Rows
	// stopped there: more are due. The exact count, up to DueCap, is read
	// beside (exact), at the same now and under the same holds.
	bounded bool
	exact   *exactAhead
}

// countDue counts the rows of t due at now from the keyset bound from on
// that cov does not cover: exactly, up to DueCap (capped: there are more).
// status and inboxkeeper_rows_due count with it, so they say the same.
func countDue(ctx context.Context, q catalog.Querier, t *catalog.Table, now time.Time, cov holds.Coverage, from pgtype.Timestamptz) (rows int64, capped bool, err error) {
	return countDueUpTo(ctx, q, t, now, cov, from, DueCap)
}

// countDueUpTo is countDue up to limit rows (more: there are more); a
// distributed table is counted whole, then capped.
func countDueUpTo(ctx context.Context, q catalog.Querier, t *catalog.Table, now time.Time, cov holds.Coverage, from pgtype.Timestamptz, limit int64) (rows int64, more bool, err error) {
	var args sqlargs.List
	hp, rp := cov.Predicates(t, "t", &args)
	c, f := args.Add(cutoff(t, now)), args.Add(from)
	form := `SELECT count(*) FROM (SELECT 1 FROM %[1]s t WHERE t.%[2]s <= %[3]s AND t.%[2]s >= %[4]s AND NOT %[5]s AND NOT %[6]s AND %[8]s LIMIT %[7]d) s`
	if t.Distributed() {
		// Through a coordinator the LIMIT would pull up to DueCap rows
		// from the shards; a plain count is counted on every shard at
		// once, each its own share.
		form = `SELECT count(*) FROM %[1]s t WHERE t.%[2]s <= %[3]s AND t.%[2]s >= %[4]s AND NOT %[5]s AND NOT %[6]s AND %[8]s`
	}
	sql := fmt.Sprintf(form,
		t.Ident, t.Expiry.Quoted, t.Expiry.Instant(c+"::timestamptz"), t.Expiry.Instant(f+"::timestamptz"), hp, rp, limit+1, t.Deletable("t"))
	if err := q.QueryRow(ctx, sql, args.Values...).Scan(&rows); err != nil {
		return 0, false, fmt.Errorf("count the due rows: %w", err)
	}
	return min(rows, limit), rows > limit, nil
}

// countProtected counts the expired rows of t at now that a hold of cov
// covers, and those only a replay covers, and returns the oldest expiry
// column value among them. status and inboxkeeper_rows_protected count
// with it, so they say the same.
func countProtected(ctx context.Context, q catalog.Querier, t *catalog.Table, now time.Time, cov holds.Coverage) (byHolds, byReplays int64, oldest pgtype.Timestamptz, err error) {
	if cov.Empty() {
		return 0, 0, oldest, nil
	}
	var args sqlargs.List
	hp, rp := cov.Predicates(t, "t", &args)
	sql := fmt.Sprintf(`SELECT count(*) FILTER (WHERE %[3]s), count(*) FILTER (WHERE %[4]s AND NOT %[3]s), min(%[6]s)
FROM %[1]s t WHERE t.%[5]s <= %[2]s AND (%[3]s OR %[4]s) AND %[7]s`, t.Ident, t.Expiry.Instant(args.Add(cutoff(t, now))+"::timestamptz"), hp, rp, t.Expiry.Quoted, t.Expiry.AsTimestamptz("t"), t.Only("t"))
	if err := q.QueryRow(ctx, sql, args.Values...).Scan(&byHolds, &byReplays, &oldest); err != nil {
		return 0, 0, oldest, fmt.Errorf("count protected rows: %w", err)
	}
	return byHolds, byReplays, oldest, nil
}

// countReferenced counts the rows of t due at now that no hold or replay
// of cov covers but that another table's foreign key points at, so that no
// batch deletes them (catalog.Table.Referenced): up to DueCap. status and
// inboxkeeper_rows_protected{by="reference"} count with it.
func countReferenced(ctx context.Context, q catalog.Querier, t *catalog.Table, now time.Time, cov holds.Coverage) (int64, error) {
	if !t.HasReferences() {
		return 0, nil
	}
	var args sqlargs.List
	hp, rp := cov.Predicates(t, "t", &args)
	var n int64
	sql := fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %[1]s t WHERE t.%[2]s <= %[3]s AND %[4]s AND NOT %[5]s AND NOT %[6]s AND %[7]s LIMIT %[8]d) s`,
		t.Ident, t.Expiry.Quoted, t.Expiry.Instant(args.Add(cutoff(t, now))+"::timestamptz"), t.Only("t"), hp, rp, t.Referenced("t"), DueCap)
	if err := q.QueryRow(ctx, sql, args.Values...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the rows other tables' references keep: %w", err)
	}
	return n, nil
}

// Due counts what is due on t from the keyset bound from on (the start of
// the expiry index when invalid: rows a running pass has passed over were
// deleted, or are left for the next pass), and exports it with the cleanup
// lag as metrics.
func (d *Deleter) Due(ctx context.Context, t *catalog.Table, from pgtype.Timestamptz) (Due, error) {
	var due Due
	err := d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
		due.now, due.cov = now, cov
		var err error
		from := orNegInf(from)
		if due.Rows, due.Capped, err = countDue(ctx, tx, t, now, cov, from); err != nil {
			return err
		}
		due.Lag, err = cleanupLag(ctx, tx, t, now, cov, from)
		return err
	})
	if err != nil {
		return due, err
	}
	d.exportDue(t, due)
	return due, nil
}

// countDueBounded is countDueUpTo in expiry order, for a look that counts
// up to limit rows only: past limit (more), it also returns the newest
// expiry it reached (last) and how many due rows lie before it in the
// expiry index (below), so that the exact count need only count from last
// on (exactAhead) instead of counting the first limit rows again.
// One statement, so one snapshot; below is walked for only when there are
// more. Counted over a materialized CTE (count(*) FILTER (WHERE e < (SELECT
// max(e) FROM s))), every count read its rows twice and, past work_mem,
// through a temporary file: 90,000 due rows took 32 to 66 ms against 10 to
// 12 ms (docs/design/expiry.md, "The look's count in one walk").
func countDueBounded(ctx context.Context, q catalog.Querier, t *catalog.Table, now time.Time, cov holds.Coverage, from pgtype.Timestamptz, limit int64) (rows int64, more bool, last pgtype.Timestamptz, below int64, err error) {
	var args sqlargs.List
	hp, rp := cov.Predicates(t, "t", &args)
	c, f := args.Add(cutoff(t, now)), args.Add(from)
	due := fmt.Sprintf(`t.%[1]s <= %[2]s AND t.%[1]s >= %[3]s AND NOT %[4]s AND NOT %[5]s AND %[6]s`,
		t.Expiry.Quoted, t.Expiry.Instant(c+"::timestamptz"), t.Expiry.Instant(f+"::timestamptz"), hp, rp, t.Deletable("t"))
	// below is counted as the exact count counts the rest, from last on
	// (countDueUpTo: the column at or after Instant(last)), so that the two
	// part the due rows exactly: the rows before it in the walk, ties at
	// last left out, and on a local-time column any in the hour a clock
	// skips whose wall clock lies before Instant(last). Those may be more
	// than limit, even past DueCap: up to DueCap and one is counted, and
	// the exact count says capped past DueCap.
	sql := fmt.Sprintf(`SELECT m.n, m.last, CASE WHEN m.n > %[4]d THEN
  (SELECT count(*) FROM (SELECT 1 FROM %[1]s t WHERE %[2]s AND t.%[5]s < %[6]s LIMIT %[7]d) b) ELSE 0 END
FROM (SELECT count(*) AS n, max(e) AS last FROM
  (SELECT %[3]s AS e FROM %[1]s t WHERE %[2]s ORDER BY t.%[5]s LIMIT %[8]d) s) m`,
		t.Ident, due, t.Expiry.AsTimestamptz("t"), limit, t.Expiry.Quoted, t.Expiry.Instant("m.last"), DueCap+1, limit+1)
	if err := q.QueryRow(ctx, sql, args.Values...).Scan(&rows, &last, &below); err != nil {
		return 0, false, last, 0, fmt.Errorf("count the due rows: %w", err)
	}
	return min(rows, limit), rows > limit, last, below, nil
}

// look is what a pass reads of a table before it starts and after it ends,
// in one read-only transaction: the rows due from where the pass's keyset
// ended on (res.resume; the start of the index before the pass), and what
// the table holds (measure: protected rows, cleanup lag, retained range,
// bytes per key). A pass that finds nothing due is this one transaction.
// beside, when set, is called with the count's now and holds before it
// counts (the sample read beside it, sampleBeside).
// bound, when not 0, is how many due rows the look counts at most: past it
// the Due is bounded, its exact count is read beside on a connection of
// its own (exactAhead), and it is not exported (the exact count is, when
// it is in). 0 counts up to DueCap, as status does.
func (d *Deleter) look(ctx context.Context, t *catalog.Table, res *TableResult, bound int64, beside func(now time.Time, cov holds.Coverage)) (Due, error) {
	var due Due
	err := d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
		due.now, due.cov, due.bounded, due.exact = now, cov, false, nil
		if beside != nil {
			beside(now, cov)
		}
		var err error
		if bound > 0 && bound < DueCap {
			var last pgtype.Timestamptz
			var below int64
			if due.Rows, due.bounded, last, below, err = countDueBounded(ctx, tx, t, now, cov, orNegInf(res.resume), bound); err != nil {
				return err
			}
			if due.bounded {
				due.exact = d.readExactAhead(ctx, t, now, cov, last, below)
			}
		} else if due.Rows, due.Capped, err = countDue(ctx, tx, t, now, cov, orNegInf(res.resume)); err != nil {
			return err
		}
		if err := d.measure(ctx, tx, t, now, cov, res); err != nil {
			return err
		}
		due.Lag = res.CleanupLag
		return nil
	})
	if err != nil {
		due.exact.drop()
		due.exact = nil
		return due, err
	}
	if !due.bounded {
		d.exportDue(t, due)
	}
	return due, nil
}

// exactAhead is the exact count of due rows (up to DueCap) that a bounded
// look left for later, read beside on a connection of its own: a sweep
// stops on it, and the progress line counts down from it.
type exactAhead struct {
	*aside
	// snap is closed once the count's snapshot is taken: a REPEATABLE
	// READ transaction's, with its first statement, so that it counts
	// every row due at the look's now that no batch committed after it
	// has deleted, however late the count itself ends.
	snap chan struct{}
	// hold keeps the count from starting, once it has its snapshot, until
	// the pass has read the heap's sample (release): side by side on two
	// cores, with the daemon taking the sample's rows, each took half as
	// long again as alone, and the first slice waits for the sample while
	// no slice needs the count before the end of the density map
	// (docs/design/expiry.md, "The count after the sample, a second
	// connection ahead, and page faults").
	hold     chan struct{}
	holdOnce sync.Once
	rows     int64 // set before done closes
	capped   bool
}

// readExactAhead starts counting the rows of t due at now under cov, on a
// connection of its own: below rows, the ones the bounded look counted
// before the expiry from, and those from from on, exactly, up to DueCap in
// all.
func (d *Deleter) readExactAhead(ctx context.Context, t *catalog.Table, now time.Time, cov holds.Coverage, from pgtype.Timestamptz, below int64) *exactAhead {
	e := &exactAhead{snap: make(chan struct{}), hold: make(chan struct{})}
	e.aside = startAside(ctx, func(ctx context.Context, a *aside) error {
		err := d.readTxWith(ctx, pgx.RepeatableRead, func(tx pgx.Tx) error {
			defer a.close(ctx)
			if !a.open(tx.Conn()) {
				return errDropped
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			a.pause()
			close(e.snap)
			select {
			case <-e.hold:
			case <-ctx.Done():
				return ctx.Err()
			}
			if !a.open(tx.Conn()) {
				return errDropped // dropped while it waited
			}
			if d.TestSignals.BeforeExactCount != nil {
				d.TestSignals.BeforeExactCount()
			}
			if below > DueCap {
				e.rows, e.capped = DueCap, true
				return nil
			}
			rest, capped, err := countDueUpTo(ctx, tx, t, now, cov, from, DueCap-below)
			e.rows, e.capped = below+rest, capped
			return err
		})
		if d.TestSignals.OnExactCount != nil {
			d.TestSignals.OnExactCount(e.rows, err)
		}
		return err
	})
	return e
}

// release lets the count start (hold).
func (e *exactAhead) release() {
	if e != nil {
		e.holdOnce.Do(func() { close(e.hold) })
	}
}

// take releases the exact count, waits for it and returns it.
func (e *exactAhead) take() (rows int64, capped bool, err error) {
	e.release()
	if err := e.wait(); err != nil {
		return 0, false, err
	}
	return e.rows, e.capped, nil
}

// snapshotted waits until the count has its snapshot, and says false when
// it ended without one, or failed.
func (e *exactAhead) snapshotted() bool {
	select {
	case <-e.snap:
		return true
	case <-e.done:
		return e.err == nil
	}
}

// ready returns the exact count without waiting: ok false while it is
// being read, or when it failed.
func (e *exactAhead) ready() (rows int64, capped, ok bool) {
	select {
	case <-e.done:
		return e.rows, e.capped, e.err == nil
	default:
		return 0, false, false
	}
}

// drop stops the exact count if it is still being read, and waits for it:
// one still held (release) never starts.
func (e *exactAhead) drop() {
	if e != nil {
		e.aside.drop(e.release)
	}
}

func orNegInf(from pgtype.Timestamptz) pgtype.Timestamptz {
	if !from.Valid {
		return batchloop.NegInf
	}
	return from
}

// exportDue exports a count of t's due rows and its cleanup lag. A
// window's count is kept, and the table's is the sum of its windows' last
// counts (the lag their worst).
func (d *Deleter) exportDue(t *catalog.Table, due Due) {
	m := d.opts.Metrics
	if m == nil || d.opts.DryRun {
		return
	}
	if t.WindowLabel != "" {
		d.mu.Lock()
		d.windowDue[t.ID()] = due
		var sum Due
		for i := range d.windowsOf[t.Name] {
			w := d.windowDue[d.windowsOf[t.Name][i]]
			sum.Rows += w.Rows
			sum.Capped = sum.Capped || w.Capped
			sum.Lag = max(sum.Lag, w.Lag)
		}
		d.mu.Unlock()
		due = sum
	}
	m.RowsDue.Set(float64(due.Rows), t.Name)
	capped := 0.0
	if due.Capped {
		capped = 1
	}
	m.RowsDueCapped.Set(capped, t.Name)
	m.CleanupLag.Set(due.Lag.Seconds(), t.Name)
}

// Refresh counts what is due again, between passes, on every table for
// which keep is true (nil: every table): the cleanup lag grows while the
// daemon waits for its next pass.
func (d *Deleter) Refresh(ctx context.Context, keep func(table string) bool) error {
	for _, t := range d.tables {
		if keep != nil && !keep(t.Name) {
			continue
		}
		for i := range max(1, len(t.Windows)) {
			if _, err := d.Due(ctx, t.Window(i), pgtype.Timestamptz{}); err != nil {
				return fmt.Errorf("table %s: %w", t.ID(), err)
			}
		}
	}
	return nil
}
