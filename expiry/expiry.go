// Package expiry deletes expired inbox rows: oldest expiry first, in short
// batch transactions that advance by keyset on the expiry index, skip rows
// other sessions hold locked, and never delete a row an active hold or replay
// marker covers.
//
// Daemon internals: the daemon's pass, `once` and `status` use it; its API
// may change between releases.
package expiry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/tiering"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// Options tune a Deleter: the batch settings it shares with the demoter,
// and its own metrics and progress hook. Zero values get the documented
// defaults.
type Options struct {
	batchloop.Settings
	Metrics *Metrics // may be nil
	// Progress, when set, is called after every committed batch.
	Progress func(Progress)
	// Vacuum, when set, vacuums a table after a pass that left enough
	// dead tuples in it.
	Vacuum *vacuum.Vacuumer
	// Strategy is how a pass over a table that allows a choice (a plain,
	// not distributed table) orders its deletes; empty is StrategyAuto.
	Strategy Strategy
	// LiveDue: the metrics are read while a pass runs (run's /metrics), so
	// a pass exports rows_due as it begins, counted before its first
	// batch. Without it a pass over a table the sample decides counts only
	// up to two batches first (lookBound), and rows_due is exported when
	// an exact count is in (a sweep's, before its first slice) and after
	// the pass.
	LiveDue bool
	// Prefetch: a sweep reads the pages of its next slices into shared
	// buffers on a connection of its own while a slice deletes
	// (INBOXKEEPER_SWEEP_PREFETCH; prefetch.go).
	Prefetch bool
}

// Strategy is INBOXKEEPER_EXPIRY_STRATEGY: how a pass orders its deletes.
type Strategy string

const (
	// StrategyAuto sweeps the heap in physical order when the sample of
	// the pass predicts it costs less (chooseSweep), else deletes in
	// expiry order.
	StrategyAuto Strategy = config.StrategyAuto
	// StrategySweep sweeps every pass that has a row due, whatever the
	// sample says (a table known to be scattered; the randomized audit).
	StrategySweep Strategy = config.StrategySweep
	// StrategyExpiry never sweeps: every pass deletes in expiry order.
	StrategyExpiry Strategy = config.StrategyExpiry
)

// Strategies are the values Strategy takes: the configuration's
// (config.ExpiryStrategies), which its check accepts.
var Strategies = func() []Strategy {
	out := make([]Strategy, len(config.ExpiryStrategies))
	for i, s := range config.ExpiryStrategies {
		out[i] = Strategy(s)
	}
	return out
}()

// TestSignals are the hooks tests set on a Deleter (Deleter.TestSignals), in one
// place; the daemon never sets them.
type TestSignals struct {
	// BeforeCommit holds a batch open between its DELETE and its COMMIT,
	// to race it against a hold being added.
	BeforeCommit func(table string, deleted int64)
	// OnRetry sees a failed batch before it is retried.
	OnRetry func(kind string)
	// SkipLockedOnly makes every batch take the SKIP LOCKED form, so tests
	// can check both forms keep every guarantee.
	SkipLockedOnly bool
	// OptimisticWait replaces batchloop.OptimisticLockWait (tests watch a wait).
	OptimisticWait time.Duration
	// OnFallback is told when a batch falls back to SKIP LOCKED.
	OnFallback func()
	// OnDueRefresh is told after each count of refreshDue.
	OnDueRefresh func()
	// AheadRead is told when a bound read ahead has been read (readAhead).
	AheadRead func()
	// OnSample is told when a sample of the heap has been read, or has
	// failed (a sample read beside the count and not needed is stopped):
	// beside the count (sampleBeside) or after it.
	OnSample func(beside bool, err error)
	// OnExactCount is told when the exact count read beside a look that
	// stopped at its bound (exactAhead) has ended: rows counted, or the
	// error (errDropped and a cancelled statement when a pass in expiry
	// order dropped it).
	OnExactCount func(rows int64, err error)
	// BeforeExactCount holds that count between its snapshot and its
	// statement, to let slices commit before it counts.
	BeforeExactCount func()
	// OnPrefetch is told of every chunk of pages a sweep's prefetcher read
	// ([from, to)), or failed to read (prefetch.go).
	OnPrefetch func(from, to int64, err error)
}

// Sizing bounds the adaptive batch size.
type Sizing = batchloop.Sizing

// Progress reports a pass's advance through one table.
type Progress struct {
	Table   string
	Deleted int64
	Batches int
	Elapsed time.Duration
	// The batch just committed.
	BatchRows     int64
	BatchDuration time.Duration
	// Estimate is the rows due (no hold or replay covering them) when the
	// table's pass began: their exact count, at most DueCap (Due.Rows),
	// except where the pass's first count stopped at two batches
	// (lookBound): there the heap sample's estimate, and at least the two
	// batches, in expiry order throughout and in a sweep until the exact
	// count read beside it is in. In expiry order, with the metrics on, the
	// count every DueRefresh replaces it: the rows deleted as it began plus
	// those it found due. 0: unknown.
	Estimate int64
}

// TableResult is what one pass did to one table.
type TableResult struct {
	Table              string
	Deleted            int64 // with DryRun: rows that would be deleted
	ProtectedByHolds   int64 // expired rows kept because a hold covers them
	ProtectedByReplays int64 // expired rows kept because only a replay covers them
	// ProtectedByReferences are expired rows no hold or replay covers that
	// another table's foreign key points at: stepped over, as a locked row
	// is, until the row pointing at them goes.
	ProtectedByReferences int64
	Batches               int
	Retries               int
	SkipLockedBatches     int   // batches that met a locked row and ran again with SKIP LOCKED (on Citus: narrowed)
	RangeBatches          int   // batches that deleted by expiry range (the others by ctid)
	BitmapBatches         int   // range batches read with a bitmap heap scan (scanChooser)
	BoundsAhead           int   // range batches whose bound was read ahead, while the batch before ran (readAhead)
	SweepBatches          int   // batches that deleted a slice of the heap (sweep.go): the pass swept
	PrefetchedPages       int64 // heap pages a sweep read ahead of its slices (prefetch.go)
	Duration              time.Duration
	LongestBatch          time.Duration // the longest committed batch, as the sizer timed it
	CleanupLag            time.Duration
	Oldest, Newest        *time.Time // retained expiries after the pass
	BytesPerKey           float64    // table size with indexes and TOAST per estimated row; 0 when unknown
	LiveTuples            int64      // n_live_tup after the pass (pg_stat_get_live_tuples)
	DeadTuples            int64      // dead tuples after the pass: n_dead_tup, or the rows deleted since the last VACUUM (vacuum.Vacuumer) when more
	Vacuumed              bool       // the pass ended with a VACUUM of the table (vacuum.Vacuumer)
	VacuumsPassedOver     int        // VACUUMs another session's lock passed over (each tried again within the pass)
	VacuumsHeldBack       int        // VACUUMs that left the deleted rows to an older snapshot (tried again once)
	VacuumNotRun          string     // why no VACUUM ran when the dead tuples called for one
	VacuumPace            string     // how the VACUUM was paced for a standby (vacuum.Pace); empty when unpaced
	VacuumsStopped        int        // paced VACUUMs the throttle stopped (each tried again slower, up to twice)
	PermanentKeys         int64      // permanent keys written with the deleted rows (tiers.permanent_key)
	batchloop.Outcome

	// resume is where the keyset ended: the measurements after the pass
	// start there instead of walking the index entries of every row the
	// pass just deleted (a million dead entries cost seconds).
	resume pgtype.Timestamptz
	// ahead is the next batch's bound, being read while this batch's
	// DELETE runs (readAhead).
	ahead *boundAhead
	// keyset is where the running pass has got to, for the counts taken
	// during it.
	keyset pgtype.Timestamptz
	// fewDue is the pass's first look when it counted, exactly, fewer rows
	// due than the first batch wants: that batch's bound is the newest due
	// row, read without walking the rows before it (takeBound).
	fewDue *Due
	// boundsFromCount counts the batches whose bound fewDue let them read
	// so (at most the first).
	boundsFromCount int
	// errorsCounted counts the failed attempts the batch loop counted in
	// inboxkeeper_errors_total.
	errorsCounted int
	// victimsShort: the last batch of a table with delete_referencing
	// came back short (as a batch without: fewer rows than its size) or,
	// when it deleted referencing rows first, found fewer victims than it
	// wanted, or deleted none of them.
	victimsShort bool
}

// DueRefresh is how often a long pass counts the due rows again.
const DueRefresh = 30 * time.Second

var negInf = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}

