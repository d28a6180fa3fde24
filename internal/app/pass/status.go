package pass

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/horizon"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/tiering"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// Status is what `status` shows, read without changing anything: each
// table right now (rows due with the holds and replays on it; for a
// partitioned table, what a dry-run partition pass would do), its tiers,
// the tunables in force and where they come from, the database's role and
// the active instance. The throttle's verdict is measured apart
// (NewThrottle, MeasureOnce).
type Status struct {
	Citus      map[string]*catalog.Distribution // the tables Citus distributes
	Scopes     []settings.Scope                 // the tunables in force: global, then each table's
	InRecovery bool
	Lease      *lease.Holder // nil: no instance holds it
	Tables     []expiry.TableStatus
	Partitions []partitions.TableResult
	Tiers      map[string]*tiering.Status // tables with tiers, by name
	// Horizon is who holds the database's xmin horizon: rows deleted
	// after it began stay on disk until it lets go.
	Horizon horizon.Reading
	// Vacuum is how each ordinary table is vacuumed, and VacuumDeadRatio
	// the daemon's INBOXKEEPER_VACUUM_DEAD_RATIO (0: it leaves them to
	// autovacuum).
	Vacuum          map[string]*vacuum.State
	VacuumDeadRatio float64
	// Fence names the sessions holding the hold fence against the cleanup
	// ("": none). Powers is what the connected role may do that the
	// daemon's role must not (holds.Powers).
	Fence  string
	Powers []string
	// Env is the environment the settings and the throttle are read
	// with: the active instance's, as it published it with its lease, or
	// this shell's when none did (Env.Why).
	Env settings.Env
	// Pooled: the connection goes through a connection pooler
	// (dbconn.Pooled), where the daemon's VACUUM cannot be paced for a
	// standby (vacuum.Plan).
	Pooled bool
	// Space is how much of each ordinary table's heap its live rows need:
	// what compaction would give back.
	Space map[string]*compact.Space
}

// ReadStatus reads the status of tables on pool, with the environment of
// the active instance, as it published it with its lease: shell (this
// process's) stands in for what it did not publish, and for all of it
// when none did (Status.Env says which).
func ReadStatus(ctx context.Context, w Wiring, shell config.Config, tables []*catalog.Table) (Status, error) {
	holder, err := lease.Current(ctx, w.Pool)
	if err != nil {
		return Status{}, err
	}
	env := settings.Daemon(shell, holder)
	st, err := ReadTables(ctx, w, env.Config, tables)
	st.Lease, st.Env = holder, env
	if err != nil {
		return st, err
	}
	st.Citus = map[string]*catalog.Distribution{}
	for _, t := range tables {
		if t.Citus != nil {
			st.Citus[t.Name] = t.Citus
		}
	}
	if st.InRecovery, err = dbconn.InRecovery(ctx, w.Pool); err != nil {
		return st, err
	}
	if st.Horizon, err = horizon.Read(ctx, w.Pool); err != nil {
		return st, err
	}
	if st.Fence, err = holds.FenceBlockers(ctx, w.Pool); err != nil {
		return st, err
	}
	if st.Powers, err = holds.Powers(ctx, w.Pool); err != nil {
		return st, err
	}
	if st.Pooled, err = pooled(ctx, w.Pool); err != nil {
		return st, err
	}
	st.Scopes, err = settings.Values(ctx, w.Pool, env, tables)
	return st, err
}

// pooled says whether pool's connections go through a connection pooler.
func pooled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	return dbconn.Pooled(ctx, c.Conn())
}

// ReadTables reads the per-table part of the status: rows due for
// ordinary tables, a dry-run partition pass for partitioned ones, and the
// tiers.
func ReadTables(ctx context.Context, w Wiring, env config.Config, tables []*catalog.Table) (Status, error) {
	st := Status{Vacuum: map[string]*vacuum.State{}, VacuumDeadRatio: env.VacuumDeadRatio, Space: map[string]*compact.Space{}}
	// Status reads; it never deletes (not a dry run: that would count
	// differently).
	w.DryRun = false
	d := w.Deleter(env, tables)
	for _, t := range tables {
		if t.Partitioned() {
			continue
		}
		ts, err := d.Status(ctx, t)
		if err != nil {
			return st, err
		}
		st.Tables = append(st.Tables, ts)
		if !t.ThroughCitus() {
			vs, err := vacuum.Read(ctx, w.Pool, t)
			if err != nil {
				return st, err
			}
			st.Vacuum[t.Name] = &vs
			sp, err := compact.Measure(ctx, w.Pool, t)
			if err != nil {
				return st, err
			}
			st.Space[t.Name] = &sp
		}
	}
	// A dry-run pass shows what the next one would make, detach and drop.
	ro := ReadOnly(w.Pool, w.Log)
	var err error
	if st.Partitions, err = ro.Partitions(env, tables).RunPass(ctx); err != nil {
		return st, err
	}
	st.Tiers = map[string]*tiering.Status{}
	dem := ro.Demoter(env, tables)
	for _, t := range dem.Tables() {
		ts, err := dem.Status(ctx, t)
		if err != nil {
			return st, err
		}
		st.Tiers[t.Name] = &ts
	}
	return st, nil
}
