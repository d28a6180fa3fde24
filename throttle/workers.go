package throttle

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The standbys of a Citus cluster's workers. On a coordinator, a batch on
// a distributed table writes its WAL on the workers, and the workers'
// standbys replay it: pg_stat_replication on the coordinator lists only the
// coordinator's own. So the walsender reading also asks every worker in
// the coordinator's metadata for its physical standbys
// (run_command_on_workers, which connects as the daemon's role, like the
// batches), and the pacer paces against them as against the coordinator's:
// their bytes behind, their apply rate, their window. Logical walsenders
// are left out there: on a worker they are Citus's own shard moves.
//
// run_command_on_workers opens a connection to every worker each time
// (about 35 ms for two or three workers here), so the workers are read
// every CitusStandbyPollInterval, not every statsInterval, while a pass
// asks for batches; between passes (cadence.go) they are read with the
// coordinator's pg_stat_replication, every idleEvery when a standby
// exists and not at all when none does. Until the next reading the WAL the
// batches wrote counts as not replayed (the pacer's unsent WAL is dropped
// only by a reading that includes the workers).

// CitusStandbyPollInterval is how often, on a Citus coordinator, the
// workers' standbys are read.
const CitusStandbyPollInterval = 500 * time.Millisecond

// workerStandbysSQL reads, from the coordinator, every worker's physical
// standbys as JSON rows of walsender fields.
const workerStandbysSQL = `
SELECT nodename || ':' || nodeport, success, result FROM run_command_on_workers($cmd$
SELECT coalesce(json_agg(json_build_array(coalesce(nullif(r.application_name, ''), r.client_addr::text, r.pid::text),
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), r.replay_lsn), extract(epoch FROM r.replay_lag),
       pg_wal_lsn_diff(r.replay_lsn, '0/0'), pg_wal_lsn_diff(r.write_lsn, r.replay_lsn)))::text, '[]')
FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
WHERE a.datname IS NULL -- physical: a logical walsender is connected to a database
$cmd$)`

// workerReads is the state of the workers' reading.
type workerReads struct {
	checked bool      // whether the database is a Citus coordinator is known
	citus   bool      // it is one
	at      time.Time // last reading
	senders []walsender
}

// workersDue reports whether the walsender reading at now also reads the
// workers: on a Citus coordinator, every CitusStandbyPollInterval.
func (t *Throttler) workersDue(ctx context.Context, now time.Time) bool {
	w := &t.workers
	if !w.checked {
		if err := t.pool.QueryRow(ctx, "SELECT to_regclass('pg_catalog.pg_dist_node') IS NOT NULL").Scan(&w.citus); err != nil {
			return false // asked again at the next reading
		}
		w.checked = true
	}
	return w.citus && now.Sub(w.at) >= CitusStandbyPollInterval
}

// readWorkers reads every worker's physical standbys; a worker that does not
// answer fails the reading (fail closed, as a failed read of the
// coordinator's pg_stat_replication does).
func (t *Throttler) readWorkers(ctx context.Context, now time.Time) ([]walsender, error) {
	type answer struct {
		node    string
		success bool
		result  string
	}
	if f := t.TestSignals.WorkersRead; f != nil {
		f()
	}
	answers, err := queryRows(ctx, t.pool, workerStandbysSQL, func(row pgx.CollectableRow, a *answer) error {
		return row.Scan(&a.node, &a.success, &a.result)
	})
	if err != nil {
		return nil, err
	}
	var senders []walsender
	for _, a := range answers {
		if !a.success {
			return nil, fmt.Errorf("worker %s: %s", a.node, a.result)
		}
		var rows [][]*json.RawMessage
		if err := json.Unmarshal([]byte(a.result), &rows); err != nil {
			return nil, fmt.Errorf("worker %s: %w", a.node, err)
		}
		for _, r := range rows {
			var w walsender
			if len(r) != 5 || r[0] == nil || json.Unmarshal(*r[0], &w.name) != nil {
				return nil, fmt.Errorf("worker %s: unexpected row %s", a.node, a.result)
			}
			w.name = a.node + "/" + w.name
			w.behind, w.lag, w.replayed, w.queued = jsonFloat(r[1]), jsonFloat(r[2]), jsonFloat(r[3]), jsonFloat(r[4])
			senders = append(senders, w)
		}
	}
	t.workers.at, t.workers.senders = now, senders
	return senders, nil
}

// jsonFloat is a JSON number, or nil for null.
func jsonFloat(m *json.RawMessage) *float64 {
	var v *float64
	if m != nil {
		_ = json.Unmarshal(*m, &v)
	}
	return v
}

// PacesWorkers reports whether the last reading found a standby of a
// Citus worker: batches on a distributed table then measure the WAL they
// write on the workers (batchloop), which their window must hold.
func (t *Throttler) PacesWorkers() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.workerStandbys
}