// Deleter runs passes over a fixed set of resolved tables.
type Deleter struct {
	pool        *pgxpool.Pool
	tables      []*catalog.Table
	opts        Options
	log         *slog.Logger
	TestSignals TestSignals

	sizers *batchloop.Sizers // per table, kept across passes

	mu         sync.Mutex
	scanChoice map[string]*scanChooser   // per table, made anew each pass
	windows    map[string]*window        // per distributed table, kept across passes
	rates      map[string]*deleteRate    // per table, kept across passes
	sweepFrom  map[string]int64          // per table: the page the next sweep starts at (sweepStart)
	lastDue    map[string]int64          // per table: the rows due at the start of its last pass, -1 unknown (sampleBeside)
	windowDue  map[string]Due            // per window of a table with several: its last count (exportDue)
	refsSeen   map[string]bool           // per table: batches leave out rows other tables point at (view)
	optimistic map[string]*catalog.Table // per table: as a batch sees it while refsSeen is false (view)
	windowsOf  map[string][]string       // per table with windows: their IDs
	lockFirst  map[string]bool           // per table with delete_referencing: batches lock their victims first (lateReference)

	dueRefresh time.Duration // tests: DueRefresh
}

// New returns a Deleter with defaults filled in.
func New(pool *pgxpool.Pool, tables []*catalog.Table, opts Options) *Deleter {
	opts.Settings = opts.Settings.WithDefaults()
	log := opts.Logger
	// Partitioned parents lose whole partitions (package partitions): ctid
	// batches do not apply to them.
	var rowTables []*catalog.Table
	for _, t := range tables {
		if !t.Partitioned() {
			rowTables = append(rowTables, t)
		}
	}
	tables = rowTables
	if m := opts.Metrics; m != nil {
		// Every series exists from the start, so that increase() sees the
		// first error instead of a series appearing at 1.
		for _, t := range tables {
			for _, k := range retry.ErrorKinds {
				m.Errors.WithLabelValues(t.Name, k).Add(0)
			}
			m.RowsDeleted.WithLabelValues(t.Name).Add(0)
			m.Batches.WithLabelValues(t.Name).Add(0)
		}
	}
	windowsOf := map[string][]string{}
	for _, t := range tables {
		for i := range t.Windows {
			windowsOf[t.Name] = append(windowsOf[t.Name], t.Window(i).ID())
		}
	}
	return &Deleter{pool: pool, tables: tables, opts: opts, log: log, sizers: batchloop.NewSizers(opts.BatchSize, opts.Sizing),
		scanChoice: map[string]*scanChooser{}, windows: map[string]*window{}, rates: map[string]*deleteRate{},
		sweepFrom: map[string]int64{}, lastDue: map[string]int64{}, windowDue: map[string]Due{}, windowsOf: windowsOf,
		refsSeen: map[string]bool{}, optimistic: map[string]*catalog.Table{}, lockFirst: map[string]bool{}, dueRefresh: DueRefresh}
}

// RunPass runs one pass over every table, in policy order. A failure on one
// table is recorded in its result and the pass goes on to the next; the
// returned error is non-nil only when ctx ended the pass.
func (d *Deleter) RunPass(ctx context.Context) ([]TableResult, error) {
	return d.RunPassUntil(ctx, batchloop.Deadline(d.opts.RunTime))
}

// RunPassUntil is RunPass with the deadline of a larger pass (the daemon's
// pass runs partitions, demotion and deletion within one RUN_TIME); zero
// means none.
func (d *Deleter) RunPassUntil(ctx context.Context, deadline time.Time) ([]TableResult, error) {
	return batchloop.Pass(ctx, d.tables, deadline, d.runTable)
}

func (d *Deleter) now(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (time.Time, error) {
	return d.opts.Clock.DBNow(ctx, q)
}

// cutoff is the newest expiry-column value that is expired at now.
func cutoff(t *catalog.Table, now time.Time) time.Time {
	return now.Add(-t.Policy.ExpiryOffset())
}

func (d *Deleter) sizer(t *catalog.Table) *batchloop.Sizer { return d.sizers.For(t.ID()) }

// BatchSize is the size the next batch on table will have.
func (d *Deleter) BatchSize(table *catalog.Table) int { return d.sizer(table).Size() }

// runTable runs a pass over t: over each of its windows in turn when it has
// several (each with its own filter and expiry, catalog.Table.Window), as
// one result.
func (d *Deleter) runTable(ctx context.Context, t *catalog.Table, deadline time.Time) TableResult {
	if len(t.Windows) == 0 {
		return d.runWindow(ctx, t, deadline)
	}
	res := TableResult{Table: t.Name}
	for i := range t.Windows {
		r := d.runWindow(ctx, t.Window(i), deadline)
		res.add(r, i == 0)
		if r.Err != nil || r.StoppedEarly.Stopped() {
			break
		}
	}
	return res
}

// add counts a window's result r into the table's: sums of what was done
// and kept, the worst lag, the widest retained range; first says r is the
// first window's.
func (res *TableResult) add(r TableResult, first bool) {
	res.Deleted += r.Deleted
	res.ProtectedByHolds += r.ProtectedByHolds
	res.ProtectedByReplays += r.ProtectedByReplays
	res.ProtectedByReferences += r.ProtectedByReferences
	res.Batches += r.Batches
	res.Retries += r.Retries
	res.SkipLockedBatches += r.SkipLockedBatches
	res.RangeBatches += r.RangeBatches
	res.BitmapBatches += r.BitmapBatches
	res.BoundsAhead += r.BoundsAhead
	res.SweepBatches += r.SweepBatches
	res.PrefetchedPages += r.PrefetchedPages
	res.PermanentKeys += r.PermanentKeys
	res.Duration += r.Duration
	res.LongestBatch = max(res.LongestBatch, r.LongestBatch)
	res.CleanupLag = max(res.CleanupLag, r.CleanupLag)
	if r.Oldest != nil && (res.Oldest == nil || r.Oldest.Before(*res.Oldest)) {
		res.Oldest = r.Oldest
	}
	if r.Newest != nil && (res.Newest == nil || r.Newest.After(*res.Newest)) {
		res.Newest = r.Newest
	}
	if r.BytesPerKey > 0 || first {
		res.BytesPerKey, res.LiveTuples, res.DeadTuples = r.BytesPerKey, r.LiveTuples, r.DeadTuples
	}
	res.Vacuumed = res.Vacuumed || r.Vacuumed
	res.VacuumsPassedOver += r.VacuumsPassedOver
	res.VacuumsHeldBack += r.VacuumsHeldBack
	if r.VacuumNotRun != "" {
		res.VacuumNotRun = r.VacuumNotRun
	}
	res.errorsCounted += r.errorsCounted
	if !res.StoppedEarly.Stopped() {
		res.StoppedEarly = r.StoppedEarly
	}
	if res.Err == nil {
		res.Err = r.Err
	}
}

// runWindow runs a pass over one window of a table (the table itself when
// it has one).
func (d *Deleter) runWindow(ctx context.Context, t *catalog.Table, deadline time.Time) TableResult {
	start := time.Now()
	d.markRate(t)
	res := TableResult{Table: t.Name}
	log := d.log.With("table", t.Name)
	if t.WindowLabel != "" {
		log = log.With("window", t.WindowLabel)
	}
	if d.opts.DryRun {
		res.Err = d.dryRun(ctx, t, &res)
	} else {
		// The count at the start says whether two batches are due or more
		// (startSweep), and, when it counted them all, is what the progress
		// line's ETA counts down from (refreshed every DueRefresh during a
		// long pass); when nothing is due, what it measured is the pass.
		// The heap's sample, when the pass may need it, is read beside
		// the count (sampleBeside). Where the sample decides, the count
		// stops at what the decision needs (lookBound).
		var sample *sampleAhead
		due, err := d.look(ctx, t, &res, d.lookBound(t), func(now time.Time, cov holds.Coverage) {
			if d.sampleBeside(t) {
				sample = d.readSampleAhead(ctx, t, now, cov)
			}
		})
		d.noteDue(t, due, err)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("expiry: could not count the due rows", "table", t.Name, "error", err)
		}
		if err == nil && !due.Capped && !due.bounded {
			f := due
			res.fewDue = &f // takeBound: the first batch's bound, where the count is below its size
		}
		if err != nil || due.Rows > 0 {
			res.Err = d.deleteAll(ctx, t, deadline, due, sample, &res)
		} else if t.HasReferences() {
			// Nothing due: the look is the pass, and its due range holds
			// only what something keeps, so counting the referenced rows in
			// it is cheap (a look before deleting leaves them uncounted).
			res.Err = d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
				var err error
				res.ProtectedByReferences, err = countReferenced(ctx, tx, t, now, cov)
				d.referencesLeft(t, res.ProtectedByReferences)
				return err
			})
		}
		sample.drop() // nothing of the pass outlives it
		due.exact.drop()
		if (err != nil || due.Rows > 0) && res.Err == nil && ctx.Err() == nil {
			// Measuring is best effort: the deletion is done whatever it says.
			if _, err := d.look(ctx, t, &res, 0, nil); err != nil {
				log.Warn("expiry: could not measure the table after the pass; its metrics wait for the next one", "error", err)
			} else if res.Deleted > 0 {
				v := d.opts.Vacuum.AfterPass(ctx, t, res.Deleted, res.LiveTuples, res.DeadTuples)
				res.DeadTuples, res.Vacuumed, res.VacuumNotRun = max(res.DeadTuples, v.Dead), v.Ran, v.NotRun
				res.VacuumsPassedOver, res.VacuumsHeldBack, res.VacuumsStopped = v.PassedOver, v.HeldBack, v.Stopped
				if v.Pace != nil {
					res.VacuumPace = v.Pace.String()
				}
			}
		}
	}
	res.Duration = time.Since(start)
	if res.Err != nil && res.errorsCounted == 0 && ctx.Err() == nil && d.opts.Metrics != nil {
		// Failed before any batch (the look, the privilege check: the
		// database went away between passes): counted too, as the batches'
		// failures are.
		d.opts.Metrics.Errors.WithLabelValues(t.Name, string(retry.KindOf(res.Err))).Inc()
	}
	if res.Err != nil {
		if why := batchloop.LogEnd(ctx, log, "expiry", res.Err, "deleted", res.Deleted, "batches", res.Batches); why.Stopped() {
			res.StoppedEarly = why
		}
		return res
	}
	if d.opts.Metrics != nil && !res.StoppedEarly.Stopped() && !d.opts.DryRun {
		d.opts.Metrics.LastSuccess.WithLabelValues(t.Name).Set(float64(time.Now().Unix()))
	}
	verb := "deleted"
	if d.opts.DryRun {
		verb = "would_delete" // counted, not done
	}
	// A pass that deleted nothing says so only at debug: in the steady
	// state most passes of a daemon on a short INTERVAL find little or
	// nothing, and their lines would be most of the log.
	// Nor does one the throttle held back from its start to its end (a
	// standby gone, a throttle query failing, at every RUN_TIME): the
	// throttle says once that it pauses, and once that it resumes.
	logf := log.Debug
	held := res.StoppedEarly.Kind == retry.KindThrottled && res.Deleted == 0
	if (res.Deleted > 0 || d.opts.DryRun || res.StoppedEarly.Stopped()) && !held {
		logf = log.Info
	}
	attrs := []any{verb, res.Deleted}
	if rate, ok := d.rate(t, res.Deleted); ok && !d.opts.DryRun {
		attrs = append(attrs, "rows_per_second", int64(math.Round(rate)))
	}
	if res.Deleted > 0 && !d.opts.DryRun {
		attrs = append(attrs, "dead_tuples", res.DeadTuples, "vacuumed", res.Vacuumed)
		if res.VacuumNotRun != "" {
			attrs = append(attrs, "vacuum_not_run", res.VacuumNotRun)
		}
		if res.VacuumsPassedOver > 0 {
			attrs = append(attrs, "vacuums_passed_over", res.VacuumsPassedOver)
		}
		if res.VacuumsHeldBack > 0 {
			attrs = append(attrs, "vacuums_held_back", res.VacuumsHeldBack)
		}
		if res.VacuumPace != "" {
			attrs = append(attrs, "vacuum_paced", res.VacuumPace)
		}
		if res.VacuumsStopped > 0 {
			attrs = append(attrs, "vacuums_stopped", res.VacuumsStopped)
		}
	}
	logf("expiry: table done", append(attrs, "protected_by_holds", res.ProtectedByHolds,
		"protected_by_replays", res.ProtectedByReplays, "protected_by_references", res.ProtectedByReferences, "batches", res.Batches, "skip_locked_batches", res.SkipLockedBatches, "range_batches", res.RangeBatches, "bitmap_batches", res.BitmapBatches, "bounds_ahead", res.BoundsAhead, "sweep_batches", res.SweepBatches, "prefetched_pages", res.PrefetchedPages, "longest_batch", res.LongestBatch, "dry_run", d.opts.DryRun,
		"duration", res.Duration.Round(time.Millisecond), "stopped_early", res.StoppedEarly)...)
	return res
}

