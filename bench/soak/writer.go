package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// writerConns is how many sessions one table's writer inserts on: at
// 1,000 rows/s an insert must take under 4 ms on average, which a loaded
// 2-core machine does not always give one session.
const writerConns = 4

// insertSQL inserts one row that expires after $4 (an interval): the
// recommended layout's columns and a payload that brings the row to the
// size asked for.
const insertSQL = `INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until, payload)
VALUES ($1, $2, sha256($2::bytea), 'applied', now(), now(), now() + $3::interval, $4)`

// writer inserts into one table at a fixed rate, open loop: insert i is due
// at start + i/rate whatever the ones before took, and each insert's own
// time is recorded (from its start to its end).
type writer struct {
	url     string
	rate    float64
	expiry  time.Duration
	payload int // bytes of payload per row

	inserted  atomic.Int64
	late      atomic.Int64 // inserts that started more than 100 ms after they were due
	mu        sync.Mutex
	latencies []time.Duration
	doneAt    []int64 // when each insert ended, Unix nanoseconds
	err       error
}

// run inserts until ctx ends, on writerConns sessions of its own, which it
// closes before it returns (so that their statistics are written).
func (w *writer) run(ctx context.Context) error {
	conns := make([]*pgx.Conn, writerConns)
	for i := range conns {
		cfg, err := pgx.ParseConfig(w.url)
		if err != nil {
			return err
		}
		// One statement, one transaction, no prepared statements: the
		// benchmark counts its transactions exactly. What is timed is
		// waiting, not the disk flush (the cleaners commit the same way).
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		cfg.RuntimeParams["synchronous_commit"] = "off"
		cfg.RuntimeParams["application_name"] = "soak writer"
		if conns[i], err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return err
		}
		defer conns[i].Close(context.WithoutCancel(ctx))
	}
	start := time.Now()
	every := time.Duration(float64(time.Second) / w.rate)
	var wg sync.WaitGroup
	for k, conn := range conns {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1<<16)
			done := make([]int64, 0, 1<<16)
			for i := int64(k); ; i += writerConns {
				due := start.Add(time.Duration(i) * every)
				if wait := time.Until(due); wait > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(wait):
					}
				} else if -wait > 100*time.Millisecond {
					w.late.Add(1)
				}
				if ctx.Err() != nil {
					break
				}
				began := time.Now()
				_, err := conn.Exec(ctx, insertSQL, fmt.Sprintf("c%d", i%4), randomID(), w.expiry.String(), payloadOf(w.payload))
				if ctx.Err() != nil {
					break
				}
				if err != nil {
					w.fail(err)
					break
				}
				ended := time.Now()
				lat = append(lat, ended.Sub(began))
				done = append(done, ended.UnixNano())
				w.inserted.Add(1)
			}
			w.mu.Lock()
			w.latencies = append(w.latencies, lat...)
			w.doneAt = append(w.doneAt, done...)
			w.mu.Unlock()
		})
	}
	wg.Wait()
	return w.err
}

func (w *writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// insertedBy says how many inserts had ended at start + d: the live rows
// at d are insertedBy(d) - insertedBy(d - expiry).
func (w *writer) insertedBy(start time.Time) func(d time.Duration) int64 {
	w.mu.Lock()
	done := slices.Clone(w.doneAt)
	w.mu.Unlock()
	slices.Sort(done)
	return func(d time.Duration) int64 {
		at := start.Add(d).UnixNano()
		i, _ := slices.BinarySearch(done, at+1)
		return int64(i)
	}
}

// latency is a writer's insert times: p50, p99, p999 and the longest.
type latency struct {
	inserts             int
	p50, p99, p999, max time.Duration
}

func (w *writer) latency() latency {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := slices.Clone(w.latencies)
	slices.Sort(s)
	if len(s) == 0 {
		return latency{}
	}
	return latency{inserts: len(s), p50: quantile(s, 0.5), p99: quantile(s, 0.99), p999: quantile(s, 0.999), max: s[len(s)-1]}
}

// quantile is the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// randomID is a message id as producers make them: a random UUID, so that
// the primary key's inserts land all over its index.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// payloadOf is n bytes of hex that does not compress.
func payloadOf(n int) string {
	if n <= 0 {
		return ""
	}
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}
