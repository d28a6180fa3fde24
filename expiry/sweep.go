package expiry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// The sweep: a pass in physical order.
//
// Expiry-ordered batches read a heap page once per batch that has a row on
// it. Where expiry order follows the heap that is once a page; where the
// due rows of every expiry lie scattered over the whole heap (several
// retention horizons, in steady state) a page holds rows of nearly every
// batch and is read and dirtied tens of times a pass. A sweep deletes the
// due rows of one slice of the heap a batch instead:
//
//	DELETE FROM t WHERE ctid >= '(a,0)' AND ctid < '(b,0)' AND e <= $cutoff AND NOT <covered>
//
// (a TID Range Scan), slice after slice, so that each page is read once a
// pass. A slice is sized from the batch size and the density of due rows
// that a sample of the heap measured at the start of the pass, corrected
// by what the batches before it found. Which of the two a pass takes is
// decided per table and pass from the same sample (chooseSweep).
// See docs/design/expiry.md, "The sweep".

// sampleBlocks is about how many heap pages the sample at the start of a
// pass reads (TABLESAMPLE SYSTEM, whole pages at random), on a table of
// sampleRowsPerPage rows a page or fewer. What the estimate needs is rows,
// not pages (the due rows per segment of the heap, and the pages they lie
// on), so on a table of narrower rows the sample reads about sampleRows
// rows instead, and at least minSampleBlocks pages: 2,048 pages of 157
// narrow rows were 320,000 rows sent to the daemon, 260 to 300 ms before
// the first batch (docs/design/expiry.md).
const (
	sampleBlocks      = 2048
	sampleRowsPerPage = 20
	sampleRows        = sampleBlocks * sampleRowsPerPage
	minSampleBlocks   = 256
)

// samplePages is how many pages the sample reads of a table whose pages
// hold perPage rows each, as pg_class last estimated it (0: not estimated
// yet, and the sample reads sampleBlocks pages).
func samplePages(perPage float64) float64 {
	if perPage <= sampleRowsPerPage {
		return sampleBlocks
	}
	return max(minSampleBlocks, math.Ceil(sampleRows/perPage))
}

// segmentPages is how many of the sample's pages make one segment of the
// density map: about 64 pages of sampleRowsPerPage rows (a page's count of
// due rows varies; 1,280 rows predict a slice within a few percent), fewer
// where pages hold more rows, and at least 8.
func segmentPages(perPage float64) float64 {
	if perPage <= sampleRowsPerPage {
		return 64
	}
	return max(8, math.Ceil(64*sampleRowsPerPage/perPage))
}

// minSweepPages: a table smaller than this is deleted in expiry order,
// whatever its layout: a few pages cost little either way.
const minSweepPages = 64

// sweepSettingsSQL: a sweep batch reads its slice with a TID Range Scan and
// nothing else (the planner might otherwise walk the whole due range of the
// expiry index for every slice), and, like every batch, commits without
// waiting for the disk (batchSettingsSQL). Without JIT: a plan the
// settings force onto a disabled node costs 1e10, past jit_above_cost, and
// compiling it took 25 to 300 ms (docs/development.md).
const sweepSettingsSQL = `SELECT set_config('synchronous_commit', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('enable_indexscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true)`

// The statements of a sweep batch: %[1]s is the table, %[2]s the slice
// (a ctid range), %[3]s the due predicate (cutoff, holds and replays).
const (
	sweepSQL = `
DELETE FROM %[1]s d WHERE %[2]s AND %[3]s`

	// sweepKeysSQL writes the deleted rows' permanent keys in the same
	// statement (permanentKeys: %[4]s to %[6]s).
	sweepKeysSQL = `
WITH gone AS (
  DELETE FROM %[1]s d WHERE %[2]s AND %[3]s
  RETURNING 1 AS one%[4]s
)%[5]s
SELECT count(*), %[6]s FROM gone`

	// sweepVictimsSQL picks the slice's rows first: the fallback of a slice
	// that met a locked row (%[10]s the lock clause: the rows of the slice
	// that no other session holds, locked first), and the form of a table
	// whose referencing rows go first (referencing: %[7]s and %[8]s; %[9]s
	// the rows the DELETE takes).
	sweepVictimsSQL = `
WITH victims AS (
  SELECT d.ctid%[7]s FROM %[1]s d WHERE %[2]s AND %[3]s%[10]s
)%[8]s, gone AS (
  DELETE FROM %[1]s d WHERE d.ctid = ANY (ARRAY(SELECT %[9]s))
  RETURNING 1 AS one%[4]s
)%[5]s
SELECT count(*), %[6]s FROM gone`
)

// sampledBlock is one heap page the sample read: how many rows it holds,
// and the expiries (Unix seconds) of those due and uncovered.
type sampledBlock struct {
	block  int64
	tuples int64
	due    []float64
}

