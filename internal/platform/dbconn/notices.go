package dbconn

import (
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// Every connection built here hands the notices its server sends (a
// WARNING, a NOTICE) to onNotice, which keeps them only for a connection
// being watched (WatchNotices) and drops the rest, as pgx does by default.
// A statement that succeeds can still say it did not do its work only
// there: VACUUM (SKIP_LOCKED) of a table another session holds a lock on
// succeeds with "WARNING: skipping vacuum of ... --- lock not available".

var watched sync.Map // *pgconn.PgConn -> *NoticeWatch

func onNotice(pc *pgconn.PgConn, n *pgconn.Notice) {
	if w, ok := watched.Load(pc); ok {
		w.(*NoticeWatch).add(n)
	}
}

// NoticeWatch keeps the notices one connection receives until Stop.
type NoticeWatch struct {
	pc      *pgconn.PgConn
	mu      sync.Mutex
	notices []*pgconn.Notice
}

// maxWatched bounds what a watch keeps: a statement that sends more
// notices than that is not one the daemon reads them from.
const maxWatched = 100

// WatchNotices starts keeping the notices pc receives (a connection the
// caller holds: one statement's notices at a time). Stop ends it. It keeps
// nothing on a connection not built by Pool, Conn or Dial.
func WatchNotices(pc *pgconn.PgConn) *NoticeWatch {
	w := &NoticeWatch{pc: pc}
	watched.Store(pc, w)
	return w
}

func (w *NoticeWatch) add(n *pgconn.Notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.notices) < maxWatched {
		w.notices = append(w.notices, n)
	}
}

// Stop ends the watch and returns the notices it kept, in order.
func (w *NoticeWatch) Stop() []*pgconn.Notice {
	watched.CompareAndDelete(w.pc, w)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.notices
}
