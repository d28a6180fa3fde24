package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
)

// collector measures one or more signals once; Start runs each on its own
// ticker, MeasureOnce runs them all once.
type collector struct {
	name     string
	interval time.Duration
	run      func(ctx context.Context)
	close    func()
}

func (t *Throttler) collectors() []collector {
	cs := []collector{
		{name: "pause", interval: time.Second, run: t.measurePause},
		{name: "primary", interval: t.cfg.StatsInterval, run: t.measurePrimary},
	}
	if len(t.cfg.ReplicaURLs) > 0 {
		cs = append(cs, collector{name: "heartbeat", interval: t.cfg.HeartbeatInterval, run: t.writeHeartbeat})
		for _, u := range t.cfg.ReplicaURLs {
			r := &replica{url: u, name: replicaName(u)}
			cs = append(cs, collector{name: "replica " + r.name, interval: t.cfg.HeartbeatInterval,
				run: func(ctx context.Context) { t.measureReplica(ctx, r) }, close: r.closeConn})
		}
	}
	if t.cfg.Query != "" {
		cs = append(cs, collector{name: "query", interval: time.Second, run: t.measureQuery})
	}
	return cs
}

// Start measures every signal once, so the first batch is already checked,
// then keeps measuring in the background until Stop.
func (t *Throttler) Start(ctx context.Context) {
	ctx, t.cancel = context.WithCancel(ctx)
	cs := t.collectors()
	if len(t.cfg.ReplicaURLs) > 0 {
		// A first heartbeat before the first reading, so a healthy standby
		// is not reported as lagging for lack of one.
		t.writeHeartbeat(ctx)
	}
	for _, c := range cs {
		c.run(ctx)
	}
	t.wg.Add(2)
	go func() { defer t.wg.Done(); t.watchLocks(ctx) }()
	go func() { defer t.wg.Done(); t.keepAlive(ctx) }()
	for _, c := range cs {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if c.close != nil {
				defer c.close()
			}
			tick := time.NewTicker(c.interval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					c.run(ctx)
				}
			}
		}()
	}
}

// Stop ends the collectors and waits for them.
func (t *Throttler) Stop() {
	if t.cancel != nil {
		t.cancel()
	}
	t.wg.Wait()
}

// MeasureOnce takes one reading of every signal without starting anything:
// what `inboxkeeper status` shows.
func (t *Throttler) MeasureOnce(ctx context.Context) {
	for _, c := range t.collectors() {
		c.run(ctx)
		if c.close != nil {
			c.close()
		}
	}
}

// keepAlive pings the primary while the deleter may be waiting, so that a
// long pause does not end with a dead idle connection.
func (t *Throttler) keepAlive(ctx context.Context) {
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = t.pool.Ping(ctx)
		}
	}
}

func (t *Throttler) writeHeartbeat(ctx context.Context) {
	_, err := t.pool.Exec(ctx, `INSERT INTO inboxkeeper.heartbeat (id, beat) VALUES (true, clock_timestamp())
ON CONFLICT (id) DO UPDATE SET beat = excluded.beat`)
	if err != nil && ctx.Err() == nil {
		t.log.Debug("throttle: heartbeat write failed", "error", err)
	}
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
	threshold := t.cfg.MaxReplicaLag.Seconds()
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
			return 0, fmt.Errorf("connect: %w", errors.Unwrap(err))
		}
	}
	var lag *float64
	err := r.conn.QueryRow(ctx, `SELECT extract(epoch FROM clock_timestamp() - max(beat))::float8 FROM inboxkeeper.heartbeat`).Scan(&lag)
	if err != nil {
		return 0, err
	}
	if lag == nil {
		return math.Inf(1), nil
	}
	return max(*lag, 0), nil
}

