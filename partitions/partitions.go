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
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// Options tune a Manager. Zero values get the documented defaults.
type Options struct {
	// LockTimeout is the lock_timeout of every DDL statement: the longest an
	// insert can queue behind a DDL statement that waits for its lock.
	// Default 100ms.
	LockTimeout time.Duration
	// StatementTimeout bounds the coverage checks. Default 30s.
	StatementTimeout time.Duration
	// IdleTimeout is idle_in_transaction_session_timeout in every
	// transaction, and idle_session_timeout while a DDL session holds the
	// fence: a frozen process lets go of it. Default 10s.
	IdleTimeout time.Duration
	// MaxRetries is how often one DDL step is retried in a pass after a lock
	// timeout before the partition is reported blocked. Default 5.
	MaxRetries int
	// Clock pins "now" for tests; nil means the database's clock.
	Clock dbconn.Clock
	// Throttle, when set, is waited on before every DDL statement and
	// watches it for sessions waiting on its locks.
	Throttle *throttle.Throttler
	// Active, when set, is asked before every DDL statement; an error stops
	// the pass (this instance lost the lease).
	Active func() error
	// DryRun reports what a pass would create, detach and drop, and changes
	// nothing.
	DryRun bool
	// CopyKeys, when set, copies the permanent keys out of a detached
	// partition in the transaction that drops it (tiering).
	CopyKeys func(ctx context.Context, tx pgx.Tx, t *catalog.Table, source string) (int64, error)
	Logger   *slog.Logger
	Metrics  *Metrics // may be nil

	// beforeDetach lets tests act between a detach's record and its
	// statement.
	beforeDetach func(p Partition)
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
	Lower, Upper time.Time
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
	StoppedEarly retry.Early
	Err          error
}

// Manager runs partition passes over the partitioned tables of a policy.
type Manager struct {
	pool   *pgxpool.Pool
	tables []*catalog.Table
	opts   Options
	log    *slog.Logger
}

// New returns a Manager for the partitioned tables among tables (others
// are ignored).
func New(pool *pgxpool.Pool, tables []*catalog.Table, opts Options) *Manager {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 100 * time.Millisecond
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = dbconn.DefaultIdleTimeout
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = 30 * time.Second
	}
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = 5
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{pool: pool, opts: opts, log: log}
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
// until ctx ends.
func (m *Manager) pass(ctx context.Context, retire bool) ([]TableResult, error) {
	var out []TableResult
	for _, t := range m.tables {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, m.runTable(ctx, t, retire))
	}
	return out, ctx.Err()
}

// errStop ends a table's pass early without being an error: the lease was
// lost, or the throttle held the pass until shutdown.
type errStop struct{ why retry.Early }

func (e errStop) Error() string { return e.why.String() }