// sweepEstimate is what the sample says about a pass.
type sweepEstimate struct {
	// Pages a pass in expiry order would read: per page, the batches that
	// have a row on it (the bitmap heap scan reads a page once a batch).
	expiryVisits float64
	// Pages a sweep would read: up to the last page with a due row when
	// the count of due rows stops short of its cap (the sweep stops once it
	// has deleted them all), else the whole heap.
	sweepPages float64
	// Rows a sampled page holds, on average.
	tuplesPerPage float64
	// The due rows, estimated.
	due float64
	// Due rows per page, per segment of segLen pages (from block 0).
	density []float64
	segLen  int64
}

// Relative costs, fitted to the server CPU of bench/expiry's layouts on
// its machine (2 cores, PostgreSQL 15, the table in the OS cache; see
// docs/design/expiry.md, "The sweep"): reading a page in a sweep and
// testing each row on it, a bitmap heap scan's visit of a page for the
// rows of one batch, and the expiry index entries a row costs in expiry
// order (the bound, then the DELETE's scan). Deleting a row costs the same
// either way and is left out. costVisit was 4 at first; fitted to the
// differences between the two ways (what they do not share) it is about 12,
// and at 4 a steady-state pass of 5 batches of 20,000 rows, where the two
// estimates met, went in expiry order in one rep of three at 0.46 of the
// unbounded DELETE, against 0.65 and 0.80 swept (docs/design/expiry.md).
const (
	costSweepPage  = 5.0
	costSweepTuple = 0.85
	costVisit      = 12.0
	costIndexRow   = 1.6
)

// prefetchedSweep scales a sweep's estimate when the prefetcher reads its
// pages ahead (Options.Prefetch): the weights above are server CPU, and
// the prefetcher moves the reading of each page from the OS cache into
// shared buffers off the deleting backend, onto a second one. With it the
// chooser weighs the pass's wall time, at more server CPU; without it,
// server CPU as before (docs/design/expiry.md, "The chooser with the
// prefetcher").
const prefetchedSweep = 0.625

// estimateSweep reads the sample: blocks are the pages it read (frac of the
// heap's nblocks pages, at random); start is the page a sweep would start
// at; sizes are the batch sizes a pass in expiry order would take, in order
// (the last one repeats).
func estimateSweep(blocks []sampledBlock, frac float64, nblocks, start int64, sizes []int) sweepEstimate {
	e := sweepEstimate{segLen: 1}
	if frac <= 0 || nblocks <= 0 {
		return e
	}
	var all []float64
	var tuples int64
	for _, b := range blocks {
		all = append(all, b.due...)
		tuples += b.tuples
	}
	if len(blocks) > 0 {
		e.tuplesPerPage = float64(tuples) / float64(len(blocks))
	}
	slices.Sort(all)
	e.due = float64(len(all)) / frac
	// The count stops at DueCap: a sweep of more rows cannot know when it
	// has deleted them all.
	capped := e.due > DueCap
	// The density map: segments of segmentPages sampled pages.
	e.segLen = max(1, int64(math.Ceil(segmentPages(e.tuplesPerPage)/frac)))
	segs := (nblocks + e.segLen - 1) / e.segLen
	e.density = make([]float64, segs)
	// Per page the sample read: the number of pages it reads varies more
	// than their rows do. An empty page holds no row to show that it was
	// read, which makes the density err on the high side, and the slices
	// short.
	read := make([]int, segs)
	for _, b := range blocks {
		if s := b.block / e.segLen; s < segs {
			e.density[s] += float64(len(b.due))
			read[s]++
		}
	}
	for s := range e.density {
		e.density[s] /= float64(max(1, read[s]))
	}
	if len(all) == 0 {
		e.sweepPages = float64(nblocks)
		return e
	}
	// Batch ends in rank space: batch j takes the ranks below ends[j].
	var ends []float64
	sum := 0.0
	for i := 0; sum < e.due; i++ {
		sum += float64(sizes[min(i, len(sizes)-1)])
		ends = append(ends, sum)
	}
	last := int64(-1) // the last page with a due row, in sweep order
	visits := 0
	for _, b := range blocks {
		if len(b.due) == 0 {
			continue
		}
		seen := map[int]bool{}
		for _, x := range b.due {
			// The row's rank among all due rows, from its rank in the sample.
			i := sort.SearchFloat64s(all, x)
			r := (float64(i) + 0.5) / float64(len(all)) * e.due
			seen[sort.Search(len(ends), func(j int) bool { return ends[j] > r })] = true
		}
		visits += len(seen)
		last = max(last, (b.block-start+nblocks)%nblocks)
	}
	e.expiryVisits = float64(visits) / frac
	e.sweepPages = float64(nblocks)
	if !capped {
		e.sweepPages = min(float64(nblocks), float64(last+1)+1/frac)
	}
	return e
}

