package expiry

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
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
	// connection is closed, never reused (see drop).
	dropped, interrupted bool
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
	a.conn = conn
	return !a.dropped
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

// drop stops the read if it is still running, and waits for it.
//
// A statement stopped by cancelling its context costs 100 ms more: pgx
// waits that long after its cancel request before the connection may run
// another statement (the request can reach the backend late). A pass with
// less than two batches due (every `once` on a table that keeps up) waited
// for it. So drop sends the cancel request itself and the connection is
// closed instead of reused. Where pgx sends no cancel requests (behind a
// pooler: dbconn.ForPooler), the context is cancelled as before.
func (a *aside) drop() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.dropped = true
	conn := a.conn
	direct := conn != nil && dbconn.SendsCancelRequests(conn)
	a.interrupted = direct
	a.mu.Unlock()
	switch {
	case direct:
		// Errors are the statement's to report, and a dropped read's
		// are not read.
		_ = conn.PgConn().CancelRequest(context.WithoutCancel(context.Background()))
	case conn != nil:
		a.cancel()
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
