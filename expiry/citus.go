package expiry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Batches on a table Citus plans (see docs/guides/citus.md): a
// hash-distributed one, and a reference or Citus local table, whose
// statements the coordinator sends to every copy, each picking its own rows
// (a ctid means another row in each copy, and Citus refuses SKIP LOCKED in
// a modification there too).
//
// On one node a batch ends at the expiry of its n-th row, read from the
// expiry index. Through a coordinator that read costs n rows from every
// shard, merged and sorted on the coordinator (32 shards, n = 5,000: 160,000
// rows a batch, 80% of its time), and a distributed commit costs tens of
// milliseconds whatever the batch's size. So a batch on a distributed table
// is an expiry window instead: [keyset, keyset + w], sized so that it holds
// about the batch size per shard, counted first (a count Citus pushes to
// every shard, each answering from its index), then deleted by one range
// DELETE Citus runs on every shard at once. Windows follow each other
// upward, so the table is deleted oldest first, window by window; inside a
// window the shards delete in parallel.
//
// Without SKIP LOCKED (Citus refuses it across shards), a window that meets
// a row another session holds locked waits for it at most
// batchloop.OptimisticLockWait (the timeouts reach the workers:
// dbconn.TxSettings.Citus), rolls back, and is halved until it commits
// without the row; a window down to one due row (or one microsecond) that
// still meets it steps over its first due row, to just after its expiry
// (batchloop.LockedRows, the demoter's step too). A reference table Citus
// locks whole for the session that holds the row: there the batch ends
// with the lock timeout at once (batchloop.ReferenceLocked).

// minWindow is the narrowest window: timestamps have microseconds.
const minWindow = time.Microsecond

// windowProbes bounds the counts one batch takes to size its window (a
// bisection between 1 µs and a year takes 45).
const windowProbes = 24

// window is a table's current window width, kept across batches and
// passes: the expiry density of an inbox changes slowly.
type window struct {
	mu sync.Mutex
	w  time.Duration // 0: not yet measured
	// due is the count of due rows when the pass began: the first window
	// is sized from it.
	due int64
	// exhausted is set by a batch whose window reached the cutoff: the
	// pass has nothing left (batchloop.Loop.Exhausted).
	exhausted bool
}

func (d *Deleter) window(t *catalog.Table) *window {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.windows[t.ID()]
	if w == nil {
		w = &window{}
		d.windows[t.ID()] = w
	}
	return w
}

// distributedBatch deletes about size rows per shard from lower on, in one
// window transaction; when that meets a locked row it narrows the window,
// commits what it can and steps over the row (see above).
func (d *Deleter) distributedBatch(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int, res *TableResult) (n int64, newest time.Time, wal float64, err error) {
	win := d.window(t)
	rows := int64(size) * int64(t.Shards())
	var limit time.Duration // 0: the window is sized by counting; else this wide
	var full time.Duration  // the width of the window that first met the lock
	var locked batchloop.LockedRows
	narrowed := false
	for {
		r, err := d.windowTx(ctx, t, lower, max(1, rows-n), win, limit, res)
		if err == nil {
			if limit == 0 || r.exhausted {
				return n + r.n, r.upper, wal + r.wal, nil
			}
			// A narrowed window committed: go on from its end (the locked
			// row lies beyond it), widening again; once as wide as the
			// window that met the lock, the next is sized by counting
			// again, for what is left of the batch. Left at that width, a
			// batch short of its rows crossed an hour with no due row in
			// 239 ms windows (TestCitusNarrowedWindowsDoNotCrawlAGap).
			n, wal, lower = n+r.n, wal+r.wal, pgtype.Timestamptz{Time: r.upper, Valid: true}
			if n >= rows {
				return n, r.upper, wal, nil
			}
			if limit *= 2; limit >= full {
				limit = 0
			}
			continue
		}
		if retry.KindOf(err) != retry.KindLockTimeout {
			// The windows this batch already committed end at lower: the
			// loop counts them and retries from there (batchloop.Batch).
			return n, lower.Time, wal, err
		}
		if t.CitusReference {
			return n, lower.Time, wal, batchloop.ReferenceLocked(t.Name, err)
		}
		if !narrowed {
			narrowed = true
			res.SkipLockedBatches++
		}
		if limit == 0 {
			full = max(minWindow, r.width)
			limit = max(minWindow, r.width/2)
			continue
		}
		if limit > minWindow && r.counted > 1 {
			limit = max(minWindow, limit/2)
			continue
		}
		// The window holds one due row, or one microsecond of them, and
		// meets a lock: the first due row from lower is the one held;
		// step over it.
		e, next, ok, serr := locked.StepOver(err, func() (time.Time, bool, error) { return d.firstDue(ctx, t, lower) })
		if serr != nil {
			return n, lower.Time, wal, serr
		}
		if !ok {
			win.setExhausted(true)
			return n, lower.Time, wal, nil
		}
		d.log.Debug("expiry: stepping over a row another session holds locked", "table", t.Name, "expiry", e)
		if d.TestSignals.OnFallback != nil {
			d.TestSignals.OnFallback()
		}
		lower, limit = next, minWindow*2
	}
}

