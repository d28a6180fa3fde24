package compact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
)

// errNoRoom ends a sweep whose batch found no room below its slice: the
// free space map knew of none (or the heap grew for the new versions), and
// the batch rolled back.
var errNoRoom = errors.New("no room left below the slice")

// maxFill bounds the statements of one batch: a page with room keeps a
// row's new version, so a batch updates what is left of its slice again
// until nothing is (each round fills the pages up a little more). A page
// of small rows, nearly empty, takes some tens of rounds.
const maxFill = 100

// maxLockWaits is how many times in one compaction of a table a session may
// queue behind a batch (which is cancelled) before the compaction stops
// there: a table the application keeps touching at its end is left for
// later.
const maxLockWaits = 10

// quarters: a sweep VACUUMs after every quarter of the pages it frees, so
// that the disk comes back as it goes and the free space map learns of the
// emptied pages in time.
const quarters = 4

// sweep moves the rows of t's pages from pages down to target (or the
// frontier, see slice) into the free space before them, a chunk at a time,
// each chunk followed by a VACUUM that cuts what it emptied off the end.
// It returns the rows it moved; errNoRoom when a batch found no room below
// its slice.
func (c *Compactor) sweep(ctx context.Context, t *catalog.Table, pages, target int64, deadline time.Time, res *Result, log *slog.Logger) (int64, error) {
	cursor := pages
	density, err := c.density(ctx, t, cursor)
	if err != nil {
		return 0, err
	}
	chunk := max(1, (cursor-target+quarters-1)/quarters)
	var moved, frontier int64
	pace := &walPace{rate: c.opts.WALRate}
	for cursor > max(target, frontier+1) {
		low := max(target, cursor-chunk)
		s := &slice{hi: cursor, low: low, target: target, density: density, frontier: frontier}
		loop := c.loop(t, deadline, s, res)
		loop.Pause = pace.pause
		r, err := loop.Run(ctx, func(ctx context.Context, _ pgtype.Timestamptz, size int) (int64, time.Time, float64, error) {
			pace.start()
			n, newest, wal, err := c.batch(ctx, t, s, pace.limit(size), res)
			pace.wrote(wal, n)
			return n, newest, wal, err
		})
		res.Batches += r.Batches
		res.Retries += r.Retries
		moved += s.moved
		cursor, density, frontier = s.hi, s.density, s.frontier
		if errors.Is(err, retry.ErrLockWait) && res.lockWaits < maxLockWaits {
			// A session queued behind a batch, which was cancelled: the
			// throttle keeps the next one out for a moment and the sizer
			// halved it. The sweep goes on from where it was.
			res.lockWaits++
			log.Debug("compact: a session queued behind a batch; going on with smaller ones", "error", err)
			continue
		}
		if err != nil {
			return moved, err
		}
		if r.StoppedEarly.Stopped() {
			// RUN_TIME, the lease, the throttle: the next compaction begins
			// with the VACUUM this chunk would have ended with.
			res.StoppedEarly = r.StoppedEarly
			return moved, nil
		}
		log.Debug("compact: chunk moved", "from_page", low, "moved", s.moved, "strays", s.strays, "no_room", s.noRoom)
		if err := c.vacuumTail(ctx, t, deadline, s.noRoom || s.hi <= max(target, frontier+1), res, log); err != nil {
			return moved, err
		}
		// The heap may end before the cursor now: the VACUUM cut off what
		// the chunk emptied, and maybe more.
		pages, err := c.pages(ctx, t)
		if err != nil {
			return moved, err
		}
		cursor = min(cursor, pages)
		if s.noRoom {
			return moved, errNoRoom
		}
	}
	return moved, nil
}

// walPace keeps a compaction's moves to a rate of WAL (Options.WALRate).
// The application's synchronous commits flush the WAL written before
// theirs: a compaction that writes several MB a second makes each of them
// wait for some of it. So after each batch the loop waits until the WAL
// written so far is due at the rate, and no batch is larger than a
// portion of it: the WAL comes in small amounts, not in bursts.
type walPace struct {
	rate   float64 // bytes a second; 0: no pace
	began  time.Time
	spent  float64 // bytes written since began
	perRow float64 // WAL a row moved, in the batches so far; 0: none yet
	rows   int64
}