// chooseSweep says whether a pass should sweep: when the sample predicts
// that reading every page up to the last due row once, testing each of its
// rows, costs less than expiry order's page visits and index walks (due
// rows scattered, so that expiry order visits pages many times over; or
// every row of the due pages due, where both ways read each page once but
// a sweep walks no index), and the table is large enough and its pages
// hold few enough due rows for slices of about a batch (a slice is at
// least a page). Where pages hold a few due rows among many that are not,
// in runs of the heap, expiry order costs less.
//
// With prefetch (the prefetcher on), the sweep's side is weighed at
// prefetchedSweep of its CPU.
func (e sweepEstimate) chooseSweep(nblocks int64, firstBatch int, prefetch bool) bool {
	if nblocks < minSweepPages || e.due < 2*float64(firstBatch) || e.sweepPages <= 0 {
		return false
	}
	if e.due/e.sweepPages > float64(firstBatch)/4 {
		return false // a page would hold more than a quarter of a batch
	}
	sweep, expiry := e.costs(prefetch)
	return sweep < expiry
}

// costs are the two ways' estimates, in the weights' units.
func (e sweepEstimate) costs(prefetch bool) (sweep, expiry float64) {
	sweep = e.sweepPages * (costSweepPage + costSweepTuple*e.tuplesPerPage)
	if prefetch {
		sweep *= prefetchedSweep
	}
	return sweep, e.expiryVisits*costVisit + e.due*costIndexRow
}

// sweep is the state of one sweep pass over a table.
type sweep struct {
	nblocks int64 // heap pages when the pass began
	start   int64 // the page the pass starts at; it wraps around to it
	// cutoff is the cutoff of the due count: no batch of the pass deletes
	// a row that expired after it, so that the rows the pass deletes are
	// among the ones counted.
	cutoff time.Time
	// cov are the holds and replays of the count: a batch leaves their rows
	// too, with its own (so a hold released during the pass keeps its rows
	// until the next pass).
	cov holds.Coverage
	// counted says, once the count is in, how many rows were due, and
	// whether that is all of them (it stops at DueCap); the pass stops when
	// it has deleted as many. Nil: never (tests).
	counted func() (rows int64, ok bool)
	// awaitCount, when set (only for a sweep from page 0, whose map does
	// not wrap around), waits for a count the sweep began without
	// (counted says ok false until it is in): exhausted calls it once the
	// sweep has passed the density map's last due segment, where a slice
	// with nothing on the map ahead would read on. endCount drops it, or
	// waits for it, when the pass ends.
	awaitCount, endCount func()
	est                  sweepEstimate
	// prefetch reads the next slices' pages while one deletes (nil:
	// Options.Prefetch is off, or no slice has begun yet).
	prefetch *prefetcher

	mu        sync.Mutex
	done      int64 // pages swept, in sweep order from start
	found     int64 // rows the slices deleted
	predicted float64
	// perPage is what a page of the slices so far took (an average that
	// halves the weight of the older ones at each slice); hot and cold
	// what a page the prefetcher had read took, and one it had not
	// (pageCosts). 0: not measured yet.
	perPage, hot, cold time.Duration
	target             time.Duration
	// left is the rows counted and not yet found that sized the slice
	// last taken (0: a batch sized it), and shortLast how many slices so
	// sized came back short in a row: the next wants the rows left times
	// two to that power (slice).
	left, shortLast int64
}

// factor corrects the density map by what the slices so far found, against
// what it predicted for them (within a factor of four).
func (s *sweep) factor() float64 {
	if s.predicted <= 0 {
		return 1
	}
	return max(0.25, min(4, (float64(s.found)+1)/(s.predicted+1)))
}

// exhausted is batchloop.Loop.Exhausted for a sweep pass.
func (s *sweep) exhausted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done >= s.nblocks {
		return true
	}
	if s.counted == nil {
		return false
	}
	if s.awaitCount != nil && s.done >= (s.lastMapped()+1)*s.est.segLen {
		s.mu.Unlock()
		s.awaitCount()
		s.mu.Lock()
	}
	rows, ok := s.counted()
	return ok && s.found >= rows
}

// lastMapped is the density map's last segment with due rows, -1 when it
// has none.
func (s *sweep) lastMapped() int64 {
	last := int64(len(s.est.density)) - 1
	for last >= 0 && s.est.density[last] <= 0 {
		last--
	}
	return last
}

// position is where the sweep has got to, as a page number.
func (s *sweep) position() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return (s.start + s.done) % s.nblocks
}