func (m *Manager) runTable(ctx context.Context, t *catalog.Table, retire bool) TableResult {
	start := time.Now()
	res := TableResult{Table: t.Name}
	log := m.log.With("table", t.Name)
	var errs []error
	note := func(step string, err error) bool {
		if err == nil {
			return true
		}
		var stop errStop
		if errors.As(err, &stop) {
			res.StoppedEarly = stop.why
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
	var stop errStop
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
	if mm := m.opts.Metrics; mm != nil && mm.LastSuccess != nil && retire && !res.StoppedEarly.Stopped() && !m.opts.DryRun {
		mm.LastSuccess.WithLabelValues(t.Name).Set(float64(time.Now().Unix()))
	}
	logf, created, detached, dropped := log.Info, "created", "detached", "dropped"
	if m.opts.DryRun {
		logf = log.Debug // status runs a dry pass: its output says it all
		created, detached, dropped = "would_create", "would_detach", "would_drop"
	}
	logf("partitions: table done", created, len(res.Created), detached, len(res.Detached), dropped, len(res.Dropped),
		"blocked", len(res.Blocked), "coverage", res.Coverage.Round(time.Second), "dry_run", m.opts.DryRun,
		"duration", res.Duration.Round(time.Millisecond), "stopped_early", res.StoppedEarly)
	return res
}

func (m *Manager) now(ctx context.Context) (time.Time, error) {
	now, err := m.opts.Clock.Now(ctx, m.pool)
	return now.UTC(), err
}

// horizon is the end of the months that must exist at now: the month of
// the furthest expiry a new row can carry, then Premake more.
func horizon(t *catalog.Table, now time.Time) time.Time {
	p := t.Policy.Partitions
	return monthStart(now.Add(p.MaxExpiry)).AddDate(0, p.Premake+1, 0)
}

// premake creates a partition for every month from now's month to the
// horizon that no partition covers yet. A month partly covered by a
// partition made by hand gets one for the rest only.
func (m *Manager) premake(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	parts, err := readPartitions(ctx, m.pool, t, m.txSettings())
	if err != nil {
		return err
	}
	end := horizon(t, now)
	for ms := monthStart(now); ms.Before(end); ms = nextMonth(ms) {
		for _, g := range gaps(parts, ms, nextMonth(ms)) {
			name, err := m.freeName(ctx, t, ms)
			if err != nil {
				return err
			}
			p := Partition{Schema: t.Policy.Name.Schema, Name: name, Lower: &g[0], Upper: &g[1]}
			if m.opts.DryRun {
				res.Created = append(res.Created, p.String())
				parts = append(parts, p)
				continue
			}
			sql := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%s) TO (%s)",
				p.Ident(), t.Ident, literal(t.Expiry, g[0]), literal(t.Expiry, g[1]))
			err = m.retrying(ctx, t, "create "+p.String(), func() error {
				return m.ddl(ctx, t, "create "+p.String(), func(c *pgxpool.Conn) error {
					return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
						if err := m.toWorkers(ctx, tx, t); err != nil {
							return err
						}
						// The new partition belongs to the parent's owner, as
						// one made by hand would, when the daemon's role is a
						// member of it (which creating a partition requires).
						if _, err := tx.Exec(ctx, `SELECT set_config('role', r.rolname, true)
FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
WHERE c.oid = $1 AND r.rolname <> current_user AND pg_has_role(current_user, r.oid, 'MEMBER')`, t.OID); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, sql)
						return err
					})
				})
			})
			if raced(err) {
				// Another instance (or a DBA) made it meanwhile: look again.
				m.log.Info("partitions: partition appeared meanwhile", "table", t.Name, "partition", p.String(), "error", err)
				if parts, err = readPartitions(ctx, m.pool, t, m.txSettings()); err != nil {
					return err
				}
				if len(gaps(parts, g[0], g[1])) > 0 {
					return fmt.Errorf("create %s for [%s, %s): another table is in the way", p, g[0].Format(time.RFC3339), g[1].Format(time.RFC3339))
				}
				continue
			}
			if err != nil {
				return err
			}
			m.log.Info("partitions: created", "table", t.Name, "partition", p.String(), "from", g[0], "to", g[1])
			res.Created = append(res.Created, p.String())
			parts = append(parts, p)
			if mm := m.opts.Metrics; mm != nil {
				mm.Created.WithLabelValues(t.Name).Inc()
			}
		}
	}
	return nil
}

// raced reports an error a concurrent creator causes: the name is taken, or
// the range now overlaps a partition.
func raced(err error) bool {
	code := retry.Code(err)
	return code == retry.SQLStateDuplicateTable || code == retry.SQLStateInvalidDefinition
}

