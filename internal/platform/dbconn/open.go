package dbconn

import (
	"cmp"
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connectTimeout bounds connecting and the first ping.
const connectTimeout = 15 * time.Second

// Open connects a pool of up to maxConns to url as every command does,
// with warm connections in it (at least one), connecting side by side, as
// for a direct connection, which it nearly always is. The first of them to
// open tells whether a pooler stands in between (Pooled), for the pool's
// query mode depends on it (ForPooler): a probe of its own cost every
// command one more connection and its backend. A process that connects
// once per pass (`once` from cron) waited for one connection after the
// other, and a pass uses more than one within its first 50 ms (the
// throttle's readings, the heap's sample beside the first count): opening
// a connection took 20 ms on an idle server and twice that beside the
// pass's own work (docs/design/expiry.md), so the commands that run passes
// ask for as many as a pass starts with. Behind a pooler that pool is
// closed and another opened, and pinged (the pooler may accept a client it
// has no server connection for). It reports whether the connection goes
// through a pooler. A url that does not parse is ErrBadURL; an error never
// shows the password.
func Open(ctx context.Context, url string, maxConns, warm int32, opts ...Option) (pool *pgxpool.Pool, pooled bool, err error) {
	pc, err := Pool(url, maxConns, opts...)
	if err != nil {
		return nil, false, err
	}
	connCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	// Connected is enough: the probe's query shows the server answers (a
	// ping would be one more round trip).
	pool, pooled, err = warmPool(ctx, connCtx, pc.Copy(), min(max(warm, 1), maxConns))
	if err != nil {
		return nil, false, connectError(url, err)
	}
	if !pooled {
		return pool, false, nil
	}
	pool.Close()
	ForPooler(pc.ConnConfig)
	if pool, err = ping(ctx, connCtx, pc); err != nil {
		return nil, false, connectError(url, err)
	}
	return pool, true, nil
}

// OpenDirect connects a pool to url, which must not go through a
// transaction pooler (INBOXKEEPER_SESSION_DATABASE_URL): no probe. A url
// that does not parse is ErrBadURL; a failed connection a ConnectError.
func OpenDirect(ctx context.Context, url string, maxConns int32, opts ...Option) (*pgxpool.Pool, error) {
	pc, err := Pool(url, maxConns, opts...)
	if err != nil {
		return nil, err
	}
	pool, err := ping(ctx, ctx, pc)
	if err != nil {
		return nil, connectError(url, err)
	}
	return pool, nil
}

func ping(ctx, connCtx context.Context, pc *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(connCtx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// warmPool opens a pool with n connections in it, connecting side by side,
// and says whether the first of them to open goes through a pooler.
func warmPool(ctx, connCtx context.Context, pc *pgxpool.Config, n int32) (*pgxpool.Pool, bool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, false, err
	}
	conns := make(chan *pgxpool.Conn, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			// Held until every one is open: a connection released at once
			// would be taken again instead of a new one opened.
			if c, err := pool.Acquire(connCtx); err != nil {
				errs <- err
			} else {
				conns <- c
			}
		}()
	}
	var first error
	var held []*pgxpool.Conn
	pooled := false
	for range n {
		select {
		case c := <-conns:
			if len(held) == 0 && first == nil {
				// While the others connect.
				pooled, first = Pooled(connCtx, c.Conn())
			}
			held = append(held, c)
		case err := <-errs:
			first = cmp.Or(first, err)
		}
	}
	for _, c := range held {
		c.Release()
	}
	if first != nil {
		pool.Close()
		return nil, false, first
	}
	return pool, pooled, nil
}

// Dial opens one connection of its own to url: a session (the migration
// lock, DETACH ... CONCURRENTLY).
func Dial(ctx context.Context, url string, opts ...Option) (*pgx.Conn, error) {
	cc, err := Conn(url, opts...)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, connectError(url, err)
	}
	return conn, nil
}