// slice is the next slice, [a, b) in page numbers, for a batch of about
// size rows: it ends where the density map, corrected by what the slices
// so far found (factor), predicts size rows, or the rows counted and not
// yet found when fewer, at the wrap-around point, or after as many pages
// as fit in the batch target at the time a page has taken. mapped is what
// the map alone predicts for it.
func (s *sweep) slice(size int) (a, b int64, mapped float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a = (s.start + s.done) % s.nblocks
	end := s.nblocks // the slice does not wrap
	if a < s.start {
		end = s.start
	}
	maxPages := int64(size) // before the first slice: as if a page held at least one due row
	if s.perPage > 0 {
		maxPages = s.fit(s.prefetch.ready(a, s.nblocks))
	}
	end = min(end, a+maxPages)
	rows := float64(size)
	s.left = 0
	if s.counted != nil {
		// The last slice ends where the map puts the last counted row,
		// not a batch further on. Where the map put more rows than the
		// heap holds (at the edge of the due rows, where their density
		// falls within a segment), it comes back short, and the rows left
		// lie further on: a slice after one that came back short wants
		// twice the rows left (four times after two, and so on, never
		// more than a batch), rather than the few still left, which the
		// map would place too early again (a tail of 6 to 11 slices of a
		// few rows each, docs/design/expiry.md, "The last slices").
		if counted, ok := s.counted(); ok && float64(counted-s.found) < rows {
			s.left = counted - s.found
			rows = min(rows, float64(s.left)*math.Exp2(float64(min(s.shortLast, 20))))
		}
	}
	want := rows / s.factor()
	// Past the map's last segment with due rows a slice that has some
	// stops: it went on to the batch target, through 2,800 to 5,300 pages
	// of nothing due on bench/expiry's steady-state layout at -rows
	// 1000000, a sixth of the pass's pages. A slice with nothing on the map
	// ahead reads on: the rows counted and not yet found lie there.
	lastSeg := s.lastMapped()
	b = a
	for b < end && mapped < want {
		seg := b / s.est.segLen
		if mapped > 0 && seg > lastSeg {
			break
		}
		segEnd := min(end, (seg+1)*s.est.segLen)
		rate := 0.0
		if seg < int64(len(s.est.density)) {
			rate = s.est.density[seg]
		}
		if rate <= 0 {
			b = segEnd
			continue
		}
		pages := min(segEnd-b, max(1, int64(math.Ceil((want-mapped)/rate))))
		mapped += float64(pages) * rate
		b += pages
	}
	return a, max(b, a+1), mapped
}

// fit is how many pages from the slice's start fit in the batch target,
// when the prefetcher has read ready of them: those at what a page read
// ahead took, the others at what a page not read ahead took. A slice sized
// by the pages read ahead alone took 230 to 250 ms where the prefetcher
// had fallen behind by a third of it (the target 200 ms), and, once, 416
// ms; a page not read ahead took about 2.7 times one that was, on
// bench/expiry's steady state (docs/design/expiry.md, "Slices the
// prefetcher has not read").
func (s *sweep) fit(ready int64) int64 {
	hot, cold := s.pageCosts()
	if ready > 0 && time.Duration(ready)*hot >= s.target {
		return max(1, int64(s.target/hot))
	}
	if ready <= 0 {
		return max(1, int64(s.target/cold))
	}
	return ready + int64((s.target-time.Duration(ready)*hot)/cold)
}

// pageCosts is what a page read ahead and one not read ahead take, as
// measured so far: where one of them is not measured yet, what a page of
// the slices took (perPage); a page not read ahead never counts as
// cheaper than one read ahead.
func (s *sweep) pageCosts() (hot, cold time.Duration) {
	hot, cold = s.hot, s.cold
	if hot == 0 {
		hot = s.perPage
	}
	if cold == 0 {
		cold = s.perPage
	}
	return hot, max(hot, cold)
}

// swept records a committed slice: the pages it covered, the rows it
// deleted against the rows the map predicted, how long its statement
// took, and how many of its pages the prefetcher had read before it
// began.
func (s *sweep) swept(a, b int64, n int64, mapped float64, took time.Duration, ready int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done += b - a
	s.found += n
	s.predicted += mapped
	if s.left > 0 && n < s.left {
		s.shortLast++
	} else {
		s.shortLast = 0
	}
	pages := b - a
	s.perPage = average(s.perPage, took/time.Duration(pages))
	switch cold := pages - ready; {
	case cold*10 <= pages:
		// Read ahead (nine pages in ten or more): what a page read ahead
		// takes.
		s.hot = average(s.hot, took/time.Duration(pages))
	case cold*4 >= pages:
		// A quarter or more not read ahead: what those took, past what the
		// others would have at what a page read ahead takes.
		hot, _ := s.pageCosts()
		if s.hot == 0 {
			hot = 0 // nothing read ahead measured yet: the slice's pages alike
		}
		rest := took - time.Duration(pages-cold)*hot
		s.cold = average(s.cold, max(rest/time.Duration(cold), hot))
	}
}

// average halves the weight of what was measured before (0: nothing).
func average(before, now time.Duration) time.Duration {
	if before == 0 {
		return now
	}
	return (before + now) / 2
}