// freeName is <table>_pYYYYMM, or with a _2, _3… suffix when a table of
// that name exists (a month partly covered by hand-made partitions).
func (m *Manager) freeName(ctx context.Context, t *catalog.Table, month time.Time) (string, error) {
	base := catalog.PartitionName(t.Policy.Name.Name, month.Format("200601"))
	for i := 1; i < 10; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s_%d", base, i)
		}
		if len(name) > catalog.MaxIdentifierBytes {
			break
		}
		var taken bool
		if err := m.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2)`, t.Policy.Name.Schema, name).Scan(&taken); err != nil {
			return "", err
		}
		if !taken {
			return name, nil
		}
	}
	return "", fmt.Errorf("no free name for the partition of %s in %s: %s and its numbered variants are taken", t.Name, month.Format("2006-01"), base)
}

// due reports whether every row p can hold has expired at now.
func due(t *catalog.Table, p Partition, now time.Time) bool {
	return p.Upper != nil && !p.Upper.Add(t.Policy.ExpiryOffset()).After(now)
}

// retire finishes interrupted detaches, then detaches every due partition
// no hold or replay covers, oldest first.
func (m *Manager) retire(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	parts, err := readPartitions(ctx, m.pool, t, m.txSettings())
	if err != nil {
		return err
	}
	// At most one detach can be pending per parent: it goes first, and while
	// one stays pending no other detach can start.
	stuck := ""
	for _, p := range parts {
		if p.DetachPending {
			pending, err := m.retireOne(ctx, t, p, now, res)
			if err != nil {
				return err
			}
			if pending {
				stuck = p.String()
			}
		}
	}
	for _, p := range parts {
		if p.DetachPending || !due(t, p, now) {
			continue
		}
		if stuck != "" {
			res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: "lock_timeout",
				Detail: "waits for the interrupted detach of " + stuck + " to finish (PostgreSQL allows one per table)"})
			continue
		}
		pending, err := m.retireOne(ctx, t, p, now, res)
		if err != nil {
			return err
		}
		if pending {
			stuck = p.String()
		}
	}
	return nil
}

// retireOne detaches p (or finishes its interrupted detach), retrying lock
// timeouts; a partition it cannot detach this pass is reported blocked.
// The error is for what should stop the table's pass (the lease, the
// connection, shutdown).
func (m *Manager) retireOne(ctx context.Context, t *catalog.Table, p Partition, now time.Time, res *TableResult) (pending bool, err error) {
	if m.opts.DryRun {
		reason, detail, err := m.covered(ctx, t, p.Ident(), now)
		if err != nil {
			return false, err
		}
		if reason != "" {
			res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: reason, Detail: detail})
		} else {
			res.Detached = append(res.Detached, p.String())
		}
		return false, nil
	}
	var reason, detail string
	err = retry.Do(ctx, m.ddlPolicy(t, "detach "+p.String()), func(n int) error {
		if n > 0 {
			// Phase one may have committed before the failure: look again.
			cur, err := m.refresh(ctx, t, p)
			if err != nil || cur.OID == 0 {
				return errGone{err}
			}
			p = cur
		}
		reason, detail, err = m.detachOnce(ctx, t, p, now)
		return err
	})
	var gone errGone
	switch {
	case errors.As(err, &gone):
		return false, gone.err
	case err == nil && reason != "":
		res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: reason, Detail: detail})
		return false, nil
	case err == nil:
		res.Detached = append(res.Detached, p.String())
		if mm := m.opts.Metrics; mm != nil {
			mm.Detached.WithLabelValues(t.Name).Inc()
		}
		m.log.Info("partitions: detached", "table", t.Name, "partition", p.String())
		return false, nil
	}
	var stop errStop
	if errors.As(err, &stop) || ctx.Err() != nil {
		return false, err
	}
	reason = blockedReason(err)
	m.log.Warn("partitions: partition stays attached this pass", "table", t.Name, "partition", p.String(), "reason", reason, "error", err)
	res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: reason, Detail: err.Error()})
	// Phase one may have committed: then nothing else can be detached.
	cur, rerr := m.refresh(ctx, t, p)
	return rerr == nil && cur.DetachPending, rerr
}

// refresh reads p again; OID 0 means it is no longer a partition of t.
func (m *Manager) refresh(ctx context.Context, t *catalog.Table, p Partition) (Partition, error) {
	parts, err := readPartitions(ctx, m.pool, t, m.txSettings())
	if err != nil {
		return p, err
	}
	for _, q := range parts {
		if q.OID == p.OID {
			return q, nil
		}
	}
	return Partition{}, nil
}

// detachOnce makes one attempt. A pending partition is finished with
// FINALIZE; an attached one is checked against holds and replays (under
// the fence, so no hold can commit between the check and the detach) and
// detached CONCURRENTLY, which takes SHARE UPDATE EXCLUSIVE on the parent:
// inserts go on meanwhile. Citus refuses CONCURRENTLY on the tables it
// manages; their partitions are detached with a plain DETACH instead
// (detachInCitus).
func (m *Manager) detachOnce(ctx context.Context, t *catalog.Table, p Partition, now time.Time) (reason, detail string, err error) {
	err = m.ddl(ctx, t, "detach "+p.String(), func(c *pgxpool.Conn) error {
		if p.DetachPending {
			if _, err := c.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", t.Ident, p.Ident())); err != nil {
				return err
			}
			return m.recordDetached(ctx, c, t, p, now, due(t, p, now))
		}
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock_shared($1)", holds.FenceKey); err != nil {
			return err
		}
		defer c.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_shared($1)", holds.FenceKey)
		var err error
		if reason, detail, err = m.coveredOn(ctx, c, t, p.Ident(), now); err != nil || reason != "" {
			return err
		}
		if _, err := c.Exec(ctx, `INSERT INTO inboxkeeper.partitions (table_name, partition_schema, partition_name, lower_bound, upper_bound, detach_started)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`, t.Name, p.Schema, p.Name, lowerOr(p), p.Upper, now); err != nil {
			return fmt.Errorf("record the detach: %w", err)
		}
		if m.opts.beforeDetach != nil {
			m.opts.beforeDetach(p)
		}
		if t.InCitusMetadata {
			return m.detachInCitus(ctx, c, t, p, now)
		}
		if _, err := c.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", t.Ident, p.Ident())); err != nil {
			return err
		}
		return m.recordDetached(ctx, c, t, p, now, true)
	})
	return reason, detail, err
}

// detachInCitus detaches p from a parent Citus manages (distributed, or a
// Citus local table) with a plain DETACH: Citus refuses CONCURRENTLY on
// them. A plain DETACH takes ACCESS EXCLUSIVE on the parent and the
// partition, on the coordinator and on the workers' shards of them, so each
// of those waits must be bounded: the session's lock_timeout covers the
// coordinator only, and an application query routed to a shard holds its
// lock on the worker, where a DETACH waiting for it would queue every later
// insert into that shard behind it. The statement therefore runs in a
// transaction that sends the lock timeout to the workers too (toWorkers).
// It commits at once (no rows move) or not at all, so it never leaves a
// pending detach; the record of its end commits with it.
func (m *Manager) detachInCitus(ctx context.Context, c *pgxpool.Conn, t *catalog.Table, p Partition, now time.Time) error {
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if err := m.toWorkers(ctx, tx, t); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", t.Ident, p.Ident())); err != nil {
			return err
		}
		return m.recordDetached(ctx, tx, t, p, now, true)
	})
}

// toWorkers makes the DDL lock timeout hold on the Citus workers for the
// rest of tx, when t is distributed: the session-level lock_timeout of a
// DDL connection stays on the coordinator, and Citus forwards only SET
// LOCAL commands, once citus.propagate_set_commands is 'local', to the
// transactions it opens on the workers. It runs first in tx, before any
// statement opens a connection to a worker. A Citus local table's DDL
// reaches the workers too (their copies of its metadata).
func (m *Manager) toWorkers(ctx context.Context, tx pgx.Tx, t *catalog.Table) error {
	if !t.InCitusMetadata {
		return nil
	}
	_, err := dbconn.TxSettings{LockTimeout: m.opts.LockTimeout, IdleInTx: m.opts.IdleTimeout, Citus: true}.Apply(ctx, tx)
	return err
}

// lowerOr is p's lower bound, or -infinity for MINVALUE.
func lowerOr(p Partition) any {
	if p.Lower == nil {
		return "-infinity"
	}
	return *p.Lower
}

// execer runs a statement: a connection or a transaction.
type execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// recordDetached marks p detached. A partition whose interrupted detach
// someone else started is recorded only if it is due: the daemon never
// drops a table it would not have retired itself.
func (m *Manager) recordDetached(ctx context.Context, c execer, t *catalog.Table, p Partition, now time.Time, ours bool) error {
	if !ours {
		m.log.Warn("partitions: finished a detach someone else started on a partition that is not due; the table is left in place and will not be dropped",
			"table", t.Name, "partition", p.String())
		return nil
	}
	if p.Upper == nil {
		return nil
	}
	_, err := c.Exec(ctx, `