// measurePrimary reads pg_stat_replication (every standby, listed or not)
// and the logical slots.
func (t *Throttler) measurePrimary(ctx context.Context) {
	// On a standby (the daemon idles there) pg_current_wal_lsn() fails:
	// nothing is measured until it is promoted.
	rows, err := t.pool.Query(ctx, `SELECT coalesce(nullif(application_name, ''), client_addr::text, pid::text),
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::float8 END,
       extract(epoch FROM replay_lag)::float8,
       pg_wal_lsn_diff(replay_lsn, '0/0')::float8
FROM pg_stat_replication`)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("throttle: read pg_stat_replication", "error", err)
		}
		return
	}
	seen := map[string]bool{}
	for rows.Next() {
		var name string
		var bytes, lag, replayed *float64
		if err := rows.Scan(&name, &bytes, &lag, &replayed); err != nil {
			t.log.Warn("throttle: read pg_stat_replication", "error", err)
			rows.Close()
			return
		}
		subject := "walsender " + name
		seen[subject] = true
		if bytes != nil {
			t.set(Reading{Kind: ReplicaLagBytes, Subject: subject, Value: *bytes, Threshold: float64(t.cfg.MaxReplicaLagBytes), Unit: "bytes"})
			if replayed != nil {
				if q, rate, ok := t.queueLag(name, *replayed, *bytes); ok {
					queue := subject + " (queue)"
					seen[queue] = true
					t.set(Reading{Kind: ReplicaLag, Subject: queue, Value: q, Threshold: t.cfg.MaxReplicaLag.Seconds(), Unit: "s",
						Detail: fmt.Sprintf("WAL not yet replayed / replay rate %.1f MiB/s", rate/(1<<20))})
				}
			}
		}
		// replay_lag is NULL when the standby is idle and caught up.
		v := 0.0
		if lag != nil {
			v = *lag
		}
		t.set(Reading{Kind: ReplicaLag, Subject: subject, Value: v, Threshold: t.cfg.MaxReplicaLag.Seconds(), Unit: "s", Detail: "replay_lag"})
	}
	rows.Close()
	t.dropWalsenders(seen)

	if t.cfg.MaxSlotLagBytes <= 0 {
		return
	}
	rows, err = t.pool.Query(ctx, `SELECT slot_name::text, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8
FROM pg_replication_slots WHERE slot_type = 'logical' AND confirmed_flush_lsn IS NOT NULL AND NOT pg_is_in_recovery()`)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("throttle: read pg_replication_slots", "error", err)
		}
		return
	}
	slots := map[string]bool{}
	for rows.Next() {
		var name string
		var bytes float64
		if err := rows.Scan(&name, &bytes); err != nil {
			rows.Close()
			return
		}
		slots[name] = true
		t.set(Reading{Kind: SlotLag, Subject: name, Value: bytes, Threshold: float64(t.cfg.MaxSlotLagBytes), Unit: "bytes"})
	}
	rows.Close()
	t.drop(SlotLag, slots)
}

// sender remembers a walsender's replay position, to measure how fast the
// standby applies WAL.
type sender struct {
	replayed, behind float64
	at               time.Time
	rate             float64 // bytes/s, measured only while a backlog existed
}

// backlogBytes is how far behind a standby must be for its replay progress
// to measure its apply rate rather than the primary's write rate.
const backlogBytes = 1 << 20

// queueLag estimates how long the standby needs to apply the WAL it has not
// replayed yet. The heartbeat only ages at (1 - apply/write) seconds per
// second while the queue grows at write/apply seconds per second, so by the
// time the heartbeat says 1 s, many seconds of WAL are queued; this reading
// sees the queue itself.
func (t *Throttler) queueLag(name string, replayed, behind float64) (lag, rate float64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	s := t.senders[name]
	if s == nil {
		s = &sender{}
		t.senders[name] = s
	} else if dt := now.Sub(s.at).Seconds(); dt > 0 && s.behind > backlogBytes && replayed >= s.replayed {
		inst := (replayed - s.replayed) / dt
		if s.rate == 0 {
			s.rate = inst
		} else {
			s.rate = 0.7*s.rate + 0.3*inst
		}
	}
	s.replayed, s.behind, s.at = replayed, behind, now
	if s.rate <= 0 {
		return 0, 0, false
	}
	return behind / s.rate, s.rate, true
}

// BatchBytesCap is the most WAL one batch should write: half of what the
// slowest standby with a measured replay rate applies in MAX_REPLICA_LAG.
// A batch is atomic, so its WAL reaches the standby whole; a batch bigger
// than this alone would push the lag past the threshold. 0 means no cap.
func (t *Throttler) BatchBytesCap() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	limit := 0.0
	for _, s := range t.senders {
		if s.rate <= 0 {
			continue
		}
		if c := t.cfg.MaxReplicaLag.Seconds() * s.rate / 2; limit == 0 || c < limit {
			limit = c
		}
	}
	return limit
}

// dropWalsenders forgets pg_stat_replication readings of standbys that went
// away; heartbeat readings of listed standbys are kept.
func (t *Throttler) dropWalsenders(seen map[string]bool) {
	for _, kind := range []string{ReplicaLagBytes, ReplicaLag} {
		keep := map[string]bool{}
		for _, r := range t.Readings() {
			if r.Kind == kind && (seen[r.Subject] || r.Detail != "replay_lag") {
				keep[r.Subject] = true
			}
		}
		t.drop(kind, keep)
	}
}

// measureQuery runs the custom throttle query; an error throttles (fail
// closed), and says why.
func (t *Throttler) measureQuery(ctx context.Context) {
	var v *float64
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := t.pool.QueryRow(qctx, t.cfg.Query).Scan(&v)
	if ctx.Err() != nil {
		return
	}
	r := Reading{Kind: CustomQuery, Threshold: 0}
	switch {
	case err != nil:
		r.Value, r.Detail = math.Inf(1), "query failed: "+err.Error()
	case v != nil:
		r.Value = *v
	}
	t.set(r)
}

func (t *Throttler) measurePause(ctx context.Context) {
	p, err := ActivePause(ctx, t.pool)
	if ctx.Err() != nil {
		return
	}
	r := Reading{Kind: ManualPause, Threshold: 0}
	switch {
	case err != nil:
		t.log.Warn("throttle: read manual pause", "error", err)
		return
	case p != nil:
		r.Value, r.Detail = 1, p.String()
	}
	t.set(r)
}