// startSweep decides, before the first batch, whether the pass over t
// sweeps the heap (nil: expiry order), from due, the count the pass began
// with (look): a table that may sweep, with at least two batches due (a
// daemon that keeps up has fewer, and reads no sample), is sampled at the
// count's now and under its holds and replays; the sample read beside the
// count (sampleBeside), when there is one, is that sample. The sweep stops
// once it has deleted as many rows as were counted, when the count was
// not capped: where the look's count stopped at its bound, the exact count
// read beside it (exactAhead), which goes on beside the slices (a sweep
// that starts at page 0) or which the sweep waits for before its first
// slice (one that starts where the last stopped); a pass in expiry order
// drops it. It returns the sweep and the rows the pass expects to delete
// (Progress.Estimate): the exact count when the sweep waited for it, else
// the sample's estimate.
func (d *Deleter) startSweep(ctx context.Context, t *catalog.Table, due Due, beside *sampleAhead) (*sweep, int64) {
	if !d.maySweep(t) || due.now.IsZero() {
		beside.drop()
		return nil, due.Rows
	}
	forced := d.opts.Strategy == StrategySweep
	if due.Rows < int64(2*d.sizer(t).Size()) && !due.Capped && !due.bounded && !forced {
		beside.drop() // not needed: no batch waits for it
		return nil, due.Rows
	}
	sw, estimated := d.planSweep(ctx, t, due.now, due.cov, beside)
	if sw == nil {
		if !due.bounded {
			return nil, due.Rows
		}
		// Expiry order ends on a short batch, and needs no exact count.
		due.exact.drop()
		return nil, max(due.Rows, int64(math.Round(estimated)))
	}
	due.exact.release() // the sample is read
	rows, capped := due.Rows, due.Capped
	if due.bounded && sw.start == 0 && due.exact.snapshotted() {
		// The slices need the count only to stop, at the end of the map:
		// they begin once it has its snapshot, older than their commits,
		// and it goes on beside them (docs/design/expiry.md, "The sweep
		// beside its count"). A sweep that starts half way, where the
		// last one stopped, waits for it: its map wraps around.
		var once sync.Once
		sw.counted = func() (int64, bool) {
			n, capped, ok := due.exact.ready()
			if ok {
				once.Do(func() { d.exportDue(t, Due{Rows: n, Capped: capped, Lag: due.Lag}) })
			}
			return n, ok && !capped
		}
		var warn sync.Once
		sw.awaitCount = func() {
			if _, _, err := due.exact.take(); err != nil && ctx.Err() == nil {
				// As when the sweep waits for it before its first slice.
				warn.Do(func() { d.warnUncounted(t, err) })
			}
		}
		sw.endCount = func() {
			due.exact.drop()
			sw.counted()
		}
		return sw, max(due.Rows, int64(math.Round(estimated)))
	}
	if due.bounded {
		var err error
		if rows, capped, err = due.exact.take(); err != nil {
			// Without the count the sweep reads to the end of its heap, as
			// when the count is capped.
			if ctx.Err() == nil {
				d.warnUncounted(t, err)
			}
			rows, capped = max(due.Rows, int64(math.Round(estimated))), true
		} else {
			d.exportDue(t, Due{Rows: rows, Capped: capped, Lag: due.Lag})
		}
	}
	sw.counted = func() (int64, bool) { return rows, !capped }
	return sw, rows
}

// warnUncounted says that the exact count a sweep stops on failed: the
// sweep reads on to the end of the heap, as when the count is capped.
func (d *Deleter) warnUncounted(t *catalog.Table, err error) {
	d.log.Warn("expiry: could not count the due rows; this sweep reads the whole heap", "table", t.Name, "error", err)
}

// maySweep: a pass over t may sweep (no ctid through Citus).
//
// Nor a table other tables reference by foreign key: a sweep turns the
// planner's scans off for its slices, and each key's check of a deleted row
// is planned in the slice's session, and its plan kept for the session: a
// check planned without its index took 44 us a row, against 28 us
// (docs/design/frameworks.md), in every batch after it.
func (d *Deleter) maySweep(t *catalog.Table) bool {
	return !t.ThroughCitus() && d.opts.Strategy != StrategyExpiry && len(t.References) == 0
}

// lookBound is how many due rows the look a pass begins with counts at
// most (0: every one, up to DueCap). Where the heap's sample decides the
// pass (maySweep), the count needs to say only whether two batches are due
// or more (startSweep): past that, the sample says whether the pass
// sweeps, a sweep stops on the exact count read beside the look
// (exactAhead), and a pass in expiry order ends on a short batch. Counting
// every due row before the first batch took 170 to 210 ms of a 2 s pass on
// bench/expiry's append-ordered layout, a million index entries
// (docs/design/expiry.md). A pass whose rows_due may be read while it runs
// (Options.LiveDue), or that always sweeps, counts them all first.
func (d *Deleter) lookBound(t *catalog.Table) int64 {
	if !d.maySweep(t) || d.opts.LiveDue || d.opts.Strategy == StrategySweep {
		return 0
	}
	return int64(2 * d.sizer(t).Size())
}

