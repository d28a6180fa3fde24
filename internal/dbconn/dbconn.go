// Package dbconn builds connection configurations the same way for every
// connection the daemon opens.
package dbconn

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBadURL is returned for a connection string pgx cannot parse. Its text
// never repeats the string, which may hold a password.
var ErrBadURL = fmt.Errorf("cannot parse the connection string")

// cancelOnContext makes a cancelled context send a cancel request to the
// server. pgx's default only closes the socket, and a backend busy in a
// statement notices that late, keeping its row locks meanwhile: a stopped or
// backing-off daemon must release its locks at once.
func cancelOnContext(c *pgconn.Config) {
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
	if c.RuntimeParams["application_name"] == "" {
		c.RuntimeParams["application_name"] = "inboxkeeper"
	}
}

// Pool parses url (empty: libpq's PG* variables) into a pool configuration.
func Pool(url string, maxConns int32) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, ErrBadURL
	}
	pc.MaxConns = maxConns
	cancelOnContext(&pc.ConnConfig.Config)
	return pc, nil
}

// Conn parses url into a single-connection configuration.
func Conn(url string) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, ErrBadURL
	}
	cancelOnContext(&cc.Config)
	return cc, nil
}
