// Package compact gives the empty space of an ordinary inbox table back to
// the operating system, online: it moves the live rows of the heap's last
// pages into free space near its start, then lets a VACUUM cut the emptied
// pages off the end (docs/design/compaction.md).
//
// A move is an ordinary UPDATE that sets the expiry column to its own
// value: the row keeps its key and every value, and PostgreSQL writes its
// new version where the free space map points, on an earlier page, once
// the old page has no room for it (a page with room keeps the version:
// the batch updates what is still on it again, filling it, until nothing
// of the slice is left there). Moves run in batches like the deleter's:
// each a short transaction under the same lock and statement timeouts,
// behind the throttle and the hold fence, first without locking rows (50 ms
// for a lock, then again with FOR UPDATE SKIP LOCKED); a row a legal hold
// (one that blocks demotion) covers is not moved. Every chunk of the tail
// ends with VACUUM (INDEX_CLEANUP ON, TRUNCATE true, SKIP_LOCKED): the
// truncation takes its ACCESS EXCLUSIVE lock only conditionally and lets it
// go as soon as a session waits, so no queue forms; one that could not
// truncate is tried again a few times, then by the next run.
//
// Moved rows fire the table's UPDATE triggers and reach logical decoding
// as updates, so a table with user UPDATE triggers, or in a publication
// that publishes updates, is refused unless the caller allows it.
//
// Daemon internals: `inboxkeeper compact` and the daemon's pass use it; its
// API may change between releases.
package compact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
)

// Options tune a Compactor: the batch settings the deleter and the
// demoter use (the service base: logger, clock, throttle, active check,
// dry run, timeouts; the batch sizes and RUN_TIME), its metrics, and what
// it may do.
type Options struct {
	batchloop.Settings
	Metrics *Metrics // may be nil
	// Force compacts every table given, whatever its free space and its
	// policy (the command); without it only a table whose policy has a
	// compact section, and whose free space is over its free_ratio.
	Force bool
	// Allow is allowed of every table, besides what its policy allows.
	Allow Allow
	// Progress, when set, is told after every committed batch.
	Progress func(Progress)
	// SessionPool is where the VACUUMs and ANALYZEs run, with settings of
	// their session (neither may run in a transaction): a pool of direct
	// connections where the pool goes through a transaction pooler; nil:
	// the pool.
	SessionPool *pgxpool.Pool
	// WALRate is the most WAL a second the moves write (walPace); 0: only
	// the throttle bounds them.
	WALRate float64
}

// Progress reports a compaction's advance through one table.
type Progress struct {
	Table     string
	Moved     int64 // rows moved so far
	Cursor    int64 // the page the sweep has come down to
	Target    int64 // the page it sweeps down to
	Truncated int64 // bytes given back so far
}

// Result is what one compaction did to one table.
type Result struct {
	Table  string
	Before Space // measured as it began (the live rows after its first ANALYZE)
	After  Space // measured as it ended (with DryRun: Before)
	// Moved counts rows moved to a page below the target; Strays, rows
	// whose new version landed in the tail all the same (moved again
	// later); Updates, every row version written (moves, and the updates
	// that fill a page with room until its rows leave it).
	Moved, Strays, Updates int64
	// KeptByHolds: live rows in the tail that a legal hold (one that
	// blocks demotion) keeps where they are, as the last sweep left them.
	KeptByHolds int64
	Batches     int
	Retries     int
	Vacuums     int   // VACUUMs run (each may truncate)
	Truncated   int64 // bytes the VACUUMs cut off the end of the heap
	// NotRun says why the table was left alone: its free space below the
	// policy's ratio, or a recent compaction that gave nothing back.
	NotRun string
	// NotTruncated says why the last VACUUM cut nothing off an empty tail:
	// another session held the table, or an older snapshot still sees the
	// moved rows' old versions.
	NotTruncated string
	Duration     time.Duration
	batchloop.Outcome

	vacuumedAt int64 // Updates at the last VACUUM
	lockWaits  int   // sessions that queued behind a batch
}

// WouldGiveBack is, for a dry run, what compaction would give back.
func (r Result) WouldGiveBack() int64 { return r.Before.Reclaimable() }

// TestSignals are the hooks tests set on a Compactor; the daemon never
// sets them.
type TestSignals struct {
	// BeforeCommit holds a batch open before its COMMIT, with the rows it
	// moved.
	BeforeCommit func(table string, moved int64)
	// OnFallback is told when a batch meets a locked row and runs again
	// with SKIP LOCKED.
	OnFallback func()
	// OnVacuum is told after every VACUUM, with the heap's pages before and
	// after it.
	OnVacuum func(before, after int64)
	// OptimisticWait replaces batchloop.OptimisticLockWait.
	OptimisticWait time.Duration
}

