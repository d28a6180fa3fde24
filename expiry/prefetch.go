package expiry

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// A sweep's slice spends most of its time reading its pages into shared
// buffers: from the OS cache, about half of a slice's statement on
// bench/expiry's layouts, and PostgreSQL 15 reads a TID Range Scan's pages
// one at a time, with no prefetch. The prefetcher reads the pages of the
// next slices on a connection of its own while a slice deletes, so that
// the slice finds them in shared buffers (Options.Prefetch,
// INBOXKEEPER_SWEEP_PREFETCH; docs/design/expiry.md, "Prefetching the next
// slices").
//
// It reads in chunks of prefetchChunk pages, each a read-only statement of
// its own transaction (a snapshot held for a few milliseconds), at most
// prefetchSlices slices ahead of the slice being deleted, never past where
// the sweep ends, and at most a sixteenth of shared_buffers ahead, so that
// what it reads is not evicted before the sweep gets to it. It is best
// effort: a chunk that fails (a lock it would wait for beyond its short
// lock timeout, a cancelled statement) ends the prefetching of the pass,
// and the slices read their pages themselves, as without it.
const (
	prefetchChunk  = 256
	prefetchSlices = 2
	// prefetchBuffersShare: the prefetcher reads at most shared_buffers ÷
	// this many pages ahead of the slice being deleted.
	prefetchBuffersShare = 16
)

// prefetcher reads a sweep's next pages into shared buffers.
type prefetcher struct {
	pool  *pgxpool.Pool
	table *catalog.Table
	// lockTimeout and statementTimeout bound each chunk's statement.
	lockTimeout, statementTimeout time.Duration
	log                           func(msg string, args ...any)
	// onRead, when set, is told of every chunk read or failed (tests).
	onRead func(from, to int64, err error)

	wake chan struct{}
	done chan struct{}

	mu    sync.Mutex
	lo    int64 // the window's start: the end of the slice being deleted
	next  int64 // the next page to read
	limit int64 // read up to here: the window's end
	lead  int64 // the most pages read ahead of lo (from shared_buffers; 0 until read)
	read  int64 // pages read so far
	// [readFrom, readTo): the pages of the last run of chunks read one
	// after the other (ready).
	readFrom, readTo int64
	stopped          bool
}

// startPrefetch starts a prefetcher of t's pages; want gives it pages to
// read, stop ends it.
func startPrefetch(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table, lockTimeout, statementTimeout time.Duration, log func(string, ...any), onRead func(int64, int64, error)) *prefetcher {
	p := &prefetcher{pool: pool, table: t, lockTimeout: lockTimeout, statementTimeout: statementTimeout, log: log, onRead: onRead,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	go p.run(ctx)
	return p
}

// want asks for the pages [from, to) to be read: from is where the slice
// being deleted ends. Pages before from are not read any more; a window
// that starts before the last one (the sweep wrapped around to page 0)
// starts afresh.
func (p *prefetcher) want(from, to int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if from < p.lo || from > p.next {
		p.next = from
	}
	p.lo, p.limit = from, to
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// ready is how many of the pages [a, b) the prefetcher has read.
func (p *prefetcher) ready(a, b int64) int64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(0, min(b, p.readTo)-max(a, p.readFrom))
}

// stop ends the prefetching and waits for the chunk in flight, if any. It
// returns the pages read.
func (p *prefetcher) stop() int64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.read
}

// chunk waits for the next chunk to read; ok false once the prefetcher
// is stopped.
func (p *prefetcher) chunk(ctx context.Context) (from, to int64, ok bool) {
	for {
		from, to, ok, stopped := p.take()
		if ok || stopped || ctx.Err() != nil {
			return from, to, ok && ctx.Err() == nil
		}
		select {
		case <-ctx.Done():
		case <-p.wake:
		}
	}
}

// take is the next chunk to read, if there is one in the window and
// within the lead: at most prefetchChunk pages.
func (p *prefetcher) take() (from, to int64, ok, stopped bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return 0, 0, false, true
	}
	end := p.limit
	if p.lead > 0 {
		end = min(end, p.lo+p.lead)
	}
	if p.next >= end {
		return 0, 0, false, false
	}
	from, to = p.next, min(end, p.next+prefetchChunk)
	p.next = to
	return from, to, true, false
}

func (p *prefetcher) run(ctx context.Context) {
	defer close(p.done)
	var buffers int64
	// One round trip before the first chunk, on the prefetcher's own
	// connection: the pass waits for none of its statements.
	if err := p.pool.QueryRow(ctx, "SELECT pg_size_bytes(current_setting('shared_buffers')) / current_setting('block_size')::bigint",
		pgx.QueryExecModeSimpleProtocol).Scan(&buffers); err != nil {
		p.failed(ctx, 0, 0, err)
		return
	}
	p.mu.Lock()
	p.lead = max(prefetchChunk, buffers/prefetchBuffersShare)
	p.mu.Unlock()
	for {
		from, to, ok := p.chunk(ctx)
		if !ok {
			return
		}
		// No arguments: one round trip in the simple protocol, one
		// implicit transaction, and the settings local to it (safe behind
		// a transaction pooler). A TID Range Scan reads the pages; the
		// count keeps the rows in the server.
		sql := fmt.Sprintf(`SELECT set_config('enable_seqscan', 'off', true), set_config('enable_indexscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true)%s;
SELECT count(*) FROM %s WHERE ctid >= '%s'::tid AND ctid < '%s'::tid`, p.timeouts(), p.table.Ident, tid(from), tid(to))
		if _, err := p.pool.Exec(ctx, sql); err != nil {
			p.failed(ctx, from, to, err)
			return
		}
		p.mu.Lock()
		p.read += to - from
		if from != p.readTo {
			p.readFrom = from
		}
		p.readTo = to
		p.mu.Unlock()
		if p.onRead != nil {
			p.onRead(from, to, nil)
		}
	}
}

// timeouts are the settings that bound a chunk's statement (a zero
// duration leaves the server's own).
func (p *prefetcher) timeouts() string {
	var out string
	for _, kv := range []struct {
		name string
		d    time.Duration
	}{{"lock_timeout", p.lockTimeout}, {"statement_timeout", p.statementTimeout}} {
		if kv.d > 0 {
			out += fmt.Sprintf(", set_config('%s', '%s', true)", kv.name, retry.Millis(kv.d))
		}
	}
	return out
}

// failed ends the prefetching of the pass: the slices read their own pages.
func (p *prefetcher) failed(ctx context.Context, from, to int64, err error) {
	if p.onRead != nil {
		p.onRead(from, to, err)
	}
	if ctx.Err() == nil {
		p.log("expiry: prefetching stopped; the slices read their own pages", "table", p.table.Name, "error", err)
	}
}

// prefetchWindow is what the prefetcher should read once the slice [a, b)
// is being deleted: up to prefetchSlices slices of its length beyond it,
// never past where the sweep ends (the map's last due page, when the sweep
// started at page 0 and the count was not capped) nor across the
// wrap-around point (the end of the heap, or, after it, the page the sweep
// started at).
func (s *sweep) prefetchWindow(a, b int64) (from, to int64) {
	span := b - a
	if span <= 0 || b >= s.nblocks {
		return b, b
	}
	end := s.nblocks
	if s.start > 0 && b <= s.start {
		end = s.start // wrapped around: the sweep ends where it began
	}
	if s.start == 0 && s.est.sweepPages > 0 {
		end = min(end, int64(s.est.sweepPages)+1)
	}
	return b, max(b, min(end, b+prefetchSlices*span))
}
