// Package partitions manages inbox tables range-partitioned by month on
// their expiry column: it creates partitions ahead of the furthest expiry a
// new row can carry, and retires a month once every row in it has expired
// and no hold or replay covers any of them, by DETACH PARTITION ...
// CONCURRENTLY and, after a grace period, DROP TABLE.
//
// Every DDL statement runs with a short lock_timeout and is retried with
// backoff, so the daemon never sits in a lock queue in front of the
// application's inserts.
//
// Daemon internals: the daemon's pass and `inboxkeeper partitions ensure` use
// it; its API may change between releases.
package partitions

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// Options tune a Manager: the service base every service of a pass has,
// whose LockTimeout is the lock_timeout of every DDL statement (the longest
// an insert can queue behind one waiting for its lock; default 100ms),
// StatementTimeout bounds the coverage checks, IdleTimeout is also the
// idle_session_timeout while a DDL session holds the fence (a frozen
// process lets go of it), and MaxRetries is how often one DDL step is
// retried in a pass after a lock timeout before the partition is reported
// blocked. Zero values get the documented defaults.
type Options struct {
	service.Base
	Metrics *Metrics // may be nil
}

// TestSignals are the hooks tests set on a Manager; the daemon never sets
// them.
type TestSignals struct {
	// BeforeDetach acts between a detach's record and its statement.
	BeforeDetach func(p Partition)
}

// Blocked is a due partition that waits, and why.
type Blocked struct {
	Partition string
	Reason    string // one of BlockedReasons
	Detail    string
	Detached  bool // already detached; its drop waits
}

// Detached is a partition detached by the daemon and not yet dropped.
type Detached struct {
	Schema, Name string
	Lower        *time.Time // nil: FROM (MINVALUE)
	Upper        time.Time
	DetachedAt   *time.Time // nil while the detach is not finished
	DropAt       *time.Time
}

// TableResult is what one pass did to one partitioned table. With DryRun,
// Created, Detached and Dropped list what a pass would do.
type TableResult struct {
	Table        string
	Now          time.Time
	Created      []string
	Detached     []string
	Dropped      []string
	Blocked      []Blocked
	Partitions   []Partition // attached after the pass
	Waiting      []Detached  // detached, not yet dropped
	CoveredUntil *time.Time  // nil: a MAXVALUE partition covers everything ahead
	Coverage     time.Duration
	CleanupLag   time.Duration
	Duration     time.Duration
	batchloop.Outcome
}

// Manager runs partition passes over the partitioned tables of a policy.
type Manager struct {
	service.Base
	TestSignals TestSignals

	pool    *pgxpool.Pool
	tables  []*catalog.Table
	metrics *Metrics
	managed map[uint32]bool // every table of the policy (trust.go)

	mu      sync.Mutex
	refused map[string]bool // the untrusted records already logged
}

// New returns a Manager for the partitioned tables among tables (others
// are ignored).
func New(pool *pgxpool.Pool, tables []*catalog.Table, opts Options) *Manager {
	m := &Manager{Base: opts.WithDefaults(config.DefaultDDLLockTimeout), pool: pool, metrics: opts.Metrics,
		managed: managedOIDs(tables), refused: map[string]bool{}}
	for _, t := range tables {
		if t.Partitioned() {
			m.tables = append(m.tables, t)
		}
	}
	if mm := opts.Metrics; mm != nil && !opts.DryRun {
		for _, t := range m.tables {
			mm.Created.WithLabelValues(t.Name).Add(0)
			mm.Detached.WithLabelValues(t.Name).Add(0)
			mm.Dropped.WithLabelValues(t.Name).Add(0)
			for _, r := range BlockedReasons {
				mm.Blocked.Set(0, t.Name, r)
			}
			if mm.Errors != nil {
				for _, k := range retry.ErrorKinds {
					mm.Errors.WithLabelValues(t.Name, k).Add(0)
				}
			}
		}
	}
	return m
}

// Tables are the partitioned tables this manager looks after.
func (m *Manager) Tables() []*catalog.Table { return m.tables }

// RunPass runs premake, retirement and the drops of detached partitions on
// every table. A failure on one table is recorded in its result and the
// pass goes on; the returned error is non-nil only when ctx ended the pass.
func (m *Manager) RunPass(ctx context.Context) ([]TableResult, error) {
	return m.pass(ctx, true)
}

// Ensure creates the missing partitions of every table and measures their
// coverage; it retires nothing (`inboxkeeper partitions ensure`).
func (m *Manager) Ensure(ctx context.Context) ([]TableResult, error) {
	return m.pass(ctx, false)
}

// pass runs every table in turn, retiring partitions when retire is set,
// until ctx ends: the table loop of the deleter and the demoter. Premaking
// is not bounded by RUN_TIME (a missing month makes inserts fail), so
// there is no deadline.
func (m *Manager) pass(ctx context.Context, retire bool) ([]TableResult, error) {
	return batchloop.Pass(ctx, m.tables, time.Time{},
		func(ctx context.Context, t *catalog.Table, _ time.Time) TableResult {
			return m.runTable(ctx, t, retire)
		})
}

