package throttle

import (
	"context"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
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
// positions, which the pacer reads. A listed standby is read between passes
// too (every idleEvery), each time after a fresh heartbeat (measureReplica).
func replicaCollectors(t *Throttler) []*collector {
	cs := []*collector{{interval: statsInterval, run: t.beat, writes: true}}
	for _, u := range t.cfg.ReplicaURLs {
		r := &replica{url: u, name: replicaName(u)}
		cs = append(cs, &collector{interval: t.cfg.HeartbeatInterval, idle: func() bool { return true },
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

// beatsKept bounds the heartbeats remembered (beatLag): more than a
// MAX_REPLICA_LAG's worth at any sensible HEARTBEAT_INTERVAL.
const beatsKept = 256

func (t *Throttler) writeHeartbeat(ctx context.Context) {
	var at time.Time
	err := t.pool.QueryRow(ctx, `INSERT INTO inboxkeeper.heartbeat (id, beat) VALUES (true, clock_timestamp())
ON CONFLICT (id) DO UPDATE SET beat = excluded.beat RETURNING beat`).Scan(&at)
	if !t.recorded(ctx, writeBeat, err) {
		return
	}
	t.mu.Lock()
	t.lastBeat = t.Clock.Now()
	t.beats = append(t.beats, at)
	if len(t.beats) > beatsKept {
		t.beats = t.beats[len(t.beats)-beatsKept:]
	}
	t.mu.Unlock()
}

// beatLag is how far behind a standby is whose newest applied heartbeat is
// applied, at its clock now. While heartbeats are written every
// HEARTBEAT_INTERVAL (h) that is now - applied. Between passes they are
// not, so that measure would count the pause: the standby is behind by no
// more than the time since the first heartbeat written after applied, plus
// h as that first one would have been written h earlier; and by at most h
// when it applied the newest one written (a standby that cannot apply a
// fresh one in time is seen by measureReplica's wait).
func (t *Throttler) beatLag(now, applied time.Time) float64 {
	lag := now.Sub(applied)
	h := t.cfg.HeartbeatInterval
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.beats) == 0 {
		return max(lag.Seconds(), 0)
	}
	next := time.Time{}
	for _, b := range t.beats {
		if b.After(applied) {
			next = b
			break
		}
	}
	if next.IsZero() {
		lag = min(lag, h)
	} else {
		lag = min(lag, now.Sub(next)+h)
	}
	return max(lag.Seconds(), 0)
}

type replica struct {
	url, name string
	conn      *pgx.Conn
	read      time.Time // the last reading
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
// is the standby's clock minus that beat (beatLag). A standby not read for
// a while (between passes, or for the first time in a pass) gets a fresh
// heartbeat first, and is read until it has applied it or MAX_REPLICA_LAG
// has passed: no heartbeat was written meanwhile, and an old one would
// measure the pause.
func (t *Throttler) measureReplica(ctx context.Context, r *replica) {
	t.mu.Lock()
	started, awake := t.cs != nil, t.awake
	t.mu.Unlock()
	// status (MeasureOnce) writes nothing: it reads what the daemon wrote.
	settle := started && (!awake || time.Since(r.read) > 2*t.cfg.HeartbeatInterval)
	var fresh time.Time
	if settle {
		if time.Since(t.lastBeatAt()) >= t.cfg.HeartbeatInterval {
			t.writeHeartbeat(ctx)
		}
		fresh = t.newestBeat()
	}
	limit := t.limits().MaxReplicaLag
	deadline := time.Now().Add(limit)
	var now, applied time.Time
	var err error
	for {
		now, applied, err = r.applied(ctx, t.cfg.HeartbeatInterval*4+time.Second)
		if err != nil || !applied.Before(fresh) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(settleEvery):
		}
	}
	if ctx.Err() != nil {
		return
	}
	r.read = time.Now()
	threshold := limit.Seconds()
	if err != nil {
		r.closeConn()
		t.fails.standbyFailed(r.name, err, t.cfg.ReplicaFailOpen)
		// Unknown lag is not zero lag: fail closed unless told otherwise.
		u := Reading{Kind: ReplicaUnreachable, Subject: r.name, Value: 1, Threshold: 0, Detail: err.Error()}
		if t.cfg.ReplicaFailOpen {
			u.Value, u.Detail = 0, "fail open: "+err.Error()
		}
		t.forget(ReplicaLag, r.name)
		t.set(u)
		return
	}
	t.fails.standbyRead(r.name)
	lag := unknown
	if !applied.IsZero() {
		lag = t.beatLag(now, applied)
	}
	t.mu.Lock()
	t.pacer.lagged(lag, t.Clock.Now())
	t.mu.Unlock()
	t.set(Reading{Kind: ReplicaUnreachable, Subject: r.name, Value: 0, Threshold: 0})
	t.set(Reading{Kind: ReplicaLag, Subject: r.name, Value: lag, Threshold: threshold, Unit: "s"})
}

// settleEvery is how often a standby is read while it applies a fresh
// heartbeat: a healthy one does within a few milliseconds.
const settleEvery = 5 * time.Millisecond

func (t *Throttler) lastBeatAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastBeat
}

// newestBeat is the newest heartbeat written, zero when none was.
func (t *Throttler) newestBeat() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.beats) == 0 {
		return time.Time{}
	}
	return t.beats[len(t.beats)-1]
}

// applied reads the standby's clock and the newest heartbeat it has
// applied (zero: none yet).
func (r *replica) applied(ctx context.Context, timeout time.Duration) (now, applied time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if r.conn == nil {
		cc, err := dbconn.Conn(r.url)
		if err != nil {
			return now, applied, err
		}
		cc.ConnectTimeout = timeout
		if r.conn, err = pgx.ConnectConfig(ctx, cc); err != nil {
			// The cause once, without the TLS attempt pgx makes first.
			return now, applied, dbconn.Classify(err)
		}
	}
	var beat *time.Time
	if err := r.conn.QueryRow(ctx, `SELECT clock_timestamp(), max(beat) FROM inboxkeeper.heartbeat`).Scan(&now, &beat); err != nil {
		return now, applied, err
	}
	if beat != nil {
		applied = *beat
	}
	return now, applied, nil
}
