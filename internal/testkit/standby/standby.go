// Package standby slows a streaming standby down and measures how far it
// falls behind, independently of the daemon: for the benchmarks and the
// tests that hold the throttle to its promise (the peak lag behind an
// apply-capped standby).
//
// How a standby is slowed: a Governor caps its apply rate. Every 5 ms it
// reads pg_last_wal_replay_lsn() and pauses replay (pg_wal_replay_pause)
// while replay is ahead of a budget that grows at the rate (idle time saves
// up at most 1 MB). This models a standby that applies WAL more slowly than
// the primary writes it (slower disks, busy with reads), the case the
// throttle is for. Left alone, a standby on the test machine replays a
// DELETE at about 200 MB/s and never lags. Between two polls replay runs
// free, typically 1 MB (0.12 s at 8 MB/s), paid back by the next pause. Not
// recovery_min_apply_delay: it holds each commit back by a fixed delay but
// leaves the apply rate alone, so a big DELETE lags no more than an idle
// primary. Not a small shared_buffers: the OS cache and the machine would
// decide the slowdown. With a WAL budget a deletion's lag is about its WAL
// over the rate on any machine, and an idle primary's heartbeats (a few
// hundred bytes) are never held back.
//
// How the lag is measured: a Sampler updates a heartbeat row of its own
// (lag_heartbeat) on the primary every 50 ms and reads clock_timestamp() -
// max(beat) on the standby every 50 ms; it also reads replay_lag and the
// replay position's distance in bytes from pg_stat_replication, for
// context. Run the standby with max_standby_streaming_delay = -1: once it
// lags more than that delay (30 s by default), replay cancels any query in
// its way at once, the sampler's and the governor's included; -1 makes
// replay wait for them instead, which costs it nothing because they take a
// millisecond.
package standby

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// SampleEvery is how often the Sampler beats and reads.
const SampleEvery = 50 * time.Millisecond

// Peaks are the highest readings since the last Take.
type Peaks struct {
	Lag       float64 // heartbeat lag on the standby, seconds
	ReplayLag float64 // pg_stat_replication.replay_lag, seconds
	Bytes     int64   // current WAL position minus replay_lsn
}