// Compactor compacts the ordinary tables it was given.
type Compactor struct {
	pool        *pgxpool.Pool
	tables      []*catalog.Table
	opts        Options
	log         *slog.Logger
	TestSignals TestSignals

	sizers *batchloop.Sizers
	mu     sync.Mutex
	quiet  map[string]quiet // tables whose last compaction gave nothing back
	// vacuumPerUpdate is the WAL a table's last VACUUM after moves wrote
	// per row version written since the one before.
	vacuumPerUpdate map[string]float64
}

// quiet is a table left alone until until, after n compactions in a row
// that gave nothing back.
type quiet struct {
	until time.Time
	n     int
}

// New returns a Compactor for the ordinary tables of tables (partitioned
// and Citus-distributed ones are left out); without opts.Force, only those
// whose policy has a compact section.
func New(pool *pgxpool.Pool, tables []*catalog.Table, opts Options) *Compactor {
	opts.Settings = opts.Settings.WithDefaults()
	c := &Compactor{pool: pool, opts: opts, log: opts.Logger, quiet: map[string]quiet{}, vacuumPerUpdate: map[string]float64{},
		sizers: batchloop.NewSizers(opts.BatchSize, opts.Sizing)}
	for _, t := range tables {
		if t.Partitioned() || t.ThroughCitus() || (!opts.Force && t.Policy.Compact == nil) {
			continue
		}
		c.tables = append(c.tables, t)
		if m := opts.Metrics; m != nil {
			m.RowsMoved.WithLabelValues(t.Name).Add(0)
			m.Truncated.WithLabelValues(t.Name).Add(0)
		}
	}
	return c
}

// Tables are the tables this Compactor works on.
func (c *Compactor) Tables() []*catalog.Table { return c.tables }

// RunPass compacts every table, in policy order, within RUN_TIME.
func (c *Compactor) RunPass(ctx context.Context) ([]Result, error) {
	return c.RunPassUntil(ctx, batchloop.Deadline(c.opts.RunTime))
}

// RunPassUntil is RunPass within the deadline of a larger pass (zero:
// none). A table that failed says so in its result; the error is non-nil
// only when ctx ended the pass.
func (c *Compactor) RunPassUntil(ctx context.Context, deadline time.Time) ([]Result, error) {
	return batchloop.Pass(ctx, c.tables, deadline, c.runTable)
}

// minFreeBytes is the least a daemon's compaction must expect to give back:
// fewer are not worth a VACUUM and the moves.
const minFreeBytes = 8 << 20

func (c *Compactor) runTable(ctx context.Context, t *catalog.Table, deadline time.Time) Result {
	start := time.Now()
	res := Result{Table: t.Name}
	log := c.log.With("table", t.Name)
	res.Err = c.compact(ctx, t, deadline, &res, log)
	res.Duration = time.Since(start)
	if res.Err != nil {
		if why := batchloop.LogEnd(ctx, log, "compact", res.Err, "moved", res.Moved, "truncated_bytes", res.Truncated); why.Stopped() {
			res.StoppedEarly = why
		}
		return res
	}
	switch {
	case res.NotRun != "":
		log.Debug("compact: table left alone", "why", res.NotRun, "heap_bytes", res.Before.HeapBytes(), "live_bytes", res.Before.LiveBytes())
	case c.opts.DryRun:
		log.Info("compact: table done", "would_give_back_bytes", res.WouldGiveBack(), "heap_bytes", res.Before.HeapBytes(),
			"live_bytes", res.Before.LiveBytes(), "kept_by_holds", res.KeptByHolds, "dry_run", true)
	default:
		log.Info("compact: table done", "moved", res.Moved, "strays", res.Strays, "updates", res.Updates, "batches", res.Batches,
			"vacuums", res.Vacuums, "truncated_bytes", res.Truncated, "heap_bytes", res.After.HeapBytes(), "live_bytes", res.After.LiveBytes(),
			"kept_by_holds", res.KeptByHolds, "not_truncated", res.NotTruncated, "duration", res.Duration.Round(time.Millisecond), "stopped_early", res.StoppedEarly)
	}
	return res
}

