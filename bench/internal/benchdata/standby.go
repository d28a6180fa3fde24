package benchdata

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Peaks are the highest readings of a LagSampler since its last Take.
type Peaks struct {
	Lag       float64 // heartbeat lag on the standby, seconds
	ReplayLag float64 // pg_stat_replication.replay_lag, seconds
	Bytes     int64   // current WAL position minus replay_lsn
}

// LagSampler measures a standby's lag every SampleEvery, independently of
// the daemon, with a heartbeat of its own: it updates the row of
// bench_heartbeat (HeartbeatDDL) on the primary and reads clock_timestamp()
// minus it on the standby; it also reads replay_lag and the replay
// position's distance in bytes from pg_stat_replication, for context.
type LagSampler struct {
	mu   sync.Mutex
	last float64
	peak Peaks
	errs int
}

// HeartbeatDDL makes the heartbeat row a LagSampler updates.
const HeartbeatDDL = `CREATE TABLE bench_heartbeat (id boolean PRIMARY KEY, beat timestamptz NOT NULL);
INSERT INTO bench_heartbeat VALUES (true, clock_timestamp())`

// SampleEvery is how often a LagSampler reads.
const SampleEvery = 50 * time.Millisecond

// Take returns the peaks since the last Take and starts again from the
// latest reading.
func (s *LagSampler) Take() Peaks {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peak
	s.peak = Peaks{Lag: s.last}
	return p
}

// Latest is the latest heartbeat lag, seconds.
func (s *LagSampler) Latest() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Errors counts the failed reads and writes.
func (s *LagSampler) Errors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs
}

// Start samples until ctx ends.
func (s *LagSampler) Start(ctx context.Context, primary, standby string, logf func(string, ...any)) {
	// Each loop has its own connection, so a slow commit of the heartbeat
	// does not delay the reading, nor the other way round.
	loop := func(url, sql string, row func(pgx.Row) error) {
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
	}
	go loop(primary, "UPDATE bench_heartbeat SET beat = clock_timestamp() RETURNING true", func(r pgx.Row) error {
		return r.Scan(new(bool))
	})
	go loop(standby, "SELECT extract(epoch FROM clock_timestamp() - max(beat))::float8 FROM bench_heartbeat", func(r pgx.Row) error {
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
	go loop(primary, `SELECT coalesce(max(extract(epoch FROM replay_lag)), 0)::float8,
       coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::bigint FROM pg_stat_replication`, func(r pgx.Row) error {
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
}

// Governor caps a standby's apply rate at Rate bytes of WAL a second: every
// 5 ms it reads pg_last_wal_replay_lsn() and pauses replay
// (pg_wal_replay_pause) while replay is ahead of a budget that grows at
// that rate (idle time saves up at most 1 MB). Its counters say how hard it
// worked during a phase.
type Governor struct {
	Rate float64 // bytes/s
	mu   sync.Mutex
	held time.Duration // replay paused, summed
	gap  time.Duration // longest time between two polls: replay runs free meanwhile
}

// Take returns how long replay was paused and the longest time between two
// polls since the last Take.
func (g *Governor) Take() (held, gap time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	held, gap, g.held, g.gap = g.held, g.gap, 0, 0
	return held, gap
}

// Run caps the apply rate until ctx ends, then lets replay run free again.
// Replay runs at full speed between polls, so it overshoots by what it
// applies in one poll interval; the next pause makes up for it. A failed
// poll is retried (on a new connection if need be): the pause state lives
// in the server, so nothing is lost meanwhile.
func (g *Governor) Run(ctx context.Context, url string, logf func(string, ...any)) {
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
			budget = min(budget+g.Rate*now.Sub(last).Seconds(), replayed+burst)
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

// WaitReplay waits until standby has replayed everything primary has
// written so far and, when lagBelow > 0, lag reads under it; 20 minutes at
// most.
func WaitReplay(ctx context.Context, primary, standby *pgxpool.Pool, lag func() float64, lagBelow float64) error {
	var target string
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Minute)
	for {
		var done bool
		if err := standby.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", target).Scan(&done); err != nil {
			return fmt.Errorf("read the standby's replay position: %w", err)
		}
		if done && (lagBelow <= 0 || lag() < lagBelow) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not catch up with %s within 20 minutes", target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