// rate counts a pass's deleted rows into the table's running total and
// returns the rows deleted per second over the last minute, across passes
// (batchloop.Rate; each pass is sampled at its start too, markRate, so a
// pass longer than the minute has its own). Not before the samples span
// most of a minute: until then they are the first pass's burst (117,000
// rows/s after a restart or a set) where later lines say the throughput
// (200), and the line leaves it out.
func (d *Deleter) rate(t *catalog.Table, deleted int64) (float64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.rateOf(t)
	r.total += deleted
	r.Add(time.Now(), r.total)
	v, ok := r.PerSecond()
	return v, ok && r.Span() >= batchloop.RateWindow*9/10
}

// markRate samples t's running total as a pass begins: the rate then
// counts a long pass's rows over its own duration, not from the end of the
// pass before it.
func (d *Deleter) markRate(t *catalog.Table) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.rateOf(t)
	r.Add(time.Now(), r.total)
}

// rateOf is t's running total and rate; d.mu is held.
func (d *Deleter) rateOf(t *catalog.Table) *deleteRate {
	r := d.rates[t.ID()]
	if r == nil {
		r = &deleteRate{}
		d.rates[t.ID()] = r
	}
	return r
}

// deleteRate is a table's running total of deleted rows and its rate.
type deleteRate struct {
	batchloop.Rate
	total int64
}

func (d *Deleter) deleteAll(ctx context.Context, t *catalog.Table, deadline time.Time, due Due, sample *sampleAhead, res *TableResult) error {
	// The keyset: every batch starts at the newest expiry the previous batch
	// deleted, so rows it passed over (held, or locked by someone else) are
	// not scanned again in this pass.
	if err := d.checkLockPrivilege(ctx, t); err != nil {
		return err
	}
	start := time.Now()
	d.mu.Lock()
	d.scanChoice[t.ID()] = &scanChooser{}
	d.mu.Unlock()
	if costs := t.RowCosts(); costs != "" {
		// A deleted row costs more than the starting size assumes: the
		// first batch measures it (batchloop.Sizer.Probe).
		d.sizer(t).Probe()
		d.log.Debug("expiry: the first batch probes the cost of a row", "table", t.Name, "costs", costs)
	}
	// A sample of the heap decides whether the pass sweeps the heap in
	// physical order instead (startSweep), which also says what the
	// progress line's ETA counts down from: the count the pass began with
	// (look), or, where that count stopped at its bound, the sample's
	// estimate, until a sweep's exact count is in.
	sw, estimate := d.startSweep(ctx, t, due, sample)
	m := d.opts.Metrics
	var deletedSoFar atomic.Int64 // res.Deleted, for refreshDue
	setKeyset, recounted, stopRefresh := d.refreshDue(ctx, t, m != nil, &deletedSoFar)
	defer stopRefresh()
	var lastNewest time.Time // the newest expiry of the last batch, for its log line
	loop := batchloop.Loop{
		What: "delete", Sizer: d.sizer(t), Throttle: d.opts.Throttle, Active: d.opts.LoopActive(), Deadline: deadline,
		MaxRetries: d.opts.MaxRetries, BatchPause: d.opts.BatchPause, Log: d.log.With("table", t.Name), OnRetry: d.TestSignals.OnRetry,
		BeforeBatch: func(size int) {
			if m != nil {
				m.BatchSize.Set(float64(size), t.Name)
			}
		},
		AfterBatch: func(n int64, took time.Duration) {
			res.LongestBatch = max(res.LongestBatch, took)
			if m != nil {
				m.BatchDuration.WithLabelValues(t.Name).Observe(took.Seconds())
				if n > 0 {
					m.Batches.WithLabelValues(t.Name).Inc()
					m.RowsDeleted.WithLabelValues(t.Name).Add(float64(n))
				}
			}
			// Logged once the metrics count the batch, so that what the log
			// says has happened, /metrics says too.
			d.log.Debug("expiry: batch", "table", t.Name, "deleted", n, "newest_expiry", lastNewest)
			if sw != nil && sw.counted != nil {
				// A sweep's count, once in (it may come in beside the slices).
				if rows, ok := sw.counted(); ok {
					estimate = rows
				}
			} else if rows, ok := recounted(); ok && sw == nil {
				// In expiry order each batch deletes what is due at its own
				// now: a pass held back for minutes deletes what fell due
				// meanwhile, which the last recount saw (and at least what
				// it has deleted: a count may end as a batch commits).
				estimate = max(rows, res.Deleted)
			}
			if n > 0 && d.opts.Progress != nil {
				d.opts.Progress(Progress{Table: t.Name, Deleted: res.Deleted, Batches: res.Batches, Elapsed: time.Since(start),
					BatchRows: n, BatchDuration: took, Estimate: estimate})
			}
		},
		OnError: func(kind string) {
			res.errorsCounted++
			if m != nil {
				m.Errors.WithLabelValues(t.Name, kind).Inc()
			}
		},
	}
	if t.ThroughCitus() {
		// A batch counts rows per shard and is an expiry window, which can
		// come back short with rows still due (distributedBatch).
		win := d.window(t)
		win.setExhausted(false)
		win.mu.Lock()
		win.due = estimate
		win.mu.Unlock()
		loop.Shards, loop.Exhausted = t.Shards(), win.isExhausted
	}
	if sw != nil {
		// A slice can come back short with rows still due further on.
		loop.Exhausted = sw.exhausted
	} else if len(t.DeletesFirst()) > 0 {
		// A batch whose victim a locked row points at comes back short
		// with rows still due; one that deleted none ends the pass, so
		// that the same victims are not picked again and again.
		loop.Exhausted = func() bool { return res.victimsShort }
	}
	r, err := loop.Run(ctx, func(ctx context.Context, lower pgtype.Timestamptz, size int) (int64, time.Time, float64, error) {
		if sw != nil {
			n, newest, wal, err := d.sweepBatch(ctx, t, sw, size, res)
			lastNewest = newest
			res.Deleted += n
			deletedSoFar.Store(res.Deleted)
			if n > 0 {
				res.Batches++
			}
			return n, newest, wal, err
		}
		n, newest, wal, err := d.batch(ctx, t, lower, size, res)
		// n of a failed batch is what part of it committed (batchloop.Batch).
		lastNewest = newest
		res.Deleted += n
		deletedSoFar.Store(res.Deleted)
		if n > 0 {
			res.Batches++
			res.keyset = pgtype.Timestamptz{Time: newest, Valid: true}
			setKeyset(res.keyset)
		}
		return n, newest, wal, err
	})
	stopRefresh()
	if res.ahead != nil {
		<-res.ahead.done // nothing of the pass outlives it
		res.ahead = nil
	}
	if sw != nil && sw.endCount != nil {
		sw.endCount() // the exact count a sweep began without, read or dropped
	}
	if sw != nil {
		res.PrefetchedPages += sw.prefetch.stop()
	}
	res.Retries += r.Retries
	res.StoppedEarly = r.StoppedEarly
	res.resume = r.Resume
	if sw != nil {
		stopped := err != nil || r.StoppedEarly.Stopped()
		res.resume = sweepResume(sw, stopped)
		next := int64(0)
		if stopped {
			next = sw.position()
		}
		d.setSweepStart(t, next)
	}
	return err
}

