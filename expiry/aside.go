package expiry

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
)

// aside is a read a pass starts beside its look, on a connection of its
// own, and may drop before it ends: the heap's sample (sampleAhead) and the
// exact count of due rows that a bounded look left for later (exactAhead).
type aside struct {
	done   chan struct{}
	cancel context.CancelFunc
	err    error // set before done closes

	mu sync.Mutex
	// conn is the read's connection while its transaction is open.
	conn *pgx.Conn
	// dropped: the pass does not want the read (drop); interrupted: drop
	// sent the connection's backend a cancel request itself, so the
	// connection is closed, never reused (see drop); idle: the read waits
	// in the daemon between two statements (pause), and its backend runs
	// nothing that a cancel request could stop.
	dropped, interrupted, idle bool
}

// errDropped ends a read the pass no longer wants.
var errDropped = errors.New("the read was dropped")

// startAside runs read in a goroutine; read calls open as its transaction
// starts and between statements, and close as it ends.
func startAside(ctx context.Context, read func(ctx context.Context, a *aside) error) *aside {
	sctx, cancel := context.WithCancel(ctx)
	a := &aside{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(a.done)
		a.err = read(sctx, a)
	}()
	return a
}

// open is called by the read's transaction first: it records the
// connection for drop, and says false when the read is already dropped.
func (a *aside) open(conn *pgx.Conn) bool {
	if a == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conn, a.idle = conn, false
	return !a.dropped
}

// pause is called by the read before it waits in the daemon, between two
// statements, for something that drop's wake ends (exactAhead's hold):
// a drop then sends no cancel request, and the read, woken, sees itself
// dropped at its next open.
func (a *aside) pause() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.idle = true
}

// close is called by the read's transaction last: a connection whose
// backend drop sent a cancel request is closed, as that request may reach
// the backend late and cancel whatever statement it runs next.
func (a *aside) close(ctx context.Context) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.interrupted {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = a.conn.Close(cctx)
		cancel()
	}
	a.conn = nil
}

// drop stops the read if it is still running, and waits for it. wake,
// when not nil, ends what a paused read waits for.
//
// A statement stopped by cancelling its context costs 100 ms more: pgx
// waits that long after its cancel request before the connection may run
// another statement (the request can reach the backend late). A pass with
// less than two batches due (every `once` on a table that keeps up) waited
// for it. So drop sends the cancel request itself and the connection is
// closed instead of reused. Where pgx sends no cancel requests (behind a
// pooler: dbconn.ForPooler), the context is cancelled as before.
//
// A read paused between statements (pause) is neither: its backend runs
// nothing, and a cancel request, itself a connection to the server (a
// process the postmaster starts), cost 20 to 30 ms before the first batch
// of every pass that sampled the heap and went in expiry order, which
// dropped the exact count waiting there (docs/design/expiry.md, "What is
// left: short passes of once"). It is woken instead, and ends at its next
// open with its connection whole.
func (a *aside) drop(wake func()) {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.dropped = true
	conn, idle := a.conn, a.idle
	direct := conn != nil && !idle && dbconn.SendsCancelRequests(conn)
	a.interrupted = direct
	a.mu.Unlock()
	switch {
	case direct:
		// Errors are the statement's to report, and a dropped read's
		// are not read.
		_ = conn.PgConn().CancelRequest(context.WithoutCancel(context.Background()))
	case conn != nil && !idle:
		a.cancel()
	}
	if wake != nil {
		wake()
	}
	// With no connection yet, the read's transaction sees it dropped as it
	// opens (open), or it has ended.
	<-a.done
	a.cancel()
}

// wait waits for the read and returns its error.
func (a *aside) wait() error {
	<-a.done
	a.cancel()
	return a.err
}