WITH upd AS (
  UPDATE inboxkeeper.partitions SET detached_at = $4
  WHERE partition_schema = $1 AND partition_name = $2 AND table_name = $3 AND detached_at IS NULL AND dropped_at IS NULL
  RETURNING 1)
INSERT INTO inboxkeeper.partitions (table_name, partition_schema, partition_name, lower_bound, upper_bound, detach_started, detached_at)
SELECT $3, $1, $2, $5, $6, $4, $4 WHERE NOT EXISTS (SELECT 1 FROM upd)`, p.Schema, p.Name, t.Name, now, lowerOr(p), p.Upper)
	if err != nil {
		return fmt.Errorf("record the detach: %w", err)
	}
	return nil
}

// covered says whether an active hold or replay covers any row of the
// relation source (a partition, attached or detached).
func (m *Manager) covered(ctx context.Context, t *catalog.Table, source string, now time.Time) (reason, detail string, err error) {
	c, err := m.pool.Acquire(ctx)
	if err != nil {
		return "", "", err
	}
	defer c.Release()
	return m.coveredOn(ctx, c, t, source, now)
}

func (m *Manager) coveredOn(ctx context.Context, c *pgxpool.Conn, t *catalog.Table, source string, now time.Time) (reason, detail string, err error) {
	err = pgx.BeginTxFunc(ctx, c, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		reason, detail, err = coveredIn(ctx, tx, t, source, now, m.txSettings())
		return err
	})
	return reason, detail, err
}

func coveredIn(ctx context.Context, tx pgx.Tx, t *catalog.Table, source string, now time.Time, s dbconn.TxSettings) (reason, detail string, err error) {
	if _, err := s.Apply(ctx, tx); err != nil {
		return "", "", err
	}
	cov, err := holds.Active(ctx, tx, t.Name, now)
	if err != nil || cov.Empty() {
		return "", "", err
	}
	var args holds.Args
	hp, rp := cov.Predicates(t, "t", &args)
	var byHold, byReplay bool
	err = tx.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM ONLY %[1]s t WHERE %[2]s), EXISTS (SELECT 1 FROM ONLY %[1]s t WHERE %[3]s)`,
		source, hp, rp), args.Values...).Scan(&byHold, &byReplay)
	if err != nil {
		return "", "", fmt.Errorf("check holds and replays: %w", err)
	}
	switch {
	case byHold:
		return "hold", holdIDs(cov), nil
	case byReplay:
		return "replay", replayIDs(cov), nil
	}
	return "", "", nil
}

