// Package horizon names what holds the database's xmin horizon: the oldest
// transaction id whose snapshot someone may still need. Rows the daemon
// deleted after it stay on disk as dead tuples, whatever VACUUM does,
// until the holder lets go, so the table grows while every pass reports
// success. The holders are of four kinds: a backend of this database with
// an open snapshot (pg_stat_activity.backend_xmin: a long or idle-in-
// transaction session), a replication slot (pg_replication_slots.xmin), a
// prepared transaction (pg_prepared_xacts) and a standby with
// hot_standby_feedback (its walsender's backend_xmin in
// pg_stat_replication). Only the kinds that hold back a table of this
// database are read: backends of other databases do not, and a slot's
// catalog_xmin holds back only the catalogs.
//
// How long a holder has held it: a backend since its transaction began, a
// prepared transaction since its PREPARE; a slot or a standby has no time,
// only a transaction id, which a Watch dates from the transaction ids it
// saw the database hand out (at least since the first of its readings
// that had passed it).
//
// Daemon internals: the daemon's pass, its metrics and `status` use it.
package horizon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The kinds of holder, the kind label of
// inboxkeeper_xmin_horizon_age_seconds.
const (
	Backend             = "backend"
	ReplicationSlot     = "replication_slot"
	PreparedTransaction = "prepared_transaction"
	StandbyFeedback     = "standby_feedback"
)

// Kinds lists them in the order status shows them.
var Kinds = []string{Backend, ReplicationSlot, PreparedTransaction, StandbyFeedback}

// Blocker is one holder of the xmin horizon.
type Blocker struct {
	Kind string
	// Xids is how many transaction ids the database handed out since the
	// holder's xmin: age(xmin).
	Xids int64
	// Since is when it began to hold it: the transaction's start (a
	// backend), the PREPARE (a prepared transaction); for a slot or a
	// standby the first reading its xmin predates (AtLeast: it held it
	// before then), zero when no reading dates it.
	Since   time.Time
	AtLeast bool
	// Age is the reading's now minus Since; 0 when Since is zero.
	Age time.Duration

	PID         int    // backend, standby (its walsender), active slot
	Application string // backend, standby: application_name
	Client      string // backend, standby: client address, "local" for a socket
	State       string // backend: idle in transaction, active...; standby: streaming...; slot: active or inactive
	Name        string // slot name, prepared transaction's gid
	Owner       string // prepared transaction's owner
}

// String names the blocker for people: status and the daemon's warning.
func (b Blocker) String() string {
	var s strings.Builder
	switch b.Kind {
	case Backend:
		fmt.Fprintf(&s, "backend pid %d, application_name %q, client %s, %s", b.PID, b.Application, b.Client, b.State)
	case ReplicationSlot:
		fmt.Fprintf(&s, "replication slot %q (%s)", b.Name, b.State)
	case PreparedTransaction:
		fmt.Fprintf(&s, "prepared transaction gid %q, owner %s", b.Name, b.Owner)
	case StandbyFeedback:
		fmt.Fprintf(&s, "standby %q (walsender pid %d, client %s) with hot_standby_feedback", b.Application, b.PID, b.Client)
	default:
		s.WriteString(b.Kind)
	}
	switch {
	case b.Since.IsZero():
		fmt.Fprintf(&s, ", %d transactions behind", b.Xids)
	case b.AtLeast:
		fmt.Fprintf(&s, ", since before %s (%d transactions behind)", b.Since.UTC().Format(time.RFC3339), b.Xids)
	default:
		fmt.Fprintf(&s, ", since %s (%d transactions behind)", b.Since.UTC().Format(time.RFC3339), b.Xids)
	}
	return s.String()
}

// Reading is one read of the holders: the oldest of each kind that holds
// any, oldest first by transaction id.
type Reading struct {
	Now      time.Time
	Next     int64 // the next transaction id the database will hand out
	Blockers []Blocker
}