func (w *window) setExhausted(v bool) {
	w.mu.Lock()
	w.exhausted = v
	w.mu.Unlock()
}

func (w *window) isExhausted() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.exhausted
}

// windowResult is what one window transaction did.
type windowResult struct {
	n         int64
	upper     time.Time     // the window's end: the keyset after it
	width     time.Duration // the window's width (also when it failed)
	counted   int64         // the due rows counted in it
	wal       float64
	exhausted bool // the window reached the cutoff
}

// windowTx is one batch transaction on a distributed table: it sizes a
// window from lower that holds about rows due, uncovered rows (at most
// limit wide when limit is set), and deletes it.
func (d *Deleter) windowTx(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, rows int64, win *window, limit time.Duration, res *TableResult) (r windowResult, err error) {
	lockTimeout := min(d.opts.LockTimeout, d.optimisticLockTimeout())
	tx, err := batchloop.Begin(ctx, d.pool, t.Name, batchloop.TxOptions{
		LockTimeout: lockTimeout, StatementTimeout: d.opts.StatementTimeout, IdleInTx: d.opts.IdleTimeout, Throttle: d.opts.Throttle, Clock: d.opts.Clock, Watch: d.opts.Watch,
		Citus: true})
	if err != nil {
		return r, err
	}
	defer tx.Close(ctx, &err)
	c := cutoff(t, tx.Now)
	var args sqlargs.List
	hp, rp := tx.Coverage.Predicates(t, "d", &args)
	due := fmt.Sprintf("%[1]s <= %[2]s AND NOT %[3]s AND NOT %[4]s AND %[5]s", "d."+t.Expiry.Quoted, t.Expiry.Instant(args.Add(c)+"::timestamptz"), hp, rp, t.Deletable("d"))
	start := lower.Time
	if lower.InfinityModifier == pgtype.NegativeInfinity || !lower.Valid {
		// The first window starts at the oldest due row (each shard's
		// index answers, the coordinator takes the least).
		var oldest pgtype.Timestamptz
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT min(%s) FROM %s d WHERE %s", t.Expiry.AsTimestamptz("d"), t.Ident, due), args.Values...).Scan(&oldest); err != nil {
			return r, err
		}
		if !oldest.Valid {
			win.setExhausted(true)
			return windowResult{exhausted: true, upper: start}, nil
		}
		start = oldest.Time
	}
	if start.After(c) {
		win.setExhausted(true)
		return windowResult{exhausted: true, upper: start}, nil
	}
	win.mu.Lock()
	w, dueRows := win.w, win.due
	win.mu.Unlock()
	if w <= 0 && dueRows > 0 && c.After(start) {
		// The first window of a table: as if the due rows were spread
		// evenly from the oldest to the cutoff (the counts correct it).
		w = time.Duration(float64(c.Sub(start)) * min(1, float64(rows)/float64(dueRows)))
	}
	if w <= 0 {
		w = time.Second
	}
	if limit > 0 {
		w = limit
	}
	lo := args.Add(lower)
	inWindow := func(upper string) string {
		return fmt.Sprintf("%[1]s >= %[2]s AND %[1]s <= %[3]s AND %[4]s", "d."+t.Expiry.Quoted,
			t.Expiry.Instant(lo+"::timestamptz"), t.Expiry.Instant(upper+"::timestamptz"), due)
	}
	var upper time.Time
	var cnt int64
	// Widths known to hold too few (wLo) and too many (wHi) rows: the search
	// bisects between them once it has both.
	var wLo, wHi time.Duration
	tied := false
	for probe := 1; ; probe++ {
		upper = start.Add(w)
		r.exhausted = !upper.Before(c)
		if r.exhausted {
			upper = c
		}
		pa := sqlargs.List{Values: append([]any(nil), args.Values...)}
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s d WHERE %s", t.Ident, inWindow(pa.Add(upper))), pa.Values...).Scan(&cnt); err != nil {
			return r, err
		}
		r.counted = cnt
		if limit > 0 {
			break // a narrowed window keeps its width; the count says whether one row is left in it
		}
		next := w
		switch {
		case cnt > 2*rows:
			wHi = w
			if wLo > 0 {
				next = wLo + (wHi-wLo)/2
			} else {
				next = time.Duration(float64(w) * float64(rows) / float64(cnt))
			}
		case cnt < rows/2 && !r.exhausted:
			wLo = w
			if wHi > 0 {
				next = wLo + (wHi-wLo)/2
			} else {
				next = time.Duration(float64(w) * min(16, float64(rows)/float64(max(cnt, 1))))
			}
		}
		next = max(minWindow, next)
		if next == w || probe == windowProbes || (wHi > 0 && wHi-wLo <= minWindow) {
			// This window, as counted: within bounds, or as close as the
			// expiries allow; more than twice the rows in it means they
			// share (nearly) one expiry.
			tied = cnt > 2*rows
			break
		}
		w = next
	}
	r.width = w
	if _, err := tx.Exec(ctx, batchSettingsSQL, false); err != nil {
		return r, err
	}
	keysReturning, keysCTE, keysCount := tiering.DeleteKeys(t)
	match := inWindow(args.Add(upper))
	if tied {
		// More than twice the rows share one microsecond of expiry: the
		// window cannot bound the batch, so rows are picked by key, up to
		// rows of them, and the keyset stays where it is until the tie is
		// gone.
		match = fmt.Sprintf("(%s) IN (SELECT %s FROM %s d WHERE %s LIMIT %s)", keyColumns(t, "d"), keyColumns(t, "d"), t.Ident, match, args.Add(rows))
		r.exhausted = false
	}
	var keys int64
	if tiering.KeyOf(t) != nil {
		// The keys are written in the statement that deletes their rows;
		// the RETURNING rows go through the coordinator.
		sql := fmt.Sprintf(`
WITH gone AS (
  DELETE FROM %[1]s d WHERE %[2]s
  RETURNING 1 AS one%[3]s
)%[4]s
SELECT count(*), %[5]s FROM gone`, t.Ident, match, keysReturning, keysCTE, keysCount)
		err = tx.QueryRow(ctx, sql, args.Values...).Scan(&r.n, &keys)
	} else {
		// The command tag's count: no row leaves its worker (a RETURNING
		// would send every deleted row to the coordinator, tripling the
		// batch's time).
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s d WHERE %s", t.Ident, match), args.Values...)
		r.n = tag.RowsAffected()
	}
	if err != nil {
		d.log.Debug("expiry: window failed", "table", t.Name, "from", lower, "to", upper, "limit", limit, "error", err)
		return r, err
	}
	d.log.Debug("expiry: window", "table", t.Name, "from", lower, "to", upper, "limit", limit, "counted", cnt, "deleted", r.n)
	if d.TestSignals.BeforeCommit != nil {
		d.TestSignals.BeforeCommit(t.Name, r.n)
	}
	if r.wal, err = tx.Commit(ctx); err != nil {
		return r, err
	}
	res.PermanentKeys += keys
	r.upper = upper
	if tied {
		r.upper = start
	} else {
		res.RangeBatches++
	}
	if limit == 0 {
		// The next window: as wide as this one would have had to be to
		// hold rows, within a factor of four of it.
		next := w
		if r.n > 0 {
			next = time.Duration(float64(w) * max(0.25, min(4, float64(rows)/float64(r.n))))
		}
		win.mu.Lock()
		win.w = max(minWindow, next)
		win.mu.Unlock()
	}
	win.setExhausted(r.exhausted)
	return r, nil
}