// walPortion is the WAL one batch may write, in seconds at the rate.
const walPortion = 50 * time.Millisecond

// firstRowWAL is the WAL a row moved is taken to write before a batch has
// measured it (some 620 bytes on the benchmark inbox, with the first
// change of a page after a checkpoint writing its image).
const firstRowWAL = 1024

func (p *walPace) start() {
	if p.began.IsZero() {
		p.began = time.Now()
	}
}

// limit is size, or fewer rows where a batch of size would write more
// than a portion of WAL.
func (p *walPace) limit(size int) int {
	if p.rate <= 0 {
		return size
	}
	perRow := p.perRow
	if perRow <= 0 {
		perRow = firstRowWAL
	}
	return max(1, min(size, int(p.rate*walPortion.Seconds()/perRow)))
}

// wrote counts a batch's WAL and rows.
func (p *walPace) wrote(wal float64, rows int64) {
	p.spent += wal
	p.rows += rows
	if p.rows > 0 {
		p.perRow = p.spent / float64(p.rows)
	}
}

// pause is how long until the WAL written so far is due at the rate.
// Time the moves spent not writing (the throttle holding them, a lock,
// a slow batch) is no credit for a burst afterwards: the pace owes them
// at most one portion, so after a hold of a minute the next batches do
// not write a minute's WAL back to back.
func (p *walPace) pause() time.Duration {
	if p.rate <= 0 || p.began.IsZero() {
		return 0
	}
	due := p.began.Add(time.Duration(p.spent / p.rate * float64(time.Second)))
	if behind := time.Since(due) - walPortion; behind > 0 {
		p.began = p.began.Add(behind)
		due = due.Add(behind)
	}
	return time.Until(due)
}

// slice is a chunk's state: its sweep goes down from hi to low.
type slice struct {
	hi, low, target int64
	// frontier is, once the pages below the target are full, the highest
	// page a moved row went to: the free space map hands out the pages
	// after them, and the moves fill the heap upwards to here. A slice at
	// or below it holds the rows already packed: the sweep ends there.
	frontier      int64
	density       float64 // live rows a page, in the pages swept last
	width         int64   // the last batch's pages
	moved, strays int64
	noRoom        bool
}

// loop is the batch loop of a chunk: the deleter's, with the chunk's own
// end.
func (c *Compactor) loop(t *catalog.Table, deadline time.Time, s *slice, res *Result) *batchloop.Loop {
	return &batchloop.Loop{
		What: "compaction", Sizer: c.sizers.For(t.Name), Throttle: c.opts.Throttle, Active: c.opts.LoopActive(), Deadline: deadline,
		MaxRetries: c.opts.MaxRetries, BatchPause: c.opts.BatchPause, Log: c.log.With("table", t.Name),
		AfterBatch: func(n int64, _ time.Duration) {
			if m := c.opts.Metrics; m != nil && n > 0 {
				m.RowsMoved.WithLabelValues(t.Name).Add(float64(n))
			}
			if c.opts.Progress != nil {
				c.opts.Progress(Progress{Table: t.Name, Moved: res.Moved, Cursor: s.hi, Target: s.target, Truncated: res.Truncated})
			}
		},
		OnError: func(kind string) {
			if m := c.opts.Metrics; m != nil && m.Errors != nil {
				m.Errors.WithLabelValues(t.Name, kind).Inc()
			}
		},
		Exhausted: func() bool { return s.hi <= max(s.low, s.frontier+1) || s.noRoom },
	}
}

// density is the live rows a page of t's last pages below end hold: where
// the first batch's slice starts from.
func (c *Compactor) density(ctx context.Context, t *catalog.Table, end int64) (float64, error) {
	const probe = 16
	from := max(0, end-probe)
	var n int64
	err := c.readTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s u WHERE u.ctid >= %s AND u.ctid < %s", t.Ident, tidAt(from), tidAt(end))).Scan(&n)
	})
	return max(1, float64(n)/float64(max(1, end-from))), err
}

