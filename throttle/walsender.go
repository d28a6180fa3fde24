package throttle

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every standby that streams from the primary (pg_stat_replication),
// listed or not: its replay_lag, the WAL it has not replayed (bytes, and
// the time its apply rate needs for them), and the pacer's readings.
const ReplicaLagBytes = "replica_lag_bytes"

func init() {
	register(kind{name: ReplicaLagBytes, backlog: true, poll: (*Throttler).measureWalsenders, interval: statsInterval,
		idle:   func(t *Throttler) bool { return !t.noStandby() },
		sparse: (*Throttler).noStandby,
		gauge:  &gauge{"inboxkeeper_replica_lag_bytes", "WAL bytes between the primary's current position and a standby's replay position (pg_stat_replication).", "replica"}})
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

// Readings whose failures are logged through failLog.
const (
	readStatReplication = "pg_stat_replication"
	readSlots           = "pg_replication_slots"
	readPause           = "manual pause"
	readLocks           = "lock waits"
	writeBeat           = "heartbeat write"
)

// measureWalsenders reads pg_stat_replication (every standby, listed or
// not). A read that fails, also part-way through its rows, is a failed
// reading: it throttles (fail closed), holds the pacer, and says why.
func (t *Throttler) measureWalsenders(ctx context.Context) {
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
	began := t.Clock.Now()
	// On a Citus coordinator the workers' standbys are read less often
	// (workers.go): the WAL written since the last reading that included
	// them stays counted until the next one.
	workers := t.workersDue(ctx, began)
	if workers || !t.workers.citus {
		t.mu.Lock()
		t.pacer.readStarted(began)
		t.mu.Unlock()
	}
	senders, err := queryRows(ctx, t.pool, `SELECT coalesce(nullif(application_name, ''), client_addr::text, pid::text), pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_insert_lsn(), replay_lsn)::float8 END,
       extract(epoch FROM replay_lag)::float8,
       pg_wal_lsn_diff(replay_lsn, '0/0')::float8,
       pg_wal_lsn_diff(write_lsn, replay_lsn)::float8
FROM pg_stat_replication`, func(row pgx.CollectableRow, w *walsender) error {
		return row.Scan(&w.name, &w.recovery, &w.behind, &w.lag, &w.replayed, &w.queued)
	})
	// The workers' standbys: read now, or as last read (kept, not read
	// again: a stale reading would look like a standby that applies
	// nothing).
	var kept []walsender
	if err == nil && workers {
		var ws []walsender
		if ws, err = t.readWorkers(ctx, began); err != nil {
			err = fmt.Errorf("the workers' standbys: %w", err)
		}
		senders = append(senders, ws...)
	} else if err == nil {
		kept = t.workers.senders
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.readFailed(ReplicaUnreachable, readStatReplication, err)
	} else {
		t.fails.ok(readStatReplication)
		t.forget(ReplicaUnreachable, readStatReplication)
		t.walsenders(senders, kept, t.Clock.Now())
	}
}

// noStandby says the last read of pg_stat_replication found no standby
// (and did not fail): nothing to pace, nothing to export.
func (t *Throttler) noStandby() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pacer.standbys) == 0 && t.pacer.failure == "" && !t.hasReading(ReplicaLagBytes)
}

// hasReading says whether a reading of kind is stored; t.mu is held.
func (t *Throttler) hasReading(kind string) bool {
	for _, r := range t.readings {
		if r.Kind == kind {
			return true
		}
	}
	return false
}

// walsenders stores the readings of one pg_stat_replication read and feeds
// the pacer; kept are standbys (of Citus workers) not read this time, whose
// pacing state and readings stay as they are.
func (t *Throttler) walsenders(senders, kept []walsender, now time.Time) {
	seen := map[string]bool{}
	paced := map[string]bool{}
	t.mu.Lock()
	t.pacer.failure = ""
	for _, w := range kept {
		paced[w.name] = true
		seen["walsender "+w.name], seen["walsender "+w.name+" (queue)"] = true, true
	}
	t.workerStandbys = len(t.workers.senders) > 0
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
			t.set(Reading{Kind: ReplicaLagBytes, Subject: subject, Value: *w.behind, Threshold: float64(t.limits().MaxReplicaLagBytes), Unit: "bytes"})
			if p := rates[w.name]; p.Measured && p.ApplyRate > 0 {
				queue := subject + " (queue)"
				seen[queue] = true
				t.set(Reading{Kind: ReplicaLag, Subject: queue, Value: *w.behind / p.ApplyRate, Threshold: t.limits().MaxReplicaLag.Seconds(), Unit: "s",
					Detail: fmt.Sprintf("WAL not yet replayed / apply rate %s/s", fmtBytes(p.ApplyRate))})
			}
		}
		// replay_lag is NULL when the standby is idle and caught up.
		v := 0.0
		if w.lag != nil {
			v = *w.lag
		}
		t.set(Reading{Kind: ReplicaLag, Subject: subject, Value: v, Threshold: t.limits().MaxReplicaLag.Seconds(), Unit: "s", Detail: "replay_lag"})
	}
	if t.metrics != nil {
		t.metrics.paces(paces)
	}
	t.dropWalsenders(seen)
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