// firstDue is the expiry of the oldest due, uncovered row from lower on.
func (d *Deleter) firstDue(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz) (time.Time, bool, error) {
	var e time.Time
	found := false
	err := d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
		var args sqlargs.List
		hp, rp := cov.Predicates(t, "t", &args)
		sql := fmt.Sprintf(`SELECT %[1]s FROM %[2]s t WHERE t.%[3]s <= %[4]s AND t.%[3]s >= %[5]s AND NOT %[6]s AND NOT %[7]s AND %[8]s ORDER BY t.%[3]s LIMIT 1`,
			t.Expiry.AsTimestamptz("t"), t.Ident, t.Expiry.Quoted, t.Expiry.Instant(args.Add(cutoff(t, now))+"::timestamptz"),
			t.Expiry.Instant(args.Add(lower)+"::timestamptz"), hp, rp, t.Deletable("t"))
		err := tx.QueryRow(ctx, sql, args.Values...).Scan(&e)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("find the locked row: %w", err)
	}
	return e, found, nil
}

// keyColumns lists the table's key columns over alias, for a row
// comparison.
func keyColumns(t *catalog.Table, alias string) string {
	cs := make([]string, len(t.Key))
	for i, c := range t.Key {
		cs[i] = alias + "." + c.Quoted
	}
	return strings.Join(cs, ", ")
}