// batch moves the rows of the next slice of s, the pages below s.hi that
// should hold about size rows, and returns the rows it moved.
func (c *Compactor) batch(ctx context.Context, t *catalog.Table, s *slice, size int, res *Result) (int64, time.Time, float64, error) {
	width := int64(math.Ceil(float64(size) / s.density))
	if s.width > 0 {
		// Past empty pages the density falls and the slices widen: not
		// faster than doubling, or a dense region after them would make
		// one huge batch.
		width = min(width, 2*s.width+8)
	}
	width = max(1, min(width, s.hi-s.low))
	lo := s.hi - width
	out, wal, err := c.moveSlice(ctx, t, lo, s.hi, s.target)
	if err != nil {
		return 0, time.Time{}, 0, err
	}
	if out.rolledBack {
		s.noRoom = true
		return 0, time.Time{}, 0, nil
	}
	s.hi, s.width = lo, width
	if out.placed == 0 && out.strays > 0 {
		// The start is full: the free space map hands out the pages after
		// it, and the moves fill the heap upwards from there.
		s.frontier = max(s.frontier, out.highest)
	}
	s.density = max(0.5, (s.density+float64(out.first)/float64(width))/2)
	n := out.placed + out.strays
	s.moved += out.placed
	s.strays += out.strays
	res.Moved += out.placed
	res.Strays += out.strays
	res.Updates += out.updates
	// A row placed at or above the target is no loss: the target is an
	// estimate, and once the start is full the free space map hands out the
	// pages right after it, where the packed heap ends. Only a version past
	// the slice (rolled back above) says there is no room below it.
	return n, time.Time{}, wal, nil
}

// moved is what the statements of one batch did.
type moved struct {
	rolledBack bool  // some went past the slice: the batch rolled back
	first      int64 // rows the slice held (the first statement's)
	placed     int64 // new versions below the target
	strays     int64 // below the slice but not below the target
	behind     int64 // at or past the slice's end
	updates    int64 // row versions written
	highest    int64 // the highest page a version below the slice went to
}

// moveSlice is one batch transaction over the pages [lo, hi): an
// optimistic one that waits at most 50 ms for a row lock, or, when it met a
// locked row, one that skips the rows others hold locked.
func (c *Compactor) moveSlice(ctx context.Context, t *catalog.Table, lo, hi, target int64) (moved, float64, error) {
	out, wal, err := c.moveTx(ctx, t, lo, hi, target, false)
	if retry.KindOf(err) != retry.KindLockTimeout {
		return out, wal, err
	}
	c.log.Debug("compact: batch met a locked row, running it again with SKIP LOCKED", "table", t.Name, "error", err)
	if c.TestSignals.OnFallback != nil {
		c.TestSignals.OnFallback()
	}
	return c.moveTx(ctx, t, lo, hi, target, true)
}

// moveSettingsSQL: as a delete batch, a move's commit does not wait for
// its WAL to reach disk (a move lost in a crash leaves the row where it
// was, whole); and no JIT for the short statements.
const moveSettingsSQL = `SELECT set_config('synchronous_commit', 'off', true), set_config('jit', 'off', true)`