// sampleAhead is the heap's sample read beside the count a pass begins
// with, on a connection of its own.
type sampleAhead struct {
	*aside
	blocks  []sampledBlock // set before done closes
	frac    float64
	nblocks int64
}

// sampleBeside says whether the sample of t is read beside the count a
// pass begins with, before the count says whether the pass needs it: on a
// table that may sweep, when the pass before found at least two batches
// due, or there was none. The sample, about 2,048 pages, took as long as
// the count of 100,000 due rows and more (docs/design/expiry.md), and a
// pass that samples waited for both before its first batch; beside the
// count, on a second backend, it waits for the longer. A daemon that keeps
// up reads none after its first pass; one that falls behind reads it after
// the count for one pass, then beside it.
func (d *Deleter) sampleBeside(t *catalog.Table) bool {
	if !d.maySweep(t) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	last, ok := d.lastDue[t.ID()]
	return !ok || last < 0 || last >= int64(2*d.sizer(t).Size())
}

// noteDue records the rows due at the start of t's pass, for the next
// pass's sampleBeside (bounded: at least two batches; -1 says as much).
func (d *Deleter) noteDue(t *catalog.Table, due Due, err error) {
	n := due.Rows
	if err != nil || due.Capped || due.bounded {
		n = -1
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastDue[t.ID()] = n
}

// readSampleAhead starts reading the sample of t at now under cov, as the
// count does, on a connection of its own.
func (d *Deleter) readSampleAhead(ctx context.Context, t *catalog.Table, now time.Time, cov holds.Coverage) *sampleAhead {
	a := &sampleAhead{}
	a.aside = startAside(ctx, func(ctx context.Context, side *aside) error {
		var err error
		a.blocks, a.frac, a.nblocks, err = d.sample(ctx, t, cutoff(t, now), cov, side)
		if d.TestSignals.OnSample != nil {
			d.TestSignals.OnSample(true, err)
		}
		return err
	})
	return a
}

// drop stops the sample if it is still being read, and waits for it.
func (a *sampleAhead) drop() {
	if a != nil {
		a.aside.drop(nil)
	}
}

// take waits for the sample and returns it; an error when it could not be
// read.
func (a *sampleAhead) take() ([]sampledBlock, float64, int64, error) {
	if err := a.wait(); err != nil {
		return nil, 0, 0, err
	}
	return a.blocks, a.frac, a.nblocks, nil
}

// sample reads about samplePages pages of t at random (by the rows a page
// holds, as pg_class estimates it) and what is due on them at the cutoff,
// under cov.
// ahead, when not nil, is the sample read beside the count, which its
// drop may stop.
func (d *Deleter) sample(ctx context.Context, t *catalog.Table, cutoff time.Time, cov holds.Coverage, ahead *aside) (blocks []sampledBlock, frac float64, nblocks int64, err error) {
	t = d.view(t)
	err = d.readTx(ctx, func(tx pgx.Tx) error {
		defer ahead.close(ctx)
		if !ahead.open(tx.Conn()) {
			return errDropped
		}
		var perPage float64
		if err := tx.QueryRow(ctx, `SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint,
       CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 0 END
FROM pg_class c WHERE c.oid = $1::oid`, t.OID).Scan(&nblocks, &perPage); err != nil || nblocks == 0 {
			return err
		}
		frac = min(1, samplePages(perPage)/float64(nblocks))
		if !ahead.open(tx.Conn()) { // a cancel request between statements is lost
			return errDropped
		}
		var args sqlargs.List
		hp, rp := cov.Predicates(t, "t", &args)
		// A row each, grouped by page here: grouped by the server, the page
		// number (ctid::text::point) and the aggregate's states cost twice
		// the scan (the planner takes every row for a group of its own, and
		// the hash aggregate spills to disk), 100 ms for 2,048 pages
		// (docs/design/expiry.md). A TABLESAMPLE SYSTEM scan returns a
		// page's rows together.
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT t.ctid,
       CASE WHEN t.%[2]s <= %[3]s AND NOT %[4]s AND NOT %[5]s AND %[8]s THEN extract(epoch FROM %[1]s)::float8 END
FROM %[6]s t TABLESAMPLE SYSTEM (%[7]s)`, t.Expiry.AsTimestamptz("t"), t.Expiry.Quoted, t.Expiry.Instant(args.Add(cutoff)+"::timestamptz"), hp, rp, t.Ident,
			args.Add(frac*100)+"::float8", t.Deletable("t")), args.Values...)
		if err != nil {
			return err
		}
		defer rows.Close()
		at := map[int64]int{} // a page's place in blocks
		var tid pgtype.TID
		var due pgtype.Float8
		for rows.Next() {
			if err := rows.Scan(&tid, &due); err != nil {
				return err
			}
			p := int64(tid.BlockNumber)
			i, ok := at[p]
			if !ok {
				i = len(blocks)
				at[p] = i
				blocks = append(blocks, sampledBlock{block: p})
			}
			blocks[i].tuples++
			if due.Valid {
				blocks[i].due = append(blocks[i].due, due.Float64)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("sample the heap: %w", err)
	}
	return blocks, frac, nblocks, nil
}

// expirySizes are the batch sizes a pass in expiry order would take from
// the size the next batch has: growing by at most 1.2x a batch up to the
// ceiling, as the sizer lets them when batches are fast.
func (d *Deleter) expirySizes(t *catalog.Table) []int {
	s := d.sizer(t).Size()
	sizes := []int{s}
	if z := d.opts.Sizing; z != nil {
		for s < z.Max && len(sizes) < 1000 {
			s = min(z.Max, max(s+1, int(float64(s)*1.2)))
			sizes = append(sizes, s)
		}
	}
	return sizes
}

// planSweep reads the sample (or takes the one read beside the count) and
// decides whether the pass sweeps, at the count's now and under its holds
// and replays; nil: expiry order. due is the sample's estimate of the due
// rows, 0 when there is none.
func (d *Deleter) planSweep(ctx context.Context, t *catalog.Table, now time.Time, cov holds.Coverage, beside *sampleAhead) (sw *sweep, due float64) {
	c := cutoff(t, now)
	var blocks []sampledBlock
	var frac float64
	var nblocks int64
	err := errors.New("not read beside the count")
	if beside != nil {
		blocks, frac, nblocks, err = beside.take()
	}
	if err != nil && ctx.Err() == nil {
		blocks, frac, nblocks, err = d.sample(ctx, t, c, cov, nil)
		if d.TestSignals.OnSample != nil {
			d.TestSignals.OnSample(false, err)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("expiry: could not sample the table; this pass goes in expiry order", "table", t.Name, "error", err)
		}
		return nil, 0
	}
	if frac > 0 {
		n := 0
		for _, b := range blocks {
			n += len(b.due)
		}
		due = float64(n) / frac
	}
	forced := d.opts.Strategy == StrategySweep
	if nblocks == 0 || (nblocks < minSweepPages && !forced) {
		return nil, due // a table of a few pages reads little twice
	}
	start := d.sweepStart(t)
	if start >= nblocks {
		start = 0
	}
	est := estimateSweep(blocks, frac, nblocks, start, d.expirySizes(t))
	choose := est.chooseSweep(nblocks, d.sizer(t).Size(), d.opts.Prefetch)
	sweepCost, expiryCost := est.costs(d.opts.Prefetch)
	d.log.Debug("expiry: pass plan", "table", t.Name, "sweep", choose, "due", int64(est.due), "pages", nblocks,
		"sweep_pages", int64(est.sweepPages), "expiry_visits", int64(est.expiryVisits), "tuples_per_page", est.tuplesPerPage,
		"sweep_cost", int64(sweepCost), "expiry_cost", int64(expiryCost), "prefetch", d.opts.Prefetch)
	if !choose && !forced {
		return nil, due
	}
	target := 200 * time.Millisecond
	if d.opts.Sizing != nil && d.opts.Sizing.Target > 0 {
		target = d.opts.Sizing.Target
	}
	return &sweep{nblocks: nblocks, start: start, cutoff: c, cov: cov, est: est, target: target}, due
}

// sweepStart is the page the next sweep of t starts at: where the last one
// stopped early (RUN_TIME, the lease, the throttle), so that passes cut
// short still cover the whole heap in turn; 0 after a sweep that finished.
func (d *Deleter) sweepStart(t *catalog.Table) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sweepFrom[t.ID()]
}

func (d *Deleter) setSweepStart(t *catalog.Table, page int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepFrom[t.ID()] = page
}

// sweepBatch deletes the due, uncovered rows of the next slice of the heap:
// about size of them. Like batch, it runs optimistically, without a lock
// pass, under a short lock timeout, and runs the slice again with SKIP
// LOCKED when it meets a row another session holds.
func (d *Deleter) sweepBatch(ctx context.Context, t *catalog.Table, s *sweep, size int, res *TableResult) (int64, time.Time, float64, error) {
	a, b, predicted := s.slice(size)
	if s.awaitCount != nil && b > s.lastMapped()*s.est.segLen {
		// The slice reaches the map's last segment with due rows: the last
		// slice is sized by the rows counted and not yet found, as when
		// the sweep waited for its count before the first slice, and none
		// is taken once they are all found.
		if _, ok := s.counted(); !ok {
			s.awaitCount()
			if s.exhausted() {
				return 0, s.cutoff, 0, nil
			}
			a, b, predicted = s.slice(size)
		}
	}
	if d.opts.Prefetch {
		if s.prefetch == nil {
			s.prefetch = startPrefetch(ctx, d.pool, t, min(d.opts.LockTimeout, d.optimisticLockTimeout()), d.opts.StatementTimeout,
				d.log.Debug, d.TestSignals.OnPrefetch)
		}
		s.prefetch.want(s.prefetchWindow(a, b))
	}
	ready := s.prefetch.ready(a, b)
	skipLocked := d.TestSignals.SkipLockedOnly
	n, wal, took, err := d.sweepTx(ctx, t, s, a, b, res, skipLocked)
	if steppedOver(err) && (!skipLocked || d.referencesMet(t, err)) {
		d.referencesMet(t, err)
		res.SkipLockedBatches++
		d.log.Debug("expiry: slice met a locked row, running it again with SKIP LOCKED", "table", t.Name, "error", err)
		if d.TestSignals.OnFallback != nil {
			d.TestSignals.OnFallback()
		}
		n, wal, took, err = d.sweepTx(ctx, t, s, a, b, res, true)
	}
	if err != nil {
		return 0, time.Time{}, 0, err
	}
	s.swept(a, b, n, predicted, took, ready)
	res.SweepBatches++
	d.log.Debug("expiry: slice", "table", t.Name, "from_page", a, "to_page", b, "predicted", int64(predicted*s.factor()), "deleted", n, "took", took, "prefetched_pages", ready)
	return n, s.cutoff, wal, nil
}

// sweepTx is one sweep batch transaction over the pages [a, b).
func (d *Deleter) sweepTx(ctx context.Context, t *catalog.Table, s *sweep, a, b int64, res *TableResult, skipLocked bool) (n int64, wal float64, took time.Duration, err error) {
	t = d.view(t)
	lockTimeout := d.opts.LockTimeout
	if !skipLocked {
		lockTimeout = min(d.opts.LockTimeout, d.optimisticLockTimeout())
	}
	tx, err := batchloop.Begin(ctx, d.pool, t.Name, batchloop.TxOptions{
		LockTimeout: lockTimeout, StatementTimeout: d.opts.StatementTimeout, IdleInTx: d.opts.IdleTimeout, Throttle: d.opts.Throttle, Clock: d.opts.Clock, Watch: d.opts.Watch,
		Settings: sweepSettingsSQL})
	if err != nil {
		return 0, 0, 0, err
	}
	defer tx.Close(ctx, &err)
	// The count's cutoff, or this batch's if the clock went back since.
	c := s.cutoff
	if now := cutoff(t, tx.Now); now.Before(c) {
		c = now
	}
	var args sqlargs.List
	hp, rp := tx.Coverage.Union(s.cov).Predicates(t, "d", &args)
	slice := fmt.Sprintf("d.ctid >= %s::tid AND d.ctid < %s::tid", args.Add(tid(a)), args.Add(tid(b)))
	due := fmt.Sprintf("d.%s <= %s AND NOT %s AND NOT %s AND %s", t.Expiry.Quoted, t.Expiry.Instant(args.Add(c)+"::timestamptz"), hp, rp, t.Deletable("d"))
	keysReturning, keysCTE, keysCount := tiering.DeleteKeys(t)
	var keys int64
	began := time.Now()
	pick, kids, deleted := referencing(t, "d")
	switch {
	case skipLocked || kids != "":
		lock := ""
		if skipLocked {
			lock = "\n  FOR UPDATE OF d SKIP LOCKED"
		}
		err = tx.QueryRow(ctx, fmt.Sprintf(sweepVictimsSQL, t.Ident, slice, due, keysReturning, keysCTE, keysCount, pick, kids, deleted, lock), args.Values...).Scan(&n, &keys)
	case tiering.KeyOf(t) != nil:
		err = tx.QueryRow(ctx, fmt.Sprintf(sweepKeysSQL, t.Ident, slice, due, keysReturning, keysCTE, keysCount), args.Values...).Scan(&n, &keys)
	default:
		tag, e := tx.Exec(ctx, fmt.Sprintf(sweepSQL, t.Ident, slice, due), args.Values...)
		n, err = tag.RowsAffected(), e
	}
	if err != nil {
		return 0, 0, 0, err
	}
	took = time.Since(began)
	if d.TestSignals.BeforeCommit != nil {
		d.TestSignals.BeforeCommit(t.Name, n)
	}
	if wal, err = tx.Commit(ctx); err != nil {
		return 0, 0, 0, err
	}
	res.PermanentKeys += keys
	return n, wal, took, nil
}

// tid is the first tuple position of page p, as text for a tid parameter.
func tid(p int64) string { return fmt.Sprintf("(%d,0)", p) }

// sweepResume is where the measurements after a sweep pass start in the
// expiry index: a sweep that finished deleted every counted row it could,
// so they start at the count's cutoff; one cut short left due rows of every
// expiry behind, so they count them all.
func sweepResume(s *sweep, stopped bool) pgtype.Timestamptz {
	if stopped {
		return batchloop.NegInf
	}
	return pgtype.Timestamptz{Time: s.cutoff, Valid: true}
}