// refreshDue counts t's due rows again every DueRefresh while its pass
// runs, when on (the metrics are served): rows_due and the cleanup lag
// keep up during a long pass, and during one the throttle holds back before
// or between its batches, which no batch's end would refresh. It counts
// from the keyset the batches have reached (setKeyset). recounted is the
// rows the pass may delete in all by the last count: deleted (the pass's
// rows so far) as it began, plus the rows it found due. stop ends it, and
// waits for a count in flight; it may be called again.
func (d *Deleter) refreshDue(ctx context.Context, t *catalog.Table, on bool, deleted *atomic.Int64) (setKeyset func(pgtype.Timestamptz), recounted func() (int64, bool), stop func()) {
	if !on {
		return func(pgtype.Timestamptz) {}, func() (int64, bool) { return 0, false }, func() {}
	}
	var mu sync.Mutex
	var from pgtype.Timestamptz
	var total int64
	counted := false
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(d.dueRefresh)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			mu.Lock()
			f := from
			mu.Unlock()
			before := deleted.Load()
			due, err := d.Due(ctx, t, f)
			if err != nil && ctx.Err() == nil {
				d.log.Warn("expiry: could not count the due rows", "table", t.Name, "error", err)
			}
			// A batch that committed during the count may or may not be in
			// it: such a count says nothing certain of the total.
			if err == nil && !due.Capped && deleted.Load() == before {
				mu.Lock()
				total, counted = before+due.Rows, true
				mu.Unlock()
			}
			if d.TestSignals.OnDueRefresh != nil {
				d.TestSignals.OnDueRefresh()
			}
		}
	}()
	var once sync.Once
	return func(k pgtype.Timestamptz) {
			mu.Lock()
			from = k
			mu.Unlock()
		}, func() (int64, bool) {
			mu.Lock()
			defer mu.Unlock()
			return total, counted
		}, func() {
			once.Do(func() { close(quit) })
			<-done
		}
}

// checkLockPrivilege fails the table's pass, before any batch, when the
// role may not read a column its statements read (catalog.CheckReadable) or
// may not lock its rows: FOR UPDATE needs UPDATE on some column. Most
// batches never lock a row, but the one that meets a row another session
// holds must, to skip it; without the privilege it would fail only then,
// long after the role was set up.
func (d *Deleter) checkLockPrivilege(ctx context.Context, t *catalog.Table) error {
	if err := catalog.CheckReadable(ctx, d.pool, t); err != nil {
		if retry.KindOf(err) == retry.KindConnection {
			return fmt.Errorf("reach the database: %w", err)
		}
		return err
	}
	if t.ThroughCitus() {
		return nil // no FOR UPDATE there (distributedBatch)
	}
	var ok bool
	if err := d.pool.QueryRow(ctx, `SELECT has_any_column_privilege($1::oid, 'UPDATE')`, t.OID).Scan(&ok); err != nil {
		if retry.KindOf(err) == retry.KindConnection {
			return fmt.Errorf("reach the database: %w", err)
		}
		return fmt.Errorf("could not read whether this role may lock rows of %s (its UPDATE privilege): %w", t.Name, err)
	}
	if !ok {
		return fmt.Errorf("permission denied: this role has no UPDATE privilege on any column of %s, and a batch that meets "+
			"a row another session holds locked needs one to skip it (SELECT ... FOR UPDATE SKIP LOCKED); "+
			"grant UPDATE (%s) on it, as deploy/sql/role.sql does (%w)", t.Name, t.Expiry.Quoted, retry.ErrPrivilege)
	}
	for _, r := range t.DeletesFirst() {
		// Its rows are locked (SKIP LOCKED) and deleted with the rows
		// they point at (delete_referencing).
		var del, lock bool
		if err := d.pool.QueryRow(ctx, `SELECT has_table_privilege($1::text::regclass, 'DELETE'), has_any_column_privilege($1::text::regclass, 'UPDATE')`, r.Ident).Scan(&del, &lock); err != nil {
			return fmt.Errorf("could not read whether this role may delete rows of %s (delete_referencing of %s): %w", r.Table, t.Name, err)
		}
		if !del || !lock {
			return fmt.Errorf("permission denied: %s deletes the rows of %s that point at its due rows (delete_referencing), and this role needs DELETE on it "+
				"and UPDATE on a column (to lock them, SKIP LOCKED): GRANT DELETE, UPDATE (%s) ON %s TO <this role> (%w)", t.Name, r.Table, r.Columns[0], r.Ident, retry.ErrPrivilege)
		}
	}
	return nil
}

// batch deletes at most size expired, uncovered rows and returns how many it
// deleted and the newest expiry among them. It first tries an optimistic
// batch, without a lock pass, under a short lock timeout; only a batch that
// meets a row another session holds locked (or a table lock it cannot get
// at once) is rolled back and run again with FOR UPDATE SKIP LOCKED.
// See docs/design/expiry.md, "One batch".
func (d *Deleter) batch(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int, res *TableResult) (int64, time.Time, float64, error) {
	if t.ThroughCitus() {
		return d.distributedBatch(ctx, t, lower, size, res)
	}
	if !d.TestSignals.SkipLockedOnly {
		n, newest, wal, err := d.batchTx(ctx, t, lower, size, res, false)
		if !steppedOver(err) {
			return n, newest, wal, err
		}
		if !d.referencesMet(t, err) {
			d.lateReference(t, err)
		}
		res.SkipLockedBatches++
		d.log.Debug("expiry: batch met a locked or newly referenced row, running it again with SKIP LOCKED", "table", t.Name, "error", err)
		if d.TestSignals.OnFallback != nil {
			d.TestSignals.OnFallback()
		}
	}
	n, newest, wal, err := d.batchTx(ctx, t, lower, size, res, true)
	if steppedOver(err) && d.referencesMet(t, err) {
		// Run without leaving referenced rows out (view): again with them.
		n, newest, wal, err = d.batchTx(ctx, t, lower, size, res, true)
	}
	if retry.Code(err) == retry.SQLStateForeignKey && len(t.References) > 0 {
		// The statement left out, or deleted, every row it saw pointing at
		// its victims: the one its check met was committed after its
		// snapshot. A new snapshot sees it; the batch loop runs the batch
		// again, with delete_referencing locking its victims first.
		d.lateReference(t, err)
		err = fmt.Errorf("%w: %w", retry.ErrLateWrite, err)
	}
	return n, newest, wal, err
}

// steppedOver reports whether a batch failed on a row it should step over,
// and runs again with SKIP LOCKED: a row another session holds locked, or
// one another table began to point at after the batch's snapshot (its
// foreign key check failed at the end of the statement; the statement run
// again sees the reference, and leaves the row: catalog.Table.Referenced).
func steppedOver(err error) bool {
	return retry.KindOf(err) == retry.KindLockTimeout || retry.Code(err) == retry.SQLStateForeignKey
}

