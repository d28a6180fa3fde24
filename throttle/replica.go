package throttle

import (
	"context"
	"errors"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
)

// The listed standbys (INBOXKEEPER_REPLICA_URLS): their apply lag, read on
// each from the heartbeat the primary writes; a standby that cannot be read
// throttles (fail closed) unless REPLICA_FAIL_OPEN.
const (
	ReplicaLag         = "replica_lag"
	ReplicaUnreachable = "replica_unreachable"
)

func init() {
	register(kind{name: ReplicaLag, backlog: true, collectors: replicaCollectors,
		gauge: &gauge{"inboxkeeper_replica_lag_seconds", "Apply lag of a standby: from the heartbeat for listed standbys (host:port), replay_lag for the others (walsender NAME). +Inf when unknown.", "replica"}})
	register(kind{name: ReplicaUnreachable, backlog: true, export: func(m *Metrics, r Reading, gone bool) {
		if !gone && r.Value > 0 && r.Subject != readStatReplication {
			m.gauge("inboxkeeper_replica_lag_seconds").WithLabelValues(r.Subject).Set(unknown)
		}
	}})
}

// replicaCollectors read each listed standby, and write the heartbeat.
// The heartbeat also runs without listed standbys: while a standby has a
// backlog, its small writes make the walreceivers report their replay
// positions, which the pacer reads.
func replicaCollectors(t *Throttler) []collector {
	cs := []collector{{interval: statsInterval, run: t.beat, writes: true}}
	for _, u := range t.cfg.ReplicaURLs {
		r := &replica{url: u, name: replicaName(u)}
		cs = append(cs, collector{interval: t.cfg.HeartbeatInterval,
			run: func(ctx context.Context) { t.measureReplica(ctx, r) }, close: r.closeConn})
	}
	return cs
}

// beat writes the heartbeat every HEARTBEAT_INTERVAL when standbys are
// listed, and every STATS_INTERVAL while a standby has a backlog.
func (t *Throttler) beat(ctx context.Context) {
	now := t.Clock.Now()
	t.mu.Lock()
	every := time.Duration(math.MaxInt64)
	if len(t.cfg.ReplicaURLs) > 0 {
		every = t.cfg.HeartbeatInterval
	}
	if t.pacer.backlog() {
		every = min(every, statsInterval)
	}
	due := every != time.Duration(math.MaxInt64) && now.Sub(t.lastBeat) >= every
	t.mu.Unlock()
	if due {
		t.writeHeartbeat(ctx)
	}
}

func (t *Throttler) writeHeartbeat(ctx context.Context) {
	_, err := t.pool.Exec(ctx, `INSERT INTO inboxkeeper.heartbeat (id, beat) VALUES (true, clock_timestamp())
ON CONFLICT (id) DO UPDATE SET beat = excluded.beat`)
	if !t.recorded(ctx, writeBeat, err) {
		return
	}
	t.mu.Lock()
	t.lastBeat = t.Clock.Now()
	t.mu.Unlock()
}

type replica struct {
	url, name string
	conn      *pgx.Conn
}

func (r *replica) closeConn() {
	if r.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = r.conn.Close(ctx)
		r.conn = nil
	}
}

// replicaName is host:port of a standby URL: bounded, and without secrets.
func replicaName(u string) string {
	cc, err := pgx.ParseConfig(u)
	if err != nil {
		return "(unparseable replica url)"
	}
	return net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
}

// measureReplica reads the newest heartbeat the standby has applied: its lag
// is the standby's clock minus that beat.
func (t *Throttler) measureReplica(ctx context.Context, r *replica) {
	lag, err := r.lag(ctx, t.cfg.HeartbeatInterval*4+time.Second)
	if ctx.Err() != nil {
		return
	}
	threshold := t.limits().MaxReplicaLag.Seconds()
	if err != nil {
		r.closeConn()
		// Unknown lag is not zero lag: fail closed unless told otherwise.
		u := Reading{Kind: ReplicaUnreachable, Subject: r.name, Value: 1, Threshold: 0, Detail: err.Error()}
		if t.cfg.ReplicaFailOpen {
			u.Value, u.Detail = 0, "fail open: "+err.Error()
		}
		t.forget(ReplicaLag, r.name)
		t.set(u)
		return
	}
	t.mu.Lock()
	t.pacer.lagged(lag, t.Clock.Now())
	t.mu.Unlock()
	t.set(Reading{Kind: ReplicaUnreachable, Subject: r.name, Value: 0, Threshold: 0})
	t.set(Reading{Kind: ReplicaLag, Subject: r.name, Value: lag, Threshold: threshold, Unit: "s"})
}

var errNoHeartbeat = errors.New("no heartbeat applied yet")

func (r *replica) lag(ctx context.Context, timeout time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if r.conn == nil {
		cc, err := dbconn.Conn(r.url)
		if err != nil {
			return 0, err
		}
		cc.ConnectTimeout = timeout
		if r.conn, err = pgx.ConnectConfig(ctx, cc); err != nil {
			// The cause once, without the TLS attempt pgx makes first.
			return 0, dbconn.Classify(err)
		}
	}
	var lag *float64
	err := r.conn.QueryRow(ctx, `SELECT extract(epoch FROM clock_timestamp() - max(beat))::float8 FROM inboxkeeper.heartbeat`).Scan(&lag)
	if err != nil {
		return 0, err
	}
	if lag == nil {
		return unknown, nil
	}
	return max(*lag, 0), nil
}