func (m *Manager) runTable(ctx context.Context, t *catalog.Table, retire bool) TableResult {
	start := time.Now()
	res := TableResult{Table: t.Name}
	log := m.Logger.With("table", t.Name)
	var errs []error
	note := func(step string, err error) bool {
		if err == nil {
			return true
		}
		var stop retry.StopError
		if errors.As(err, &stop) {
			res.StoppedEarly = stop.Early
		} else {
			errs = append(errs, fmt.Errorf("%s: %w", step, err))
		}
		return false
	}
	now, err := m.now(ctx)
	if !note("read the clock", err) {
		res.Err = errors.Join(errs...)
		return res
	}
	res.Now = now
	// Premake first, in transactions of its own: a retirement that fails
	// later never takes new partitions with it.
	err = m.premake(ctx, t, now, &res)
	var stop retry.StopError
	note("premake", err)
	if retire && !errors.As(err, &stop) && ctx.Err() == nil {
		if note("retire", m.retire(ctx, t, now, &res)) {
			note("drop detached partitions", m.dropDetached(ctx, t, now, &res))
		}
	}
	if !res.StoppedEarly.Stopped() || ctx.Err() == nil {
		note("measure", m.measure(ctx, t, now, &res))
	}
	res.Err = errors.Join(errs...)
	res.Duration = time.Since(start)
	if res.Err != nil {
		if ctx.Err() != nil {
			// A signal, not a failure: the batch in flight rolled back.
			res.StoppedEarly = retry.AtShutdown
			log.Info("partitions: table stopped for shutdown", "created", res.Created, "detached", res.Detached, "dropped", res.Dropped)
			return res
		}
		log.Error("partitions: table failed", "error", res.Err, "created", res.Created, "detached", res.Detached, "dropped", res.Dropped)
		return res
	}
	if mm := m.metrics; mm != nil && mm.LastSuccess != nil && retire && !res.StoppedEarly.Stopped() && !m.DryRun {
		mm.LastSuccess.WithLabelValues(t.Name).Set(float64(time.Now().Unix()))
	}
	logf, created, detached, dropped := log.Info, "created", "detached", "dropped"
	if len(res.Created)+len(res.Detached)+len(res.Dropped)+len(res.Blocked) == 0 && !res.StoppedEarly.Stopped() {
		logf = log.Debug // nothing changed: the steady state says nothing at info
	}
	if m.DryRun {
		logf = log.Debug // status runs a dry pass: its output says it all
		created, detached, dropped = "would_create", "would_detach", "would_drop"
	}
	logf("partitions: table done", created, len(res.Created), detached, len(res.Detached), dropped, len(res.Dropped),
		"blocked", len(res.Blocked), "coverage", res.Coverage.Round(time.Second), "dry_run", m.DryRun,
		"duration", res.Duration.Round(time.Millisecond), "stopped_early", res.StoppedEarly)
	return res
}

func (m *Manager) now(ctx context.Context) (time.Time, error) {
	now, err := m.Clock.DBNow(ctx, m.pool)
	return now.UTC(), err
}

// measure reads the partitions after the pass: coverage, cleanup lag and
// the gauges.
func (m *Manager) measure(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	parts, err := readPartitions(ctx, m.pool, t, m.txSettings())
	if err != nil {
		return err
	}
	res.Partitions = parts
	res.CoveredUntil = coveredUntil(parts, now)
	cov := math.Inf(1)
	if res.CoveredUntil != nil {
		res.Coverage = res.CoveredUntil.Sub(now)
		cov = res.Coverage.Seconds()
	} else {
		res.Coverage = time.Duration(math.MaxInt64)
	}
	// Lag: how long the oldest due partition that nothing protects has
	// been due and is still attached.
	protected := map[string]bool{}
	for _, b := range res.Blocked {
		if b.Reason == "hold" || b.Reason == "replay" {
			protected[b.Partition] = true
		}
	}
	for _, p := range parts {
		if due(t, p, now) && !protected[p.String()] {
			res.CleanupLag = max(res.CleanupLag, now.Sub(p.Upper.Add(t.Policy.ExpiryOffset())))
		}
	}
	mm := m.metrics
	if mm == nil || m.DryRun {
		return nil
	}
	// Set with the coverage on every pass: a fact, cleared while another
	// instance is the active one.
	mm.Coverage.Set(cov, t.Name)
	mm.MaxExpiry.Set(t.Policy.Partitions.MaxExpiry.Seconds(), t.Name)
	counts := map[string]int{}
	for _, b := range res.Blocked {
		counts[b.Reason]++
	}
	for _, r := range BlockedReasons {
		mm.Blocked.Set(float64(counts[r]), t.Name, r)
	}
	attached, pending := 0, 0
	for _, p := range parts {
		if p.DetachPending {
			pending++
		} else {
			attached++
		}
	}
	mm.Count.Set(float64(attached), t.Name, "attached")
	mm.Count.Set(float64(pending), t.Name, "detach_pending")
	mm.Count.Set(float64(len(res.Waiting)), t.Name, "detached")
	if mm.CleanupLag != nil {
		mm.CleanupLag.Set(res.CleanupLag.Seconds(), t.Name)
	}
	return nil
}

// txSettings are the settings of the manager's own transactions: the
// DDL lock timeout is for the DDL alone.
func (m *Manager) txSettings() dbconn.TxSettings {
	return dbconn.TxSettings{StatementTimeout: m.StatementTimeout, IdleInTx: m.IdleTimeout}
}