// boundAhead is a bound read ahead, for the batch that starts at lower
// and may take size rows.
type boundAhead struct {
	lower pgtype.Timestamptz
	size  int
	done  chan struct{}
	// Set by the reading goroutine before done closes.
	b   batchBound
	cov holds.Coverage // the holds and replays the bound left out
	err error
	// committed: the batch that started the read committed, so the next
	// batch does start at lower. Set by that batch, after its COMMIT.
	committed bool
}

// readAhead starts reading, on a connection of its own, the bound of the
// next batch: the one that starts at lower (where the batch in flight
// ends) with the largest size the sizer may give it. The read takes its own
// now and holds, and no fence: the bound only limits how many rows a batch
// takes, and the batch re-reads the holds under the fence and applies them
// in its DELETE. So a bound read ahead is never less safe than one read in
// the batch, only possibly off by the rows whose cover changed meanwhile.
// See docs/design/expiry.md, "The bound, read ahead".
func (d *Deleter) readAhead(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz) *boundAhead {
	a := &boundAhead{lower: lower, size: d.sizer(t).Grown(), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.err = d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
			var err error
			a.cov = cov
			a.b, err = d.readBound(ctx, tx, t, cov, cutoff(t, now), lower, a.size, true)
			return err
		})
		if d.TestSignals.AheadRead != nil {
			d.TestSignals.AheadRead()
		}
	}()
	return a
}

// awaitAhead waits, before a batch begins its transaction, for the bound
// being read ahead: a batch never waits on another connection while it
// holds the fence and its locks.
func awaitAhead(ctx context.Context, res *TableResult) error {
	if a := res.ahead; a != nil {
		select {
		case <-a.done:
		case <-ctx.Done():
			return ctx.Err() // deleteAll waits for it before the pass ends
		}
	}
	return nil
}

// takeBound is the bound of the batch that starts at lower with size rows:
// the one read ahead when it was read for exactly this batch (the batch
// before committed and ended at lower, the size is the one it was read
// for, and the holds and replays read under the fence are the ones it left
// out), else read now. awaitAhead has waited for it.
func (d *Deleter) takeBound(ctx context.Context, tx *batchloop.Tx, t *catalog.Table, batchCutoff time.Time, lower pgtype.Timestamptz, size int, res *TableResult) (batchBound, error) {
	if f := res.fewDue; f != nil {
		// The first batch's only: the look counted from the keyset's start.
		// Its bound is the newest row due at the look's cutoff, so that the
		// range holds the rows counted and no row that fell due since; a
		// batch that begins long after the look (the throttle held it)
		// reads its bound as any other, and the pass goes on through the
		// rows that fell due meanwhile.
		res.fewDue = nil
		if lower == batchloop.NegInf && f.Rows < int64(size) && f.cov.Same(tx.Coverage) && tx.Now.Sub(f.now) < fewDueFor {
			res.boundsFromCount++
			c := cutoff(t, f.now)
			if batchCutoff.Before(c) {
				c = batchCutoff
			}
			return d.readNewest(ctx, tx.Tx, t, tx.Coverage, c, lower)
		}
	}
	if a := res.ahead; a != nil {
		res.ahead = nil
		if a.committed && a.err == nil && a.size == size && a.lower.Valid && lower.Valid && a.lower.Time.Equal(lower.Time) &&
			a.lower.InfinityModifier == lower.InfinityModifier && !a.b.instant.Time.After(batchCutoff) && a.cov.Same(tx.Coverage) {
			if a.b.ok {
				res.BoundsAhead++
			}
			return a.b, nil
		}
	}
	return d.readBound(ctx, tx.Tx, t, tx.Coverage, batchCutoff, lower, size, false)
}

// fewDueFor is how soon after the pass's look its first batch must begin
// for the look's count to give that batch its bound (takeBound).
const fewDueFor = time.Second

// The statements of a batch. %[1]s is the table, %[2]s the expiry column
// over the row alias, %[3]s the cutoff, %[4]s the keyset's lower bound,
// %[5]s and %[6]s the hold and replay predicates.
const (
	// boundSQL reads the expiries at positions size and size+1 (%[7]s is
	// size-1) of the due, uncovered rows from the keyset on, in the
	// column's own type and (%[8]s) as a timestamptz: an index-only scan
	// of the expiry index. Where fewer than size rows are due (the last
	// batch), it reads the newest of them instead: a scan of the index
	// backwards from the cutoff, which runs only then (the InitPlan of NOT
	// EXISTS is a one-time filter).
	// %[9]s is >=, or > for a bound read ahead (readAhead): the rows at
	// the keyset itself are the batch in flight's.
	boundSQL = `WITH b AS (
  SELECT %[2]s::text AS e, %[8]s AS i FROM %[1]s t
  WHERE ` + dueFromSQL + `
  ORDER BY %[2]s OFFSET %[7]s LIMIT 2
)
SELECT e, i FROM b
UNION ALL
(SELECT %[2]s::text, %[8]s FROM %[1]s t
 WHERE ` + dueFromSQL + ` AND NOT EXISTS (SELECT FROM b)
 ORDER BY %[2]s DESC LIMIT 1)`

	// newestSQL is boundSQL's second branch alone: the bound of a first
	// batch that the pass's look counted fewer rows for (readNewest).
	newestSQL = `SELECT %[2]s::text, %[8]s FROM %[1]s t
WHERE ` + dueFromSQL + `
ORDER BY %[2]s DESC LIMIT 1`

	// dueFromSQL: due at the cutoff, from the keyset on, not covered, and
	// one of the policy's rows that nothing else keeps (%[10]s,
	// catalog.Table.Deletable).
	dueFromSQL = `%[2]s <= %[3]s AND %[2]s %[9]s %[4]s AND NOT %[5]s AND NOT %[6]s AND %[10]s`

	// rangeSQL deletes the due, uncovered rows from the keyset up to the
	// bound %[7]s (exactly size rows when the bound was read, or the fewer
	// left for the last batch), in one scan of the expiry index, and
	// nothing more: the count is the command tag's, and the newest expiry
	// deleted is the bound.
	rangeSQL = `
DELETE FROM %[1]s d
WHERE %[2]s <= %[3]s AND %[2]s >= %[4]s AND %[2]s <= %[7]s AND NOT %[5]s AND NOT %[6]s AND %[13]s`

	// rangeKeysSQL is rangeSQL for a table with a permanent key table:
	// %[8]s to %[10]s return the deleted rows' expiry and write their
	// permanent keys in the same statement (permanentKeys).
	rangeKeysSQL = `
WITH gone AS (
  DELETE FROM %[1]s d
  WHERE %[2]s <= %[3]s AND %[2]s >= %[4]s AND %[2]s <= %[7]s AND NOT %[5]s AND NOT %[6]s AND %[13]s
  RETURNING %[8]s AS expiry%[9]s
)%[10]s
SELECT count(*), max(expiry), %[11]s FROM gone`

	// ctidSQL picks size rows by the expiry index and deletes them by ctid:
	// the SKIP LOCKED form (%[12]s is skipLockedClause), and the optimistic
	// form where a bound cannot be used (%[12]s empty). With
	// delete_referencing, %[14]s and %[15]s delete the rows that point at
	// the victims first (referencing); %[16]s is the rows the DELETE
	// takes (every victim, or with delete_referencing those it leaves
	// none of), and %[17]s counts the victims; once
	// a pass has met a reference committed after such a statement's
	// snapshot, its batches take lockVictimsSQL and lockedSQL instead.
	ctidSQL = `
WITH victims AS (
  SELECT t.ctid%[14]s FROM %[1]s t
  WHERE %[2]s <= %[3]s AND %[2]s >= %[4]s AND NOT %[5]s AND NOT %[6]s AND %[13]s
  ORDER BY %[2]s
  LIMIT %[7]s%[12]s
)%[15]s, gone AS (
  DELETE FROM %[1]s d WHERE d.ctid = ANY (ARRAY(SELECT %[16]s))
  RETURNING %[8]s AS expiry%[9]s
)%[10]s
SELECT count(*), max(expiry), %[11]s%[17]s FROM gone`

	skipLockedClause = `
  FOR UPDATE OF t SKIP LOCKED`

	// lockVictimsSQL is the first statement of a batch with
	// delete_referencing: it picks the victims as ctidSQL does and locks
	// them (%[12]s: SKIP LOCKED, or empty to wait under the optimistic lock
	// timeout), and leaves their ctids in a transaction-local setting
	// (victimsSetting) for lockedSQL. A victim locked FOR UPDATE makes any
	// new foreign key reference to it wait for the batch (the key's check
	// takes KEY SHARE), so the statement after it, whose snapshot is taken
	// after the locks, sees every reference it can meet. Its second column
	// keeps the list off the wire.
	lockVictimsSQL = `
WITH victims AS (
  SELECT t.ctid FROM %[1]s t
  WHERE %[2]s <= %[3]s AND %[2]s >= %[4]s AND NOT %[5]s AND NOT %[6]s AND %[13]s
  ORDER BY %[2]s
  LIMIT %[7]s
  FOR UPDATE OF t%[12]s
)
SELECT count(*), length(set_config('` + victimsSetting + `', coalesce(array_agg(ctid), '{}')::text, true)) FROM victims`

	// lockedSQL is ctidSQL over the victims lockVictimsSQL locked, by
	// ctid (a TID scan). Their own columns cannot have changed since; the
	// other tables can have, so the condition that no blocking reference
	// keeps a victim (%[13]s) is read again, in this statement's snapshot.
	// It has no parameters.
	lockedSQL = `
WITH victims AS (
  SELECT t.ctid%[14]s FROM %[1]s t
  WHERE t.ctid = ANY (current_setting('` + victimsSetting + `')::tid[]) AND %[13]s
)%[15]s, gone AS (
  DELETE FROM %[1]s d WHERE d.ctid = ANY (ARRAY(SELECT %[16]s))
  RETURNING %[8]s AS expiry%[9]s
)%[10]s
SELECT count(*), max(expiry), %[11]s FROM gone`

	// victimsSetting carries the victims' ctids from lockVictimsSQL to
	// lockedSQL, set with set_config(..., true): it lives in the batch's
	// transaction alone, so that no session state outlives it (pgbouncer's
	// transaction mode), and it never reaches a client.
	victimsSetting = "inboxkeeper.victims"

	// batchSettingsSQL: the commit does not wait for the batch's WAL to
	// reach disk. A batch lost in a crash only brings back rows that are
	// still expired, and the next pass deletes them again; a hold written
	// after the batch commits later in the WAL, so it cannot survive a
	// crash that the batch does not.
	// With $1, the range DELETE may not use a plain index scan: it reads
	// the range with a bitmap heap scan, each heap page once (scanChooser).
	batchSettingsSQL = `SELECT set_config('synchronous_commit', 'off', true),
       CASE WHEN $1 THEN set_config('enable_indexscan', 'off', true) END`
)