func holdIDs(c holds.Coverage) string {
	s := "covered by an active hold (ids"
	for _, h := range c.Holds {
		s += fmt.Sprintf(" %d", h.ID)
	}
	return s + ")"
}

func replayIDs(c holds.Coverage) string {
	s := "covered by an active replay (ids"
	for _, r := range c.Replays {
		s += fmt.Sprintf(" %d", r.ID)
	}
	return s + ")"
}

// dropDetached settles the control schema's records: a detach that a dead
// pass started is found, and every partition detached for longer than
// detached_retention is dropped, its permanent keys copied out first in the
// same transaction, unless a hold or replay covers a row of it.
func (m *Manager) dropDetached(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	type rec struct {
		schema, name  string
		lower, upper  time.Time
		started       time.Time
		detachedAt    *time.Time
		exists, child bool
	}
	rows, err := m.pool.Query(ctx, `
SELECT r.partition_schema, r.partition_name, r.lower_bound, r.upper_bound, r.detach_started, r.detached_at,
       c.oid IS NOT NULL, EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
FROM inboxkeeper.partitions r
LEFT JOIN pg_namespace n ON n.nspname = r.partition_schema
LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = r.partition_name
WHERE r.table_name = $1 AND r.dropped_at IS NULL
ORDER BY r.upper_bound`, t.Name)
	if err != nil {
		return fmt.Errorf("read detached partitions: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rec, error) {
		var x rec
		err := r.Scan(&x.schema, &x.name, &x.lower, &x.upper, &x.started, &x.detachedAt, &x.exists, &x.child)
		return x, err
	})
	if err != nil {
		return fmt.Errorf("read detached partitions: %w", err)
	}
	keep := t.Policy.Partitions.DetachedRetention
	for _, r := range recs {
		p := Partition{Schema: r.schema, Name: r.name}
		key := []any{r.schema, r.name, r.started}
		switch {
		case !r.exists:
			m.log.Warn("partitions: a detached partition is gone (dropped by hand?)", "table", t.Name, "partition", p.String())
			if !m.opts.DryRun {
				if _, err := m.pool.Exec(ctx, `UPDATE inboxkeeper.partitions SET dropped_at = $4
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now)...); err != nil {
					return err
				}
			}
			continue
		case r.detachedAt == nil && r.child:
			// Still attached (the retire step finishes pending ones), or
			// its detach failed before phase one: nothing to drop.
			if !m.opts.DryRun {
				if _, err := m.pool.Exec(ctx, `DELETE FROM inboxkeeper.partitions r WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3
AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = to_regclass(quote_ident($1) || '.' || quote_ident($2)) AND NOT i.inhdetachpending)`, key...); err != nil {
					return err
				}
			}
			continue
		case r.detachedAt == nil:
			// Detached by a pass that died before recording it.
			if !m.opts.DryRun {
				if _, err := m.pool.Exec(ctx, `UPDATE inboxkeeper.partitions SET detached_at = $4
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now)...); err != nil {
					return err
				}
			}
			r.detachedAt = &now
		}
		dropAt := r.detachedAt.Add(keep)
		w := Detached{Schema: r.schema, Name: r.name, Lower: r.lower, Upper: r.upper, DetachedAt: r.detachedAt, DropAt: &dropAt}
		if dropAt.After(now) {
			res.Waiting = append(res.Waiting, w)
			continue
		}
		dropped, reason, detail, err := m.drop(ctx, t, p, key, now)
		if err != nil {
			var stop errStop
			if errors.As(err, &stop) || ctx.Err() != nil {
				return err
			}
			reason, detail = blockedReason(err), err.Error()
		}
		if reason != "" {
			res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: reason, Detail: detail, Detached: true})
			res.Waiting = append(res.Waiting, w)
			continue
		}
		if dropped {
			res.Dropped = append(res.Dropped, p.String())
		}
	}
	return nil
}

