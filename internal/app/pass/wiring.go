package pass

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// Wiring is what the services of a pass share, and the one place they are
// built from a configuration (the environment's, or a table's with its
// runtime settings): every setting goes from config.Config into the
// service base here, and nowhere else.
type Wiring struct {
	Pool *pgxpool.Pool
	// DDLPool is the pool partition DDL and the compaction's VACUUMs run
	// on (sessions of its own: INBOXKEEPER_SESSION_DATABASE_URL); nil: Pool.
	DDLPool  *pgxpool.Pool
	Log      *slog.Logger
	Throttle *throttle.Throttler // nil: never waits
	// Active is asked before every batch and DDL statement: the lease, and
	// the settings watch (nil: always active). Where Watch is set, a batch
	// loop asks BatchActive (the lease alone) before every batch instead,
	// and reads Watch in the batch's transaction
	// (service.Base.LoopActive).
	Active      func() error
	BatchActive func() error
	Watch       service.TxWatch
	DryRun      bool
	Metrics     *Metrics              // nil: none
	Progress    func(expiry.Progress) // nil: none
}

// ReadOnly is the wiring of status and dry runs on pool: no throttle, no
// lease, nothing changed.
func ReadOnly(pool *pgxpool.Pool, log *slog.Logger) Wiring {
	return Wiring{Pool: pool, Log: log, DryRun: true}
}

// base is the service base of a service configured by c.
func (w Wiring) base(c config.Config, lockTimeout time.Duration) service.Base {
	b := service.Base{Logger: w.Log, Active: w.Active, BatchActive: w.BatchActive, Watch: w.Watch, DryRun: w.DryRun,
		LockTimeout: lockTimeout, StatementTimeout: c.StatementTimeout, IdleTimeout: c.IdleTimeout}
	if w.Throttle != nil { // a nil *Throttler in the interface would not be nil
		b.Throttle = w.Throttle
	}
	return b
}

// batch are the settings the deleter and the demoter share.
func (w Wiring) batch(c config.Config) batchloop.Settings {
	return batchloop.Settings{Base: w.base(c, c.LockTimeout), BatchSize: c.BatchSize, BatchPause: c.BatchPause, RunTime: c.RunTime,
		Sizing: &batchloop.Sizing{Min: c.BatchSizeMin, Max: c.BatchSizeMax, Target: c.BatchTarget}}
}

// Deleter builds the deleter of tables with the configuration c.
func (w Wiring) Deleter(c config.Config, tables []*catalog.Table) *expiry.Deleter {
	o := expiry.Options{Settings: w.batch(c), Progress: w.Progress, Strategy: expiry.Strategy(c.ExpiryStrategy), Prefetch: c.SweepPrefetch}
	var vm *vacuum.Metrics
	if w.Metrics != nil {
		o.Metrics, vm, o.LiveDue = w.Metrics.Expiry, w.Metrics.Vacuum, w.Metrics.Live
	}
	if !w.DryRun {
		o.Vacuum = vacuum.New(w.Pool, vacuum.Options{Base: w.base(c, c.LockTimeout), DeadRatio: c.VacuumDeadRatio, Metrics: vm})
	}
	return expiry.New(w.Pool, tables, o)
}

// Demoter builds the demoter of tables with the configuration c.
func (w Wiring) Demoter(c config.Config, tables []*catalog.Table) *tiering.Demoter {
	o := tiering.Options{Settings: w.batch(c)}
	if w.Metrics != nil {
		o.Metrics = w.Metrics.Tiering
	}
	return tiering.New(w.Pool, tables, o)
}

// Compactor builds the compactor of tables with the configuration c: of
// those whose policy asks for it, unless force.
func (w Wiring) Compactor(c config.Config, tables []*catalog.Table, o compact.Options) *compact.Compactor {
	o.Settings = w.batch(c)
	o.WALRate = float64(c.CompactWALRate)
	if w.DDLPool != nil && !w.DryRun {
		o.SessionPool = w.DDLPool // its VACUUM's settings are the session's
	}
	if w.Metrics != nil {
		o.Metrics = w.Metrics.Compact
	}
	return compact.New(w.Pool, tables, o)
}

// Partitions builds the partition manager of tables with the
// configuration c; its DDL runs on DDLPool when there is one.
func (w Wiring) Partitions(c config.Config, tables []*catalog.Table) *partitions.Manager {
	pool := w.Pool
	if w.DDLPool != nil && !w.DryRun {
		pool = w.DDLPool
	}
	o := partitions.Options{Base: w.base(c, c.DDLLockTimeout)}
	if w.Metrics != nil {
		o.Metrics = w.Metrics.Partitions
	}
	return partitions.New(pool, tables, o)
}

// Stages builds a pass's stages with each table's configuration in force:
// partitions for every partitioned table, then demotion and deletion one
// table at a time, in policy order, each with its own batch settings and,
// when it has one of its own, its own RUN_TIME within the pass's. It also
// returns the deleters, for the counts between passes.
func (w Wiring) Stages(tables []*catalog.Table, tn settings.Tuning) ([]Stage, []*expiry.Deleter) {
	out := []Stage{Partitions(w.Partitions(tn.Global, tables))}
	var deletes []Stage
	var deleters []*expiry.Deleter
	for _, t := range tables {
		c := tn.For(t.Name)
		one := []*catalog.Table{t}
		if tiering.Of(t) != nil {
			// A partitioned inbox is demoted too (in place, on (tableoid,
			// ctid)), after the partitions stage has retired its due
			// months whole (their permanent keys copied out as they go).
			out = append(out, limit(Tiering(w.Demoter(c, one)), c.RunTime, tn.Global.RunTime))
		}
		if t.Partitioned() {
			continue // it loses whole partitions (the partitions stage), not rows
		}
		d := w.Deleter(c, one)
		deleters = append(deleters, d)
		deletes = append(deletes, limit(Expiry(d), c.RunTime, tn.Global.RunTime))
		if t.Policy.Compact != nil { // refused on a Citus table when the policy was read
			// After its deletions, within the same RUN_TIME.
			deletes = append(deletes, limit(Compaction(w.Compactor(c, one, compact.Options{})), c.RunTime, tn.Global.RunTime))
		}
	}
	return append(out, deletes...), deleters
}

// limit gives a table with a RUN_TIME of its own (a runtime setting or a
// tuning block) that budget within the pass's.
func limit(s Stage, own, global time.Duration) Stage {
	if own <= 0 || own == global {
		return s
	}
	return Limit(s, own)
}