// batchTx runs one batch transaction: with skipLocked, the SKIP LOCKED
// form; otherwise an optimistic one, the range form when the batch's upper
// bound is clean and the ctid form without a lock pass when it is not.
func (d *Deleter) batchTx(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int, res *TableResult, skipLocked bool) (n int64, newest time.Time, wal float64, err error) {
	referenced := len(t.References) > 0
	t = d.view(t)
	lockTimeout := d.opts.LockTimeout
	if !skipLocked {
		lockTimeout = min(d.opts.LockTimeout, d.optimisticLockTimeout())
	}
	if err := awaitAhead(ctx, res); err != nil {
		return 0, time.Time{}, 0, err
	}
	tx, err := batchloop.Begin(ctx, d.pool, t.Name, batchloop.TxOptions{
		LockTimeout: lockTimeout, StatementTimeout: d.opts.StatementTimeout, IdleInTx: d.opts.IdleTimeout, Throttle: d.opts.Throttle, Clock: d.opts.Clock, Watch: d.opts.Watch,
		CachedPlans: referenced})
	if err != nil {
		return 0, time.Time{}, 0, err
	}
	defer tx.Close(ctx, &err)
	c := cutoff(t, tx.Now)
	var b batchBound
	if !skipLocked && len(t.DeletesFirst()) == 0 {
		if b, err = d.takeBound(ctx, tx, t, c, lower, size, res); err != nil {
			return 0, time.Time{}, 0, err
		}
	}
	scans := d.scans(t)
	// A table other tables reference keeps the planner's settings, and
	// its plan cache's (TxOptions.CachedPlans): their foreign keys' checks
	// are planned in the batch's session and their plans kept (maySweep).
	bitmap := b.ok && !referenced && scans.next()
	form, alias, lockClause := ctidSQL, "t", ""
	switch {
	case skipLocked:
		lockClause = skipLockedClause
	case b.ok && tiering.KeyOf(t) != nil:
		form, alias = rangeKeysSQL, "d"
	case b.ok:
		form, alias = rangeSQL, "d"
	}
	var args sqlargs.List
	holdPred, replayPred := tx.Coverage.Predicates(t, alias, &args)
	var limit string
	if b.ok {
		limit = args.Add(b.text) + "::" + t.Expiry.Type
	} else {
		limit = args.Add(size)
	}
	keysReturning, keysCTE, keysCount := tiering.DeleteKeys(t)
	pick, kids, deleted := referencing(t, "t")
	lockForm, countVictims := "", ""
	switch {
	case kids != "" && d.locksFirst(t):
		// The victims are locked first, in a statement of their own
		// (lockVictimsSQL), and deleted by the next (lockedSQL).
		form, lockForm, lockClause = lockedSQL, lockVictimsSQL, ""
		if skipLocked {
			lockClause = " SKIP LOCKED"
		}
	case kids != "":
		countVictims = ", (SELECT count(*) FROM victims)"
	}
	var newestTS pgtype.Timestamptz
	var keys, victims int64
	parts := []any{
		t.Ident, alias + "." + t.Expiry.Quoted,
		t.Expiry.Instant(args.Add(c) + "::timestamptz"),
		t.Expiry.Instant(args.Add(lower) + "::timestamptz"),
		holdPred, replayPred,
		limit,
		t.Expiry.AsTimestamptz("d"),
		keysReturning, keysCTE, keysCount, lockClause, t.Deletable(alias), pick, kids, deleted, countVictims}
	sql := fmt.Sprintf(form, parts...)
	var ahead *boundAhead
	if b.ok {
		// The next batch starts where this one ends: its bound can be
		// read while this DELETE runs.
		ahead = d.readAhead(ctx, t, b.instant)
		res.ahead = ahead
	}
	// The batch's settings and its DELETE in one round trip.
	batch := &pgx.Batch{}
	batch.Queue(batchSettingsSQL, bitmap)
	switch form {
	case rangeSQL:
		batch.Queue(sql, args.Values...).Exec(func(tag pgconn.CommandTag) error {
			n, newestTS = tag.RowsAffected(), b.instant
			return nil
		})
	case lockedSQL:
		// Both statements in the same round trip: the server runs the
		// second, with a snapshot of its own, once the first has its locks.
		batch.Queue(fmt.Sprintf(lockForm, parts...), args.Values...).QueryRow(func(row pgx.Row) error { return row.Scan(&victims, nil) })
		batch.Queue(sql).QueryRow(func(row pgx.Row) error { return row.Scan(&n, &newestTS, &keys) })
	case ctidSQL:
		scanned := []any{&n, &newestTS, &keys}
		if kids != "" {
			scanned = append(scanned, &victims)
		}
		batch.Queue(sql, args.Values...).QueryRow(func(row pgx.Row) error { return row.Scan(scanned...) })
	default:
		batch.Queue(sql, args.Values...).QueryRow(func(row pgx.Row) error { return row.Scan(&n, &newestTS, &keys) })
	}
	began := time.Now()
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return 0, time.Time{}, 0, err
	}
	took := time.Since(began)
	if d.TestSignals.BeforeCommit != nil {
		d.TestSignals.BeforeCommit(t.Name, n)
	}
	if wal, err = tx.Commit(ctx); err != nil {
		return 0, time.Time{}, 0, err
	}
	if ahead != nil {
		ahead.committed = true
	}
	res.PermanentKeys += keys
	// With delete_referencing a victim a locked row points at stays: the
	// batch is short, but more may be due (deleteAll's Exhausted).
	res.victimsShort = n < int64(size)
	if kids != "" {
		res.victimsShort = victims < int64(size) || n == 0
	}
	if b.ok {
		res.RangeBatches++
		scans.observe(bitmap, n, took)
	}
	if bitmap {
		res.BitmapBatches++
	}
	return n, newestTS.Time, wal, nil
}

// scanTrials is how many range batches of each scan a pass tries first.
const scanTrials = 2

// scanChooser picks, per table and pass, how the range DELETE reads its
// rows. Where expiry order follows the heap, the planner's index scan
// visits each page once, in order, and is the faster; where horizons
// interleave, it visits a page once per row on it, and a bitmap heap scan,
// which visits each page once, took 40% less time. The planner's
// statistics do not tell the two apart (the correlation was 1.0 and 0.96),
// so the first range batches of a pass alternate the two, and the rest of
// the pass uses the one that deleted a row in less time.
type scanChooser struct {
	mu     sync.Mutex
	trials [2]int           // index scan, bitmap heap scan
	rows   [2]int64         // rows the trials deleted
	took   [2]time.Duration // their DELETE statements' time
}

// next says whether the next range batch reads by bitmap.
func (c *scanChooser) next() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.trials[0] < scanTrials || c.trials[1] < scanTrials {
		return c.trials[1] < c.trials[0]
	}
	// Compare time per row: took[1]/rows[1] < took[0]/rows[0].
	return float64(c.took[1])*float64(c.rows[0]) < float64(c.took[0])*float64(c.rows[1])
}

func (c *scanChooser) observe(bitmap bool, n int64, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	if bitmap {
		i = 1
	}
	if c.trials[i] < scanTrials && n > 0 {
		c.trials[i]++
		c.rows[i] += n
		c.took[i] += took
	}
}

func (d *Deleter) scans(t *catalog.Table) *scanChooser {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.scanChoice[t.ID()]
}

