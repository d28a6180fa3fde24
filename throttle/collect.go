package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	// The heartbeat also runs without listed standbys: while a standby has
	// a backlog, its small writes make the walreceivers report their replay
	// positions, which the pacer reads.
	cs = append(cs, collector{name: "heartbeat", interval: t.cfg.StatsInterval, run: t.beat})
	if len(t.cfg.ReplicaURLs) > 0 {
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
			every(ctx, c.interval, c.run)
		}()
	}
}

// every runs fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn(ctx)
		}
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
// what `inboxkeeper status` shows. When a standby streams, it then reads
// pg_stat_replication for another trailSpan, so that its apply rate is
// measured (or at least its recent progress).
func (t *Throttler) MeasureOnce(ctx context.Context) {
	for _, c := range t.collectors() {
		c.run(ctx)
		if c.close != nil {
			c.close()
		}
	}
	if len(t.Paces()) == 0 {
		return
	}
	tick := time.NewTicker(t.cfg.StatsInterval)
	defer tick.Stop()
	end := time.After(trailSpan)
	for {
		select {
		case <-ctx.Done():
			return
		case <-end:
			return
		case <-tick.C:
			t.measurePrimary(ctx)
		}
	}
}

// keepAlive pings the primary while the deleter may be waiting, so that a
// long pause does not end with a dead idle connection.
func (t *Throttler) keepAlive(ctx context.Context) {
	every(ctx, 30*time.Second, func(ctx context.Context) { _ = t.pool.Ping(ctx) })
}

// beat writes the heartbeat every HEARTBEAT_INTERVAL when standbys are
// listed, and every STATS_INTERVAL while a standby has a backlog.
func (t *Throttler) beat(ctx context.Context) {
	now := t.cfg.Clock.Now()
	t.mu.Lock()
	every := time.Duration(math.MaxInt64)
	if len(t.cfg.ReplicaURLs) > 0 {
		every = t.cfg.HeartbeatInterval
	}
	if t.pacer.backlog() {
		every = min(every, t.cfg.StatsInterval)
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
	t.lastBeat = t.cfg.Clock.Now()
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
	threshold := t.limits().maxLag.Seconds()
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
	t.pacer.lagged(lag, t.cfg.Clock.Now())
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

// walsender is one row of pg_stat_replication.
type walsender struct {
	name     string
	recovery bool     // the daemon's database is a standby itself: nothing to pace
	behind   *float64 // NULL before the standby's first reply
	lag      *float64 // replay_lag: NULL when idle and caught up
	replayed *float64
	queued   *float64 // received by the standby, not replayed yet
}

// slot is one logical slot with a confirmed position.
type slot struct {
	name   string
	behind float64
}

// Signals whose failures are logged through failLog.
const (
	readStatReplication = "pg_stat_replication"
	readSlots           = "pg_replication_slots"
	readPause           = "manual pause"
	readLocks           = "lock waits"
	writeBeat           = "heartbeat write"
)

// measurePrimary reads pg_stat_replication (every standby, listed or not)
// and the logical slots. A read that fails, also part-way through its rows,
// is a failed reading: it throttles (fail closed) and says why.
func (t *Throttler) measurePrimary(ctx context.Context) {
	// On a standby (the daemon idles there) pg_current_wal_insert_lsn()
	// fails: nothing is measured until it is promoted.
	//
	// Behind is measured from the insert position, not pg_current_wal_lsn()
	// (the written one): the batches commit with synchronous_commit = off,
	// and so may the application, so megabytes of WAL can sit in the WAL
	// buffers for up to wal_writer_delay before they are written. Read
	// from the written position, that WAL was in no reading while the
	// batches' own share of it was already dropped from the unsent WAL
	// (readStarted), and the window admitted batches on top of it
	// (docs/design/throttle-pacing.md, "Measured from the insert position").
	began := t.cfg.Clock.Now()
	t.mu.Lock()
	t.pacer.readStarted(began)
	t.mu.Unlock()
	senders, err := queryRows(ctx, t.pool, `SELECT coalesce(nullif(application_name, ''), client_addr::text, pid::text), pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_insert_lsn(), replay_lsn)::float8 END,
       extract(epoch FROM replay_lag)::float8,
       pg_wal_lsn_diff(replay_lsn, '0/0')::float8,
       pg_wal_lsn_diff(write_lsn, replay_lsn)::float8
FROM pg_stat_replication`, func(row pgx.CollectableRow, w *walsender) error {
		return row.Scan(&w.name, &w.recovery, &w.behind, &w.lag, &w.replayed, &w.queued)
	})
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.readFailed(readStatReplication, err)
	} else {
		t.fails.ok(readStatReplication)
		t.forget(ReplicaUnreachable, readStatReplication)
		t.walsenders(senders, t.cfg.Clock.Now())
	}
	if t.cfg.MaxSlotLagBytes > 0 {
		t.measureSlots(ctx)
	}
}

// readFailed fails closed on a read of the primary's views: a reading that
// throttles, and a hold in the pacer.
func (t *Throttler) readFailed(signal string, err error) {
	t.fails.failed(signal, err)
	t.mu.Lock()
	if signal == readStatReplication {
		t.pacer.failure = "cannot read " + signal + ": " + err.Error()
	}
	t.mu.Unlock()
	kind := ReplicaUnreachable
	if signal == readSlots {
		kind = SlotLag
	}
	t.set(Reading{Kind: kind, Subject: signal, Value: math.Inf(1), Threshold: 0, Detail: "cannot read: " + err.Error()})
}

// walsenders stores the readings of one pg_stat_replication read and feeds
// the pacer.
func (t *Throttler) walsenders(senders []walsender, now time.Time) {
	seen := map[string]bool{}
	paced := map[string]bool{}
	t.mu.Lock()
	t.pacer.failure = ""
	for _, w := range senders {
		if w.recovery {
			continue // the daemon runs on a standby: nothing to pace
		}
		paced[w.name] = true
		replayed, behind, queued := -1.0, 0.0, 0.0 // no replay position reported yet: hold
		if w.replayed != nil && w.behind != nil {
			replayed, behind = *w.replayed, *w.behind
		}
		if w.queued != nil {
			queued = *w.queued
		}
		t.pacer.observe(w.name, replayed, behind, queued, now)
	}
	t.pacer.forget(paced)
	paces := t.pacer.paces()
	t.mu.Unlock()
	rates := map[string]Pace{}
	for _, p := range paces {
		rates[p.Standby] = p
	}
	for _, w := range senders {
		subject := "walsender " + w.name
		seen[subject] = true
		if w.behind != nil {
			t.set(Reading{Kind: ReplicaLagBytes, Subject: subject, Value: *w.behind, Threshold: float64(t.limits().maxLagBytes), Unit: "bytes"})
			if p := rates[w.name]; p.Measured && p.ApplyRate > 0 {
				queue := subject + " (queue)"
				seen[queue] = true
				t.set(Reading{Kind: ReplicaLag, Subject: queue, Value: *w.behind / p.ApplyRate, Threshold: t.limits().maxLag.Seconds(), Unit: "s",
					Detail: fmt.Sprintf("WAL not yet replayed / apply rate %s/s", fmtBytes(p.ApplyRate))})
			}
		}
		// replay_lag is NULL when the standby is idle and caught up.
		v := 0.0
		if w.lag != nil {
			v = *w.lag
		}
		t.set(Reading{Kind: ReplicaLag, Subject: subject, Value: v, Threshold: t.limits().maxLag.Seconds(), Unit: "s", Detail: "replay_lag"})
	}
	if t.metrics != nil {
		t.metrics.paces(paces)
	}
	t.dropWalsenders(seen)
}

func (t *Throttler) measureSlots(ctx context.Context) {
	slots, err := queryRows(ctx, t.pool, `SELECT slot_name::text, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::float8
FROM pg_replication_slots WHERE slot_type = 'logical' AND confirmed_flush_lsn IS NOT NULL AND NOT pg_is_in_recovery()`,
		func(row pgx.CollectableRow, s *slot) error { return row.Scan(&s.name, &s.behind) })
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.readFailed(readSlots, err)
		return
	}
	t.fails.ok(readSlots)
	keep := map[string]bool{}
	for _, s := range slots {
		keep[s.name] = true
		t.set(Reading{Kind: SlotLag, Subject: s.name, Value: s.behind, Threshold: float64(t.cfg.MaxSlotLagBytes), Unit: "bytes"})
	}
	t.drop(SlotLag, keep)
}