// compact does one table's compaction into res.
func (c *Compactor) compact(ctx context.Context, t *catalog.Table, deadline time.Time, res *Result, log *slog.Logger) error {
	var err error
	if res.Before, err = Measure(ctx, c.pool, t); err != nil {
		return err
	}
	res.After = res.Before
	c.observe(t, res.Before)
	if why := c.leaveAlone(t, res.Before); why != "" {
		res.NotRun = why
		return nil
	}
	allow := c.opts.Allow
	if p := t.Policy.Compact; p != nil {
		allow.Triggers = allow.Triggers || p.AllowTriggers
		allow.Publication = allow.Publication || p.AllowPublication
	}
	if err := check(ctx, c.pool, t, allow); err != nil {
		return err
	}
	if c.opts.DryRun {
		// From the statistics as they are, as status reads them: a dry run
		// writes nothing, not even an ANALYZE.
		res.KeptByHolds, err = c.keptByHolds(ctx, t, res.Before.LivePages)
		return err
	}
	// First a VACUUM: the free space map must know the space the purge
	// left, or the moves would extend the heap; and a tail the purge
	// emptied goes at once.
	if err := c.vacuumTail(ctx, t, deadline, false, res, log); err != nil || res.StoppedEarly.Stopped() {
		return err
	}
	// The target is the live size by an ANALYZE's statistics, kept for the
	// whole compaction. Not a VACUUM's: it counts the pages it scans and
	// takes the pages it skips (all-visible) for as dense as the table on
	// average, and after a purge it scans the emptied start and skips the
	// full end (a target of 65 pages for rows that fill 300).
	if err := c.analyze(ctx, t, deadline, res); err != nil || res.StoppedEarly.Stopped() {
		return err
	}
	start, err := Measure(ctx, c.pool, t)
	if err != nil {
		return err
	}
	pages := res.Before.Pages
	res.Before, res.Before.Pages = start, pages
	target := max(1, start.LivePages)
	for sweep := 0; sweep < maxSweeps; sweep++ {
		pages, err := c.pages(ctx, t)
		if err != nil {
			return err
		}
		if pages <= target+slack(target) {
			break
		}
		// Another sweep only for what this one passed over (rows locked,
		// or moved into the tail): not when the space below ran out.
		moved, err := c.sweep(ctx, t, pages, target, deadline, res, log)
		if errors.Is(err, errNoRoom) {
			break
		}
		if err != nil {
			return err
		}
		if res.StoppedEarly.Stopped() || moved == 0 {
			break
		}
	}
	if !res.StoppedEarly.Stopped() {
		// Fresh statistics for the compacted heap (the VACUUMs' estimates
		// of its rows are off): what status and the metrics read next.
		if err := c.analyze(ctx, t, time.Time{}, res); err != nil {
			return err
		}
	}
	if res.After, err = Measure(ctx, c.pool, t); err != nil {
		return err
	}
	c.observe(t, res.After)
	if res.KeptByHolds, err = c.keptByHolds(ctx, t, res.After.LivePages); err != nil {
		return err
	}
	c.settle(t, res)
	return nil
}

// pages is t's heap pages now.
func (c *Compactor) pages(ctx context.Context, t *catalog.Table) (int64, error) {
	var n int64
	err := c.pool.QueryRow(ctx, "SELECT pg_relation_size($1::oid) / current_setting('block_size')::int8", t.OID).Scan(&n)
	return n, err
}

// maxSweeps bounds the sweeps of the tail in one compaction: a second one
// takes the rows the first passed over (locked, or moved into the tail
// when the free space map pointed there).
const maxSweeps = 3

// slack is how far above the packed size a heap may end and count as
// compact: 5% (fragments of free space too small for a row), at least 16
// pages.
func slack(target int64) int64 { return max(16, target/20) }

// leaveAlone says why the daemon leaves t alone now, or "".
func (c *Compactor) leaveAlone(t *catalog.Table, sp Space) string {
	if c.opts.Force {
		return ""
	}
	if p := t.Policy.Compact; sp.FreeRatio() <= p.FreeRatio || sp.Reclaimable() < minFreeBytes {
		return fmt.Sprintf("free space %.0f%% of the heap (%d bytes), not over compact.free_ratio %.0f%% and %d bytes",
			100*sp.FreeRatio(), sp.Reclaimable(), 100*p.FreeRatio, minFreeBytes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if q, ok := c.quiet[t.Name]; ok && time.Now().Before(q.until) {
		return fmt.Sprintf("the last %d compactions gave nothing back; the next is tried after %s", q.n, q.until.UTC().Format(time.RFC3339))
	}
	return ""
}

// settle remembers a compaction that gave nothing back: the daemon tries
// that table again after a minute, then after twice as long each time, at
// most an hour (the xmin horizon held, or a session on the table every
// time), rather than sweep and VACUUM it every pass.
func (c *Compactor) settle(t *catalog.Table, res *Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if res.Truncated > 0 || res.StoppedEarly.Stopped() {
		delete(c.quiet, t.Name)
		return
	}
	q := c.quiet[t.Name]
	q.n++
	q.until = time.Now().Add(min(time.Hour, time.Minute<<min(q.n-1, 6)))
	c.quiet[t.Name] = q
}

// observe exports sp as t's facts.
func (c *Compactor) observe(t *catalog.Table, sp Space) {
	if m := c.opts.Metrics; m != nil {
		m.Observe(t.Name, sp)
	}
}

// keptByHolds counts the live rows from page from on that a legal hold
// keeps in place.
func (c *Compactor) keptByHolds(ctx context.Context, t *catalog.Table, from int64) (held int64, err error) {
	err = c.readTx(ctx, func(tx pgx.Tx) error {
		now, err := c.opts.Clock.DBNow(ctx, tx)
		if err != nil {
			return err
		}
		pred, args, err := legalHolds(ctx, tx, t, now)
		if err != nil {
			return err
		}
		_, held, err = liveInTail(ctx, tx, t, from, pred, args)
		return err
	})
	return held, err
}
