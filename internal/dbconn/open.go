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

// Open connects a pool of up to maxConns to url as every command does: one
// connection to see whether a pooler stands in between (Pooled), for the
// pool's query mode depends on it (ForPooler), and the pool with warm
// connections in it (at least one). They connect side by side, the pool as
// for a direct connection, which it nearly always is: a process that
// connects once per pass (`once` from cron) waited for one connection after
// the other. A pass uses a second connection within its first 50 ms (the
// throttle's readings, the heap's sample beside the first count), and
// opening a connection took 20 ms on an idle server and twice that beside
// the pass's own work (docs/design/expiry.md): the commands that run passes
// ask for two. Behind a pooler that pool is closed and another opened, and
// pinged (the pooler may accept a client it has no server connection for).
// The probe connects as the direct pool does (with cancel requests), as it
// did before. It reports whether the connection goes through a pooler. A
// url that does not parse is ErrBadURL; an error never shows the password.
func Open(ctx context.Context, url string, maxConns, warm int32, opts ...Option) (pool *pgxpool.Pool, pooled bool, err error) {
	pc, err := Pool(url, maxConns, opts...)
	if err != nil {
		return nil, false, err
	}
	connCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	type opened struct {
		pool *pgxpool.Pool
		err  error
	}
	direct := make(chan opened, 1)
	go func() {
		// Connected is enough: the probe's query shows the server answers
		// (a ping would be one more round trip).
		p, err := warmPool(ctx, connCtx, pc.Copy(), min(max(warm, 1), maxConns))
		direct <- opened{p, err}
	}()
	pooled, err = probe(ctx, connCtx, pc.ConnConfig.Copy())
	d := <-direct
	if err != nil || pooled {
		if d.pool != nil {
			d.pool.Close()
		}
		if err != nil {
			return nil, false, connectError(url, err)
		}
		ForPooler(pc.ConnConfig)
		if pool, err = ping(ctx, connCtx, pc); err != nil {
			return nil, false, connectError(url, err)
		}
		return pool, true, nil
	}
	if d.err != nil {
		return nil, false, connectError(url, d.err)
	}
	return d.pool, false, nil
}

// probe connects once with cc and says whether a pooler stands in between.
func probe(ctx, connCtx context.Context, cc *pgx.ConnConfig) (bool, error) {
	conn, err := pgx.ConnectConfig(connCtx, cc)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return Pooled(connCtx, conn)
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

// warmPool opens a pool with n connections in it, connecting side by side.
func warmPool(ctx, connCtx context.Context, pc *pgxpool.Config, n int32) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
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
	for range n {
		select {
		case c := <-conns:
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
		return nil, first
	}
	return pool, nil
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