// batchBound is where a batch of the range form ends: the expiry of its
// last row, as text in the column's own type (passed back as a parameter
// of that type, so no time zone conversion can move it) and as an instant
// (the keyset position after the batch).
type batchBound struct {
	ok      bool
	text    string
	instant pgtype.Timestamptz
}

// readBound reads the expiry of the size-th due, uncovered row from lower on,
// when a batch can end there: the row after it has a later expiry (or there
// is none), so the range up to the bound holds exactly size rows. Where
// fewer than size rows are due (the last batch), the bound is the newest
// of them: the range holds them all, fewer than size. It is not ok when
// no row is due, or when rows of the same expiry straddle the bound (a
// range would take them all, however many): such a batch goes by ctid with
// LIMIT.
//
// With size 0 it reads the newest due row only (readNewest).
func (d *Deleter) readBound(ctx context.Context, tx pgx.Tx, t *catalog.Table, cov holds.Coverage, cutoff time.Time, lower pgtype.Timestamptz, size int, ahead bool) (batchBound, error) {
	t = d.view(t)
	var args sqlargs.List
	hp, rp := cov.Predicates(t, "t", &args)
	from := ">="
	if ahead {
		from = ">"
	}
	form, offset := newestSQL, ""
	if size > 0 {
		form, offset = boundSQL, args.Add(size-1)
	}
	sql := fmt.Sprintf(form, t.Ident, "t."+t.Expiry.Quoted,
		t.Expiry.Instant(args.Add(cutoff)+"::timestamptz"), t.Expiry.Instant(args.Add(lower)+"::timestamptz"),
		hp, rp, offset, t.Expiry.AsTimestamptz("t"), from, t.Deletable("t"))
	rows, err := tx.Query(ctx, sql, args.Values...)
	if err != nil {
		return batchBound{}, err
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (batchBound, error) {
		b := batchBound{ok: true}
		return b, r.Scan(&b.text, &b.instant)
	})
	if err != nil || len(got) == 0 || (len(got) == 2 && got[0].text == got[1].text) {
		return batchBound{}, err
	}
	return got[0], nil
}

// readNewest reads the newest row due at cutoff, uncovered, from lower on
// as the bound: the first batch's, where the look counted fewer rows due
// at cutoff than it wants, so that there is no size-th row to walk to.
// Rows inserted since, already expired, are in the range too, as in any
// batch's; the holds are the batch's.
func (d *Deleter) readNewest(ctx context.Context, tx pgx.Tx, t *catalog.Table, cov holds.Coverage, cutoff time.Time, lower pgtype.Timestamptz) (batchBound, error) {
	return d.readBound(ctx, tx, t, cov, cutoff, lower, 0, false)
}

func (d *Deleter) optimisticLockTimeout() time.Duration {
	if d.TestSignals.OptimisticWait > 0 {
		return d.TestSignals.OptimisticWait
	}
	return batchloop.OptimisticLockWait
}

// readTx runs fn in a read-only transaction with the batch timeouts, so that
// counting and measuring never queue behind a lock for long either.
func (d *Deleter) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return d.readTxWith(ctx, "", fn)
}

