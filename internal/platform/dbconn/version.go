package dbconn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The PostgreSQL majors inboxkeeper supports. 14 brought what a pass relies
// on (DETACH PARTITION ... CONCURRENTLY, the sweep's TID range scans);
// every major of the range runs an end-to-end test in the suite
// (cmd/inboxkeeper's TestMajors).
const (
	OldestMajor = 14
	NewestMajor = 18
)

// ErrUnsupportedServer is a server older than OldestMajor.
var ErrUnsupportedServer = errors.New("unsupported PostgreSQL version")

// Server is the PostgreSQL a connection reached: its server_version, as
// the server reports it when a session starts ("16.4", "15.10 (Debian
// 15.10-0+deb12u1)", "19devel"), and that version's major, 0 when the
// server reported none (a pooler that does not pass it on).
type Server struct {
	Version string
	Major   int
}

// ServerOf is the server pc is connected to. It costs no round trip.
func ServerOf(pc *pgconn.PgConn) Server { return parseServer(pc.ParameterStatus("server_version")) }

func parseServer(v string) Server {
	digits := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(v)
	}
	major, _ := strconv.Atoi(v[:digits])
	return Server{Version: v, Major: major}
}

// Untested reports a major newer than NewestMajor: it may well work, as
// the catalog and SQL a pass uses have been stable across majors, but no
// test has run on it.
func (s Server) Untested() bool { return s.Major > NewestMajor }

// Check is an error wrapping ErrUnsupportedServer for a major older than
// OldestMajor, naming the server's version and the supported range; nil
// otherwise, and for a server that did not say its version.
func (s Server) Check() error {
	if s.Major == 0 || s.Major >= OldestMajor {
		return nil
	}
	return fmt.Errorf("%w: the server is PostgreSQL %s; inboxkeeper supports PostgreSQL %d to %d (it relies on DETACH PARTITION ... CONCURRENTLY and TID range scans, both new in %d)",
		ErrUnsupportedServer, s.Version, OldestMajor, NewestMajor, OldestMajor)
}

// PoolServer is the server pool's connections reach, read from one of
// them (a pool Open warmed hands one over at once).
func PoolServer(ctx context.Context, pool *pgxpool.Pool) (Server, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return Server{}, err
	}
	defer c.Release()
	return ServerOf(c.Conn().PgConn()), nil
}