// Oldest is the reading's oldest holder of kind, and whether there is one.
func (r Reading) Oldest(kind string) (Blocker, bool) {
	for _, b := range r.Blockers {
		if b.Kind == kind {
			return b, true
		}
	}
	return Blocker{}, false
}

// readSQL reads every holder with the database's now and next transaction
// id (the clock row is always there). The daemon's own session is left out:
// its snapshot is this statement's.
const readSQL = `
WITH n AS (SELECT now() AS now, pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS next)
SELECT 'clock', 0::int8, NULL::int4, '', '', '', NULL::timestamptz, '', '', n.now, n.next FROM n
UNION ALL
SELECT 'backend', age(a.backend_xmin)::int8, a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local'),
       coalesce(a.state, ''), coalesce(a.xact_start, a.backend_start), '', '', n.now, n.next
FROM pg_stat_activity a, n
WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid() AND a.datname = current_database() AND a.backend_type <> 'walsender'
UNION ALL
SELECT 'replication_slot', age(s.xmin)::int8, s.active_pid, '', '', CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
       NULL, s.slot_name::text, '', n.now, n.next
FROM pg_replication_slots s, n
WHERE s.xmin IS NOT NULL
UNION ALL
SELECT 'prepared_transaction', age(p.transaction)::int8, NULL, '', '', '', p.prepared, p.gid, p.owner::text, n.now, n.next
FROM pg_prepared_xacts p, n
WHERE p.database = current_database()
UNION ALL
SELECT 'standby_feedback', age(r.backend_xmin)::int8, r.pid, coalesce(r.application_name, ''), coalesce(host(r.client_addr), 'local'),
       coalesce(r.state, ''), NULL, '', '', n.now, n.next
FROM pg_stat_replication r, n
WHERE r.backend_xmin IS NOT NULL`

// Querier runs a query: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// Read reads the holders once; slots and standbys are not dated (status).
func Read(ctx context.Context, q Querier) (Reading, error) {
	return read(ctx, q, nil)
}

func read(ctx context.Context, q Querier, c *xidClock) (Reading, error) {
	rows, err := q.Query(ctx, readSQL)
	if err != nil {
		return Reading{}, fmt.Errorf("read the xmin horizon's holders: %w", err)
	}
	type row struct {
		b     Blocker
		pid   *int32
		since *time.Time
		now   time.Time
		next  int64
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.b.Kind, &x.b.Xids, &x.pid, &x.b.Application, &x.b.Client, &x.b.State, &x.since, &x.b.Name, &x.b.Owner, &x.now, &x.next)
		return x, err
	})
	if err != nil {
		return Reading{}, fmt.Errorf("read the xmin horizon's holders: %w", err)
	}
	var r Reading
	oldest := map[string]int{} // kind -> index in r.Blockers
	for _, x := range all {
		r.Now, r.Next = x.now, x.next
		if x.b.Kind == "clock" {
			continue
		}
		b := x.b
		if x.pid != nil {
			b.PID = int(*x.pid)
		}
		if x.since != nil {
			b.Since = *x.since
		}
		if i, ok := oldest[b.Kind]; !ok {
			oldest[b.Kind] = len(r.Blockers)
			r.Blockers = append(r.Blockers, b)
		} else if b.Xids > r.Blockers[i].Xids {
			r.Blockers[i] = b
		}
	}
	if c != nil {
		c.add(r.Now, r.Next)
	}
	for i := range r.Blockers {
		b := &r.Blockers[i]
		if b.Since.IsZero() && c != nil {
			b.Since = c.since(r.Next - b.Xids)
			b.AtLeast = !b.Since.IsZero()
		}
		if !b.Since.IsZero() {
			b.Age = max(r.Now.Sub(b.Since), 0)
		}
	}
	sortOldest(r.Blockers)
	return r, nil
}

// sortOldest orders blockers by the transactions they hold back, the most
// first.
func sortOldest(bs []Blocker) {
	for i := 1; i < len(bs); i++ {
		for j := i; j > 0 && bs[j].Xids > bs[j-1].Xids; j-- {
			bs[j], bs[j-1] = bs[j-1], bs[j]
		}
	}
}
