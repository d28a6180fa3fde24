package expiry

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The window a slice asks the prefetcher for: up to two slices of its
// length beyond it, never past the map's end (a sweep from page 0), the
// end of the heap, or, once the sweep has wrapped around, its start.
func TestPrefetchWindow(t *testing.T) {
	t.Parallel()
	from0 := &sweep{nblocks: 1000, est: sweepEstimate{sweepPages: 600}}
	half := &sweep{nblocks: 1000, start: 400, est: sweepEstimate{sweepPages: 900}}
	for _, c := range []struct {
		s              *sweep
		a, b, from, to int64
	}{
		{from0, 0, 50, 50, 150},
		{from0, 500, 550, 550, 601}, // the map ends at page 600
		{from0, 600, 700, 700, 700}, // past it: nothing
		{from0, 950, 1000, 1000, 1000},
		{half, 400, 450, 450, 550},
		{half, 900, 980, 980, 1000}, // not across the end of the heap
		{half, 950, 1000, 1000, 1000},
		{half, 0, 50, 50, 150},     // wrapped around
		{half, 300, 380, 380, 400}, // the sweep ends where it began
		{half, 20, 20, 20, 20},
	} {
		if from, to := c.s.prefetchWindow(c.a, c.b); from != c.from || to != c.to {
			t.Errorf("start %d, slice [%d, %d): window [%d, %d), want [%d, %d)", c.s.start, c.a, c.b, from, to, c.from, c.to)
		}
	}
}

// The prefetcher reads its window in chunks, at most its lead ahead of
// the slice being deleted, never a page twice while the sweep goes on,
// and no page the sweep has passed.
func TestPrefetcherChunks(t *testing.T) {
	t.Parallel()
	p := &prefetcher{wake: make(chan struct{}, 1), done: make(chan struct{}), lead: 300}
	close(p.done) // no goroutine reads: take is driven here
	next := func() [2]int64 {
		from, to, ok, _ := p.take()
		if !ok {
			return [2]int64{-1, -1}
		}
		return [2]int64{from, to}
	}
	expect := func(step string, want ...[2]int64) {
		t.Helper()
		var got [][2]int64
		for c := next(); c[0] >= 0; c = next() {
			got = append(got, c)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: chunks %v, want %v", step, got, want)
		}
	}
	p.want(100, 1000)
	expect("first window", [2]int64{100, 100 + prefetchChunk}, [2]int64{100 + prefetchChunk, 400})
	p.want(390, 500) // the next slice: read on from where the reads stopped
	expect("next slice", [2]int64{400, 500})
	p.want(900, 1000) // the slices got ahead of the reads: skip to them
	expect("behind", [2]int64{900, 1000})
	p.want(50, 150) // wrapped around to page 0
	expect("wrapped", [2]int64{50, 150})
	p.want(60, 150)
	expect("nothing new")
	p.stop()
	p.want(150, 300)
	if _, _, ok, stopped := p.take(); ok || !stopped {
		t.Errorf("a stopped prefetcher hands out chunks (%v, %v)", ok, stopped)
	}
}

type prefetchLog struct {
	mu     sync.Mutex
	chunks [][2]int64
	errs   []error
}

func (l *prefetchLog) read(from, to int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs = append(l.errs, err)
		return
	}
	l.chunks = append(l.chunks, [2]int64{from, to})
}