// Sampler measures a standby's lag every SampleEvery with a heartbeat of
// its own.
type Sampler struct {
	mu   sync.Mutex
	last float64
	peak Peaks
	errs int
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// heartbeatSQL makes the sampler's heartbeat row on the primary.
const heartbeatSQL = `CREATE TABLE IF NOT EXISTS lag_heartbeat (id boolean PRIMARY KEY, beat timestamptz NOT NULL);
INSERT INTO lag_heartbeat VALUES (true, clock_timestamp()) ON CONFLICT (id) DO UPDATE SET beat = excluded.beat`

// StartSampler creates the heartbeat row on the primary, waits (at most
// a minute) until the standby has it, and samples until Stop. logf gets the
// failed reads and writes (counted by Errors).
func StartSampler(ctx context.Context, primary, standby string, logf func(string, ...any)) (*Sampler, error) {
	if err := exec(ctx, primary, heartbeatSQL); err != nil {
		return nil, fmt.Errorf("standby: the heartbeat row: %w", err)
	}
	if err := WaitCaughtUp(ctx, primary, standby, time.Minute); err != nil {
		return nil, fmt.Errorf("standby: the heartbeat row on the standby: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &Sampler{stop: cancel}
	s.loop(sctx, primary, "UPDATE lag_heartbeat SET beat = clock_timestamp() RETURNING true", logf, func(r pgx.Row) error {
		return r.Scan(new(bool))
	})
	s.loop(sctx, standby, "SELECT extract(epoch FROM clock_timestamp() - max(beat))::float8 FROM lag_heartbeat", logf, func(r pgx.Row) error {
		var lag float64
		if err := r.Scan(&lag); err != nil {
			return err
		}
		s.mu.Lock()
		s.last = lag
		s.peak.Lag = max(s.peak.Lag, lag)
		s.mu.Unlock()
		return nil
	})
	s.loop(sctx, primary, `SELECT coalesce(max(extract(epoch FROM replay_lag)), 0)::float8,
       coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::bigint FROM pg_stat_replication`, logf, func(r pgx.Row) error {
		var lag float64
		var bytes int64
		if err := r.Scan(&lag, &bytes); err != nil {
			return err
		}
		s.mu.Lock()
		s.peak.ReplayLag = max(s.peak.ReplayLag, lag)
		s.peak.Bytes = max(s.peak.Bytes, bytes)
		s.mu.Unlock()
		return nil
	})
	return s, nil
}

// Take returns the peaks since the last Take and starts again from the
// latest reading.
func (s *Sampler) Take() Peaks {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peak
	s.peak = Peaks{Lag: s.last}
	return p
}

// Latest is the last heartbeat lag read on the standby, seconds.
func (s *Sampler) Latest() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Idle reads two idle seconds of lag, after half a second for the first
// readings to see the heartbeat as the work before left it: what caught up
// looks like. The median (a slow commit of a heartbeat on a shared machine
// makes a spike), and the lowest and highest readings.
func (s *Sampler) Idle(ctx context.Context) (median, lo, hi float64, err error) {
	var idle []float64
	for i := range 50 {
		select {
		case <-ctx.Done():
			return 0, 0, 0, ctx.Err()
		case <-time.After(SampleEvery):
		}
		if i >= 10 {
			idle = append(idle, s.Latest())
		}
	}
	slices.Sort(idle)
	return idle[len(idle)/2], idle[0], idle[len(idle)-1], nil
}

// Errors counts the failed reads and writes.
func (s *Sampler) Errors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs
}

// Stop ends the sampling and waits for it.
func (s *Sampler) Stop() {
	s.stop()
	s.wg.Wait()
}

// loop runs sql on url every SampleEvery until ctx ends, on a connection
// of its own, so that a slow commit of the heartbeat does not delay the
// reading, nor the other way round.
func (s *Sampler) loop(ctx context.Context, url, sql string, logf func(string, ...any), row func(pgx.Row) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		tick := time.NewTicker(SampleEvery)
		defer tick.Stop()
		for {
			err := func() error {
				qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if conn == nil {
					c, err := pgx.Connect(qctx, url)
					if err != nil {
						return err
					}
					conn = c
				}
				return row(conn.QueryRow(qctx, sql))
			}()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.mu.Lock()
				s.errs++
				s.mu.Unlock()
				logf("sampler: %v", err)
				if conn != nil {
					conn.Close(context.Background())
					conn = nil
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// Governor caps a standby's apply rate; its counters say how hard it
// worked since the last Take.
type Governor struct {
	rate float64 // bytes/s
	mu   sync.Mutex
	held time.Duration // replay paused, summed
	gap  time.Duration // longest time between two polls: replay runs free meanwhile
	stop context.CancelFunc
	done chan struct{}
}

// CapApply starts a Governor that caps the apply rate of the standby at
// url to rate bytes of WAL a second, until Stop. logf gets its failures
// (it retries, on a new connection if need be).
func CapApply(ctx context.Context, url string, rate float64, logf func(string, ...any)) *Governor {
	gctx, cancel := context.WithCancel(ctx)
	g := &Governor{rate: rate, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.run(gctx, url, logf)
	}()
	return g
}

// Take returns how long replay was paused since the last Take, and the
// longest time between two polls.
func (g *Governor) Take() (held, gap time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	held, gap, g.held, g.gap = g.held, g.gap, 0, 0
	return held, gap
}

// Stop ends the cap, lets replay run free again, and waits for it.
func (g *Governor) Stop() {
	g.stop()
	<-g.done
}

// run caps the apply rate until ctx ends, then lets replay run free again.
// Replay runs at full speed between polls, so it overshoots by what it
// applies in one poll interval; the next pause makes up for it. A failed
// poll is retried: the pause state lives in the server, so nothing is lost
// meanwhile.
func (g *Governor) run(ctx context.Context, url string, logf func(string, ...any)) {
	const every, burst = 5 * time.Millisecond, 1 << 20
	var conn *pgx.Conn
	defer func() {
		bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if conn == nil || conn.IsClosed() {
			conn, _ = pgx.Connect(bg, url)
		}
		if conn != nil {
			if _, err := conn.Exec(bg, "SELECT pg_wal_replay_resume()"); err != nil {
				logf("governor: resume replay: %v", err)
			}
			conn.Close(bg)
		}
	}()
	var budget float64 // the WAL position replay may reach
	paused, first := false, true
	failures := 0
	last := time.Now()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		err := func() error {
			if conn == nil || conn.IsClosed() {
				c, err := pgx.Connect(ctx, url)
				if err != nil {
					return err
				}
				conn = c
			}
			var replayed float64
			if err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::float8").Scan(&replayed); err != nil {
				return err
			}
			now := time.Now()
			if first {
				budget, first = replayed, false
			}
			budget = min(budget+g.rate*now.Sub(last).Seconds(), replayed+burst)
			g.mu.Lock()
			g.gap = max(g.gap, now.Sub(last))
			if paused {
				g.held += now.Sub(last)
			}
			g.mu.Unlock()
			last = now
			if over := replayed >= budget; over != paused {
				sql := "SELECT pg_wal_replay_resume()"
				if over {
					sql = "SELECT pg_wal_replay_pause()"
				}
				if _, err := conn.Exec(ctx, sql); err != nil {
					return err
				}
				paused = over
			}
			return nil
		}()
		if ctx.Err() != nil {
			return
		}
		switch { // one line per streak of failures, not one per poll
		case err != nil && failures == 0:
			logf("governor: %v (retrying)", err)
		case err == nil && failures > 0:
			logf("governor: working again after %d failed polls", failures)
		}
		if err != nil {
			failures++
		} else {
			failures = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// WaitCaughtUp waits (at most within) until the standby at standbyURL has
// replayed everything the primary at primaryURL has inserted so far.
func WaitCaughtUp(ctx context.Context, primaryURL, standbyURL string, within time.Duration) error {
	var target string
	if err := queryRow(ctx, primaryURL, "SELECT pg_current_wal_insert_lsn()::text", &target); err != nil {
		return err
	}
	return waitFor(ctx, standbyURL, "SELECT pg_last_wal_replay_lsn() >= '"+target+"'::pg_lsn", within)
}

// waitFor polls sql on url every 50 ms until it returns true, at most
// within.
func waitFor(ctx context.Context, url, sql string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for {
		var ok bool
		if err := conn.QueryRow(ctx, sql).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not true within %s: %s", within, sql)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func exec(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func queryRow(ctx context.Context, url, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dest...)
}