// dropWalsenders forgets pg_stat_replication readings of standbys that went
// away; heartbeat readings of listed standbys are kept.
func (t *Throttler) dropWalsenders(seen map[string]bool) {
	for _, kind := range []string{ReplicaLagBytes, ReplicaLag} {
		keep := map[string]bool{}
		for _, r := range t.Readings() {
			if r.Kind == kind && (seen[r.Subject] || !strings.HasPrefix(r.Subject, "walsender ")) {
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
	if !t.recorded(ctx, readPause, err) {
		return
	}
	r := Reading{Kind: ManualPause, Threshold: 0}
	if p != nil {
		r.Value, r.Detail = 1, p.String()
	}
	t.set(r)
}

// queryRows runs sql on the pool and reads every row into a T with scan.
// The error is the query's or the first a row met (pgx.CollectRows checks
// rows.Err): a read that breaks off part-way is a failed read, never a
// short one.
func queryRows[T any](ctx context.Context, pool *pgxpool.Pool, sql string, scan func(row pgx.CollectableRow, v *T) error, args ...any) ([]T, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (T, error) {
		var v T
		err := scan(row, &v)
		return v, err
	})
}

// recorded notes in the failure log how a read or write of signal went,
// and says whether its caller goes on with the result: not when ctx ended
// meanwhile (shutting down is no failure), nor when it failed.
func (t *Throttler) recorded(ctx context.Context, signal string, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		t.fails.failed(signal, err)
		return false
	}
	t.fails.ok(signal)
	return true
}