// readTxWith is readTx at the isolation level iso ("": the server's
// default).
func (d *Deleter) readTxWith(ctx context.Context, iso pgx.TxIsoLevel, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: iso}, func(tx pgx.Tx) error {
		if _, err := (dbconn.TxSettings{LockTimeout: d.opts.LockTimeout, StatementTimeout: d.opts.StatementTimeout, IdleInTx: d.opts.IdleTimeout}).Apply(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// coverageTx runs fn in a read-only transaction (readTx) with the
// database's now and the holds and replays active then.
func (d *Deleter) coverageTx(ctx context.Context, t *catalog.Table, fn func(tx pgx.Tx, now time.Time, cov holds.Coverage) error) error {
	return d.readTx(ctx, func(tx pgx.Tx) error {
		now, err := d.now(ctx, tx)
		if err != nil {
			return err
		}
		cov, err := holds.Active(ctx, tx, t, now)
		if err != nil {
			return err
		}
		return fn(tx, now, cov)
	})
}

// counts returns, among rows expired at now, how many no hold or replay
// covers, how many a hold covers, and how many only a replay covers.
func (d *Deleter) dryRun(ctx context.Context, t *catalog.Table, res *TableResult) error {
	err := d.coverageTx(ctx, t, func(tx pgx.Tx, now time.Time, cov holds.Coverage) error {
		var args sqlargs.List
		hp, rp := cov.Predicates(t, "t", &args)
		sql := fmt.Sprintf(`SELECT count(*) FILTER (WHERE NOT %[3]s AND NOT %[4]s AND NOT %[7]s),
       count(*) FILTER (WHERE %[3]s),
       count(*) FILTER (WHERE %[4]s AND NOT %[3]s),
       count(*) FILTER (WHERE %[7]s AND NOT %[3]s AND NOT %[4]s)
FROM %[1]s t WHERE t.%[5]s <= %[2]s AND %[6]s`, t.Ident, t.Expiry.Instant(args.Add(cutoff(t, now))+"::timestamptz"), hp, rp, t.Expiry.Quoted, t.Only("t"), t.Referenced("t"))
		return tx.QueryRow(ctx, sql, args.Values...).Scan(&res.Deleted, &res.ProtectedByHolds, &res.ProtectedByReplays, &res.ProtectedByReferences)
	})
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	return nil
}

// measure fills res with what the pass left in t as of now: the rows the
// holds and replays of cov kept, the cleanup lag, the retained range and
// the bytes per key.
func (d *Deleter) measure(ctx context.Context, tx pgx.Tx, t *catalog.Table, now time.Time, cov holds.Coverage, res *TableResult) error {
	var oldestCovered pgtype.Timestamptz
	var err error
	if res.ProtectedByHolds, res.ProtectedByReplays, oldestCovered, err = countProtected(ctx, tx, t, now, cov); err != nil {
		return err
	}
	if res.resume.Valid && t.HasReferences() {
		// After the pass: the due rows it left before its keyset are the
		// ones something kept, few of them. Before it, every due row would
		// be probed, which the batches do anyway.
		if res.ProtectedByReferences, err = countReferenced(ctx, tx, t, now, cov); err != nil {
			return err
		}
		d.referencesLeft(t, res.ProtectedByReferences)
	}
	// Rows the pass skipped because another session held them locked lie
	// before res.resume: the next pass deletes them, and counts them. Before
	// the pass (the look it begins with) there is no resume yet: every row
	// counts. (Passed as it was, NULL, it matched no row, and the look
	// exported a lag of 0 at the start of every pass.)
	from := orNegInf(res.resume)
	lag, err := cleanupLag(ctx, tx, t, now, cov, from)
	if err != nil {
		return err
	}
	res.CleanupLag = lag
	if res.Oldest, res.Newest, err = retainedRange(ctx, tx, t, from); err != nil {
		return err
	}
	if oldestCovered.Valid {
		o := oldestCovered.Time.Add(t.Policy.ExpiryOffset())
		if res.Oldest == nil || o.Before(*res.Oldest) {
			res.Oldest = &o
		}
	}
	if t.ThroughCitus() {
		// The coordinator's copy of the table is empty: the shards (a
		// reference or Citus local table's one) know.
		rows, bytes, ok, err := catalog.ShardStats(ctx, tx, t.OID)
		if err != nil {
			return fmt.Errorf("measure bytes per key on the shards: %w", err)
		}
		if ok && rows > 0 {
			res.BytesPerKey = bytes / rows
		}
		return nil
	}
	// reltuples is the planner's estimate (-1 before the first ANALYZE).
	// The tuple counts are the statistics', for the VACUUM after the pass,
	// read by the functions pg_stat_user_tables reads them with: the view
	// joins pg_index and pg_namespace and aggregates, and parsing and
	// planning it took 5 to 20 ms of a new backend's first look, which is
	// every look of `once` (docs/design/expiry.md).
	err = tx.QueryRow(ctx, `SELECT CASE WHEN c.reltuples > 0 THEN pg_total_relation_size(c.oid) / c.reltuples ELSE 0 END,
       pg_stat_get_live_tuples(c.oid), pg_stat_get_dead_tuples(c.oid)
FROM pg_class c WHERE c.oid = $1`, t.OID).Scan(&res.BytesPerKey, &res.LiveTuples, &res.DeadTuples)
	if err != nil {
		return fmt.Errorf("measure bytes per key: %w", err)
	}
	return nil
}

// retainedRange is the oldest (at or after from) and newest expiry present
// (column + expires_after), read from both ends of the expiry index. The
// newest is nil only when no row has an expiry; the oldest is nil too when
// every row lies before from (rows a pass left behind it: held ones, whose
// oldest the caller reads apart).
func retainedRange(ctx context.Context, q catalog.Querier, t *catalog.Table, from pgtype.Timestamptz) (oldest, newest *time.Time, err error) {
	var o, n pgtype.Timestamptz
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT %[1]s FROM %[2]s t WHERE t.%[3]s >= %[4]s AND %[5]s ORDER BY t.%[3]s LIMIT 1),
       (SELECT %[1]s FROM %[2]s t WHERE t.%[3]s IS NOT NULL AND %[5]s ORDER BY t.%[3]s DESC LIMIT 1)`,
		t.Expiry.AsTimestamptz("t"), t.Ident, t.Expiry.Quoted, t.Expiry.Instant("$1::timestamptz"), t.Only("t")), from).Scan(&o, &n)
	if err != nil || !n.Valid {
		return nil, nil, err
	}
	// The column holds when the clock started; the expiry is offset from it.
	nt := n.Time.Add(t.Policy.ExpiryOffset())
	if !o.Valid {
		return nil, &nt, nil
	}
	ot := o.Time.Add(t.Policy.ExpiryOffset())
	return &ot, &nt, nil
}

// cleanupLag is now minus the oldest expiry among rows that are due and that
// nothing protects: how late the deleter is, not how long a legal hold has
// kept rows (that is reported as protected rows instead).
func cleanupLag(ctx context.Context, q catalog.Querier, t *catalog.Table, now time.Time, cov holds.Coverage, from pgtype.Timestamptz) (time.Duration, error) {
	var args sqlargs.List
	hp, rp := cov.Predicates(t, "t", &args)
	c := args.Add(cutoff(t, now))
	f := args.Add(from)
	sql := fmt.Sprintf(`SELECT %[1]s FROM %[2]s t WHERE t.%[3]s <= %[4]s AND t.%[3]s >= %[7]s AND NOT %[5]s AND NOT %[6]s AND %[8]s ORDER BY t.%[3]s LIMIT 1`,
		t.Expiry.AsTimestamptz("t"), t.Ident, t.Expiry.Quoted, t.Expiry.Instant(c+"::timestamptz"), hp, rp, t.Expiry.Instant(f+"::timestamptz"), t.Deletable("t"))
	var oldest time.Time
	err := q.QueryRow(ctx, sql, args.Values...).Scan(&oldest)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("measure cleanup lag: %w", err)
	}
	// The row became due at oldest + offset (expires_after), so that is
	// where lateness starts.
	return now.Sub(oldest.Add(t.Policy.ExpiryOffset())), nil
}

// referencing returns the parts of a batch's DELETE (ctidSQL, or
// lockedSQL once lockVictimsSQL locked the victims) that first delete the
// rows of the tables delete_referencing names that point at its victims,
// in the same statement: the victims' referenced columns (pick, over the
// victims' alias v); per table a CTE that locks the rows pointing at the
// victims (SKIP LOCKED, so that a row an application holds is stepped over
// and not waited for) and one that counts them a victim; the victims all
// of whose rows, in every table, were locked (whole: as many as the
// statement's snapshot shows pointing at each); per table a CTE that
// deletes the locked rows of those victims (kids); and the rows the
// DELETE of the table takes (deleted: those victims alone, from whole). A
// victim goes with all its referencing rows, in every table, or with none:
// a row held in one table keeps the victim and its rows in the others. Every part groups, joins or probes an index once per
// victim, never a row against a list of rows: a victim with thousands of
// referencing rows costs a batch time linear in them, where a set
// difference by ctid cost up to their cube (docs/design/frameworks.md,
// "References"). Without delete_referencing: no parts, and the DELETE
// takes every victim.
func referencing(t *catalog.Table, v string) (pick, kids, deleted string) {
	refs := t.DeletesFirst()
	if len(refs) == 0 {
		return "", "", "ctid FROM victims"
	}
	picked := map[string]string{} // referenced column → its name in victims
	var p, k, cols, joins, whole, del strings.Builder
	for i, r := range refs {
		var on, counted []string
		for j, col := range r.Columns {
			ref := r.Referenced[j]
			name, ok := picked[ref.Name]
			if !ok {
				name = fmt.Sprintf("rk%d", len(picked))
				picked[ref.Name] = name
				fmt.Fprintf(&p, ", %s.%s AS %s", v, ref.Quoted, name)
			}
			on = append(on, fmt.Sprintf("c.%s = v.%s", col, name))
			counted = append(counted, fmt.Sprintf("o.%s = v.%s", col, name))
		}
		// The rows locked first (SKIP LOCKED: one an application holds is
		// stepped over), with the victim each points at; then, a victim,
		// how many were locked and which.
		fmt.Fprintf(&k, `, locked%[1]d AS (
  SELECT c.ctid AS c, v.ctid AS vid FROM %[2]s c JOIN victims v ON %[3]s FOR UPDATE OF c SKIP LOCKED
), nlocked%[1]d AS (
  SELECT vid, count(*) AS n, array_agg(c) AS cs FROM locked%[1]d GROUP BY vid
)`, i, r.Ident, strings.Join(on, " AND "))
		fmt.Fprintf(&cols, ", n%[1]d.cs AS cs%[1]d", i)
		fmt.Fprintf(&joins, "\n  LEFT JOIN nlocked%[1]d n%[1]d ON n%[1]d.vid = v.ctid", i)
		// As many as the statement's snapshot shows pointing at the
		// victim: one scan of the foreign key's index.
		fmt.Fprintf(&whole, "\n    AND coalesce(n%[1]d.n, 0) = (SELECT count(*) FROM %[2]s o WHERE %[3]s)", i, r.Ident, strings.Join(counted, " AND "))
		fmt.Fprintf(&del, `, kids%[1]d AS (
  DELETE FROM %[2]s k WHERE k.ctid = ANY (ARRAY(SELECT unnest(w.cs%[1]d) FROM whole w))
)`, i, r.Ident)
	}
	// whole: the victims every one of whose rows, in every table, was
	// locked, with those rows. Only their rows are deleted, and only they
	// are: a victim goes with all its referencing rows or not at all, and
	// one a held row still points at stays with all of them.
	fmt.Fprintf(&k, `, whole AS (
  SELECT v.ctid AS vid%s FROM victims v%s
  WHERE true%s
)%s`, cols.String(), joins.String(), whole.String(), del.String())
	return p.String(), k.String(), "vid FROM whole"
}

// view is t as a batch sees it. A row another table's foreign key points
// at is rare (an anomaly in most frameworks), and leaving such rows out
// costs every batch a probe of the referencing table per row, on top of
// the foreign key's own check: so batches run without the probe, and
// without deleting referencing rows first (delete_referencing), until a
// batch meets such a row (its foreign key check fails, 23503, or waits on
// a referencing row another session holds: referencesMet), or a pass ends
// with such rows counted; from then on, until a pass ends with none left,
// with them (the table itself). Counts
// (status, rows_due, the cleanup lag) always leave such rows out. A table
// Citus plans (distributed, reference or Citus local) always goes with
// them: its windows cannot run again SKIP LOCKED.
func (d *Deleter) view(t *catalog.Table) *catalog.Table {
	if len(t.References) == 0 || t.ThroughCitus() {
		return t
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refsSeen[t.ID()] {
		return t
	}
	v := d.optimistic[t.ID()]
	if v == nil {
		c := *t
		c.References = nil
		v = &c
		d.optimistic[t.ID()] = v
	}
	return v
}

// referencesMet records that a batch over t met a row another table's
// foreign key points at (err is its failure: the key's check failed, or
// waited on a referencing row another session holds, past the lock
// timeout), when t has references: batches over t leave such rows out
// (view) until a pass ends with none left. It says whether that changed
// how they go.
func (d *Deleter) referencesMet(t *catalog.Table, err error) bool {
	if len(t.References) == 0 || t.ThroughCitus() || !steppedOver(err) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := !d.refsSeen[t.ID()]
	d.refsSeen[t.ID()] = true
	return changed
}

// referencesLeft records what a pass's end counted of t's rows other
// tables' foreign keys keep: the next pass's batches start with them left
// out when some are (view).
func (d *Deleter) referencesLeft(t *catalog.Table, n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refsSeen[t.ID()] = n > 0
	delete(d.lockFirst, t.ID()) // the next pass starts without (lateReference)
}

// lateReference records that a batch over t, which deletes the rows
// pointing at its victims (delete_referencing), failed on one committed
// after its statement's snapshot (err: 23503; the statement deleted, or
// left out, every row it saw). Until the pass ends, t's batches lock their
// victims in a statement of their own before the one that deletes
// (lockVictimsSQL): a reference begun after the locks waits for the batch,
// and one committed before them is in the next statement's snapshot. The
// locks cost every batch a write of each victim (some 5% of a pass), so a
// pass pays them only once an application has raced it
// (docs/design/frameworks.md, "References").
func (d *Deleter) lateReference(t *catalog.Table, err error) {
	if retry.Code(err) != retry.SQLStateForeignKey || len(t.DeletesFirst()) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lockFirst[t.ID()] = true
}

// locksFirst says whether t's batches lock their victims first
// (lateReference).
func (d *Deleter) locksFirst(t *catalog.Table) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lockFirst[t.ID()]
}