// drop drops one detached partition in a transaction that first checks
// holds (under the fence) and copies the permanent keys out.
func (m *Manager) drop(ctx context.Context, t *catalog.Table, p Partition, key []any, now time.Time) (dropped bool, reason, detail string, err error) {
	if m.opts.DryRun {
		reason, detail, err = m.covered(ctx, t, p.Ident(), now)
		return reason == "" && err == nil, reason, detail, err
	}
	var copied int64
	err = m.retrying(ctx, t, "drop "+p.String(), func() error {
		return m.ddl(ctx, t, "drop "+p.String(), func(c *pgxpool.Conn) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				// The DROP takes ACCESS EXCLUSIVE on the table's shards too.
				if err := m.toWorkers(ctx, tx, t); err != nil {
					return err
				}
				// Another instance may have dropped it meanwhile.
				var mine bool
				dropped, reason, detail = false, "", ""
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inboxkeeper.partitions
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3 AND dropped_at IS NULL FOR UPDATE)`, key...).Scan(&mine); err != nil || !mine {
					return err
				}
				if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", holds.FenceKey); err != nil {
					return err
				}
				var err error
				if reason, detail, err = coveredIn(ctx, tx, t, p.Ident(), now, m.txSettings()); err != nil || reason != "" {
					return err
				}
				// Copying keys reads the whole partition: no statement
				// timeout for it.
				if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', '0', true)"); err != nil {
					return err
				}
				if m.opts.CopyKeys != nil {
					if copied, err = m.opts.CopyKeys(ctx, tx, t, p.Ident()); err != nil {
						return fmt.Errorf("copy permanent keys out of %s: %w", p, err)
					}
				}
				if _, err := tx.Exec(ctx, "DROP TABLE "+p.Ident()); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE inboxkeeper.partitions SET dropped_at = $4, keys_copied = $5
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now, copied)...)
				dropped = err == nil
				return err
			})
		})
	})
	if err != nil || !dropped {
		return false, reason, detail, err
	}
	m.log.Info("partitions: dropped", "table", t.Name, "partition", p.String(), "permanent_keys_copied", copied)
	if mm := m.opts.Metrics; mm != nil {
		mm.Dropped.WithLabelValues(t.Name).Inc()
	}
	return true, "", "", nil
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
	mm := m.opts.Metrics
	if mm == nil || m.opts.DryRun {
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

// txSettings are the settings of the manager's own transactions.
func (m *Manager) txSettings() dbconn.TxSettings {
	return dbconn.TxSettings{StatementTimeout: m.opts.StatementTimeout, IdleInTx: m.opts.IdleTimeout}
}

// errLockWait marks a DDL statement cancelled because a session queued
// behind a lock it held.
var errLockWait = retry.ErrLockWait

// ddl runs fn on a connection of its own with lock_timeout set for the
// session (DETACH CONCURRENTLY cannot run in a transaction block), after
// the lease and the throttle allow it, and with the throttle watching for
// sessions that queue behind it.
func (m *Manager) ddl(ctx context.Context, t *catalog.Table, what string, fn func(c *pgxpool.Conn) error) (err error) {
	if m.opts.Active != nil {
		if err := m.opts.Active(); err != nil {
			return errStop{retry.Inactive(err)}
		}
	}
	if th := m.opts.Throttle; th != nil {
		if _, err := th.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errStop{retry.Throttled("throttled (" + th.Check().Reason + ")")}
		}
	}
	c, err := m.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	defer func() {
		if err != nil {
			kind := retry.KindOf(err)
			if mm := m.opts.Metrics; mm != nil && mm.Errors != nil {
				mm.Errors.WithLabelValues(t.Name, string(kind)).Inc()
			}
		}
	}()
	// Session settings: this connection is a session of its own (direct,
	// or INBOXKEEPER_SESSION_DATABASE_URL), never one a transaction pooler
	// shares. idle_session_timeout ends the session, and its fence lock
	// with it, should this process freeze between statements.
	idle := retry.Millis(m.opts.IdleTimeout)
	if _, err := c.Exec(ctx, `SELECT set_config('lock_timeout', $1, false), set_config('idle_session_timeout', $2, false),
       set_config('idle_in_transaction_session_timeout', $2, false)`, retry.Millis(m.opts.LockTimeout), idle); err != nil {
		return err
	}
	defer func() {
		if _, rerr := c.Exec(context.WithoutCancel(ctx), "RESET lock_timeout; RESET idle_session_timeout; RESET idle_in_transaction_session_timeout"); rerr != nil {
			// Never hand a connection with a changed setting back.
			c.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if th := m.opts.Throttle; th != nil {
		done, blocked := th.Watch(c.Conn().PgConn().PID(), time.Time{})
		defer func() {
			done()
			if err != nil && blocked() {
				err = fmt.Errorf("%w (%v)", errLockWait, err)
			}
		}()
	}
	if err := fn(c); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// retrying runs step under the DDL retry policy.
func (m *Manager) retrying(ctx context.Context, t *catalog.Table, what string, step func() error) error {
	return retry.Do(ctx, m.ddlPolicy(t, what), func(int) error { return step() })
}

// ddlPolicy retries a DDL step: lock timeouts, and being cancelled for a
// session that queued behind it, are what a busy table is like; a stop (the
// lease, the throttle) ends it.
func (m *Manager) ddlPolicy(t *catalog.Table, what string) retry.Policy {
	return retry.Policy{
		MaxRetries: m.opts.MaxRetries,
		Base:       200 * time.Millisecond,
		Retry: func(err error, kind retry.Kind) bool {
			var stop errStop
			var gone errGone
			return !errors.As(err, &stop) && !errors.As(err, &gone) && (kind.Transient() || kind == retry.KindLockWait)
		},
		OnRetry: func(kind retry.Kind, attempt int, wait time.Duration, err error) {
			m.log.Warn("partitions: DDL failed, retrying", "table", t.Name, "step", what, "kind", kind, "attempt", attempt+1, "wait", wait, "error", err)
		},
	}
}

// errGone ends a retry whose partition went away meanwhile (err nil), or
// could not be looked up again.
type errGone struct{ err error }

func (e errGone) Error() string {
	if e.err == nil {
		return "the partition is gone"
	}
	return e.err.Error()
}

// blockedReason is why a partition waits, for status and metrics, after a
// failed step: lock_timeout (a busy table) or error.
func blockedReason(err error) string {
	if k := retry.KindOf(err); k == retry.KindLockTimeout || k == retry.KindLockWait {
		return "lock_timeout"
	}
	return "error"
}