// TestSweepPrefetch: a sweep with Prefetch reads pages ahead of its
// slices, each once, none before the end of its first slice nor past the
// last due page, and deletes what a sweep without it deletes; without
// Prefetch nothing is read ahead.
func TestSweepPrefetch(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(strconv.FormatBool(on), func(t *testing.T) {
			t.Parallel()
			f := setup(t, inboxDDL, inboxPolicy)
			due := f.dueInFirstThird(t)
			lastDue := f.lastDuePage(t)
			var logs bytes.Buffer
			var mu sync.Mutex
			log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
			var pl prefetchLog
			// The prefetcher is best effort and its own goroutine: on a
			// loaded machine a pass this small could end before it reads
			// its first chunk. The first slice holds its commit until the
			// prefetcher has read a chunk of the window that slice asked
			// for, or failed (at most 30 s), so that the check below
			// tests what it reads, not who wins a race.
			first := make(chan struct{})
			var firstOnce, commitOnce sync.Once
			sig := TestSignals{OnPrefetch: func(from, to int64, err error) {
				pl.read(from, to, err)
				firstOnce.Do(func() { close(first) })
			}}
			if on {
				sig.BeforeCommit = func(string, int64) {
					commitOnce.Do(func() {
						select {
						case <-first:
						case <-time.After(30 * time.Second):
						}
					})
				}
			}
			res := f.passWith(t, signals{strategy: StrategySweep, TestSignals: sig},
				Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0), Logger: log}, BatchSize: 500}, Prefetch: on})
			if res.Deleted != due || res.SweepBatches != res.Batches || res.SweepBatches < 5 {
				t.Fatalf("pass %+v: want all %d due rows deleted by 5 sweep batches or more", res, due)
			}
			if n := f.count(t, "remember_until <= $1", t0); n != 0 {
				t.Errorf("%d due rows left", n)
			}
			// Each slice's debug line says how many of its pages were read
			// ahead before it began (what sizes the next slices): none of
			// the first slice's, nor any without Prefetch; with it, some of
			// the second's, as its commit waited for the chunk that starts
			// where the second slice starts.
			mu.Lock()
			lines := regexp.MustCompile(`expiry: slice.* from_page=(\d+) to_page=(\d+).* prefetched_pages=(\d+)`).FindAllStringSubmatch(logs.String(), -1)
			mu.Unlock()
			if len(lines) != res.SweepBatches {
				t.Fatalf("%d slice lines with prefetched_pages=, want one for each of the %d slices", len(lines), res.SweepBatches)
			}
			var readySum int64
			for i, l := range lines {
				from, _ := strconv.ParseInt(l[1], 10, 64)
				to, _ := strconv.ParseInt(l[2], 10, 64)
				ready, _ := strconv.ParseInt(l[3], 10, 64)
				readySum += ready
				if ready > to-from || ((i == 0 || !on) && ready != 0) || (i == 1 && on && ready == 0) {
					t.Errorf("slice %d [%d, %d): %d pages read ahead, want none for the first slice or without Prefetch, some for the second with it, at most the slice's", i, from, to, ready)
				}
			}
			if readySum > res.PrefetchedPages {
				t.Errorf("slices found %d pages read ahead, the prefetcher read %d", readySum, res.PrefetchedPages)
			}
			pl.mu.Lock()
			defer pl.mu.Unlock()
			if !on {
				if len(pl.chunks)+len(pl.errs) != 0 || res.PrefetchedPages != 0 {
					t.Fatalf("without Prefetch: read ahead %v (%v), %d pages", pl.chunks, pl.errs, res.PrefetchedPages)
				}
				return
			}
			if len(pl.errs) != 0 || len(pl.chunks) == 0 {
				t.Fatalf("prefetch chunks %v, errors %v: want some, and no error", pl.chunks, pl.errs)
			}
			mu.Lock()
			m := regexp.MustCompile(`expiry: slice.* to_page=(\d+)`).FindStringSubmatch(logs.String())
			mu.Unlock()
			if m == nil {
				t.Fatal("no slice in the debug log")
			}
			firstEnd, _ := strconv.ParseInt(m[1], 10, 64)
			var read int64
			chunks := slices.Clone(pl.chunks)
			slices.SortFunc(chunks, func(a, b [2]int64) int { return int(a[0] - b[0]) })
			for i, c := range chunks {
				read += c[1] - c[0]
				if c[0] < firstEnd || c[1] <= c[0] || c[1] > lastDue+3 {
					t.Errorf("chunk [%d, %d): want it within [%d, %d] (after the first slice, up to the last due page %d and the map's margin)",
						c[0], c[1], firstEnd, lastDue+3, lastDue)
				}
				if i > 0 && c[0] < chunks[i-1][1] {
					t.Errorf("chunks %v and %v overlap", chunks[i-1], c)
				}
			}
			if read != res.PrefetchedPages {
				t.Errorf("chunks of %d pages, the result says %d", read, res.PrefetchedPages)
			}
		})
	}
}

// lockedWriter serializes writes to a buffer another goroutine reads.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// A chunk that fails ends the prefetching, and stop returns at once.
func TestPrefetchFailureEndsIt(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewMigratedPool(t, "")
	var pl prefetchLog
	failed := make(chan struct{})
	gone := &catalog.Table{Name: "public.gone", Ident: `"public"."gone"`}
	p := startPrefetch(context.Background(), pool, gone, 50*time.Millisecond, time.Second, func(string, ...any) {}, func(from, to int64, err error) {
		pl.read(from, to, err)
		if err != nil {
			close(failed)
		}
	})
	p.want(0, 10)
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the chunk of a missing table did not fail within 10 s")
	}
	if n := p.stop(); n != 0 {
		t.Errorf("stop says %d pages read", n)
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if len(pl.chunks) != 0 || len(pl.errs) != 1 {
		t.Errorf("chunks %v, errors %v: want one error and nothing read", pl.chunks, pl.errs)
	}
}