func (c *Compactor) moveTx(ctx context.Context, t *catalog.Table, lo, hi, target int64, skipLocked bool) (out moved, wal float64, err error) {
	lockTimeout := c.opts.LockTimeout
	if !skipLocked {
		lockTimeout = min(lockTimeout, c.optimisticWait())
	}
	tx, err := batchloop.Begin(ctx, c.pool, t.Name, batchloop.TxOptions{
		LockTimeout: lockTimeout, StatementTimeout: c.opts.StatementTimeout, IdleInTx: c.opts.IdleTimeout, Throttle: c.opts.Throttle,
		Clock: c.opts.Clock, Watch: c.opts.Watch, Settings: moveSettingsSQL})
	if err != nil {
		return out, 0, err
	}
	defer tx.Close(ctx, &err)
	// The fence was taken before the holds were read: a legal hold whose
	// writer the fence waited for keeps its rows out of this batch.
	var args sqlargs.List
	hold := tx.Coverage.DemotionPredicate(t, "u", &args)
	sql := moveSQL(t, hold, lo, hi, target, skipLocked)
	for round := 0; round < maxFill; round++ {
		var placed, strays, stayed, behind, highest int64
		if err := tx.QueryRow(ctx, sql, args.Values...).Scan(&placed, &strays, &stayed, &behind, &highest); err != nil {
			return out, 0, err
		}
		out.highest = max(out.highest, highest)
		n := placed + strays + stayed + behind
		if round == 0 {
			out.first = n
		}
		out.placed, out.strays, out.behind, out.updates = out.placed+placed, out.strays+strays, out.behind+behind, out.updates+n
		if stayed == 0 {
			break
		}
	}
	if out.behind > 0 {
		// New versions went past the slice: no room below it any more (the
		// free space map found none, and the heap may have grown for them).
		// Committing would leave rows at the heap's end; rolled back, they
		// stay where they were, and the sweep stops here. Pages the heap
		// grew by stay empty, for the VACUUM to cut off.
		out.rolledBack = true
		return out, 0, nil
	}
	if c.TestSignals.BeforeCommit != nil {
		c.TestSignals.BeforeCommit(t.Name, out.placed)
	}
	if wal, err = tx.Commit(ctx); err != nil {
		return moved{}, 0, err
	}
	return out, wal, nil
}

func (c *Compactor) optimisticWait() time.Duration {
	if c.TestSignals.OptimisticWait > 0 {
		return c.TestSignals.OptimisticWait
	}
	// A batch waits as long as the deleter's for a row lock before it runs
	// again with SKIP LOCKED.
	return batchloop.OptimisticLockWait
}

// moveSQL is one round of a batch: update every row on the pages [lo, hi)
// that no legal hold covers (hold, over the alias u) to its own expiry
// value, and count where the new versions went: below the target, below
// the slice, still in it (a page with room kept them: the next round
// updates them again), at or past its end. The optimistic form updates
// the TID range directly; the SKIP LOCKED form locks what it can first and
// updates exactly those rows by ctid.
func moveSQL(t *catalog.Table, hold string, lo, hi, target int64, skipLocked bool) string {
	set := fmt.Sprintf("%[1]s = u.%[1]s", t.Expiry.Quoted)
	in := fmt.Sprintf("u.ctid >= %s AND u.ctid < %s AND NOT %s", tidAt(lo), tidAt(hi), hold)
	const page = "(u.ctid::text::point)[0]::int8"
	var with string
	if skipLocked {
		with = fmt.Sprintf(`WITH pick AS (
  SELECT u.ctid FROM %[1]s u WHERE %[2]s FOR UPDATE OF u SKIP LOCKED
), moved AS (
  UPDATE %[1]s u SET %[3]s WHERE u.ctid = ANY (ARRAY(SELECT ctid FROM pick)) RETURNING %[4]s AS page
)`, t.Ident, in, set, page)
	} else {
		with = fmt.Sprintf(`WITH moved AS (
  UPDATE %[1]s u SET %[3]s WHERE %[2]s RETURNING %[4]s AS page
)`, t.Ident, in, set, page)
	}
	return with + fmt.Sprintf(`
SELECT count(*) FILTER (WHERE page < %[1]d), count(*) FILTER (WHERE page >= %[1]d AND page < %[2]d),
       count(*) FILTER (WHERE page >= %[2]d AND page < %[3]d), count(*) FILTER (WHERE page >= %[3]d),
       coalesce(max(page) FILTER (WHERE page < %[2]d), -1) FROM moved`, target, lo, hi)
}

// legalHolds is the SQL condition, over the alias u, of a row a hold that
// blocks demotion covers at now, and its parameters.
func legalHolds(ctx context.Context, tx pgx.Tx, t *catalog.Table, now time.Time) (string, []any, error) {
	cov, err := holds.Active(ctx, tx, t, now)
	if err != nil {
		return "", nil, err
	}
	var args sqlargs.List
	return cov.DemotionPredicate(t, "u", &args), args.Values, nil
}

// readTx runs fn in a read-only transaction with the batch timeouts.
func (c *Compactor) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, c.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := c.opts.TxSettings().Apply(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}
