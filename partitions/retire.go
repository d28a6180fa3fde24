package partitions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

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
			// A hold or replay that covers it is the reason it stays, and
			// what status, the metric and an alert on reason="hold" must
			// say; the detach in the way comes second.
			reason, detail, err := m.covered(ctx, t, p.Ident(), now)
			if err != nil {
				return err
			}
			if reason == "" {
				reason, detail = "lock_timeout", "waits for the interrupted detach of "+stuck+" to finish (PostgreSQL allows one per table)"
			}
			res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: reason, Detail: detail})
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
	if m.DryRun {
		if err := m.mayDDL(ctx, t, "detach "+p.String()); err != nil {
			return false, err
		}
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
		if mm := m.metrics; mm != nil {
			mm.Detached.WithLabelValues(t.Name).Inc()
		}
		m.Logger.Info("partitions: detached", "table", t.Name, "partition", p.String())
		return false, nil
	}
	var stop retry.StopError
	if errors.As(err, &stop) || ctx.Err() != nil {
		return false, err
	}
	if retry.KindOf(err) == retry.KindPrivilege {
		return false, m.privilegeError(ctx, t, "detach "+p.String(), err)
	}
	reason = blockedReason(err)
	m.Logger.Warn("partitions: partition stays attached this pass", "table", t.Name, "partition", p.String(), "reason", reason, "error", err)
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
	err = m.ddl(ctx, t, "detach "+p.String(), true, func(c *pgxpool.Conn) error {
		if p.DetachPending {
			if _, err := c.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", t.Ident, p.Ident())); err != nil {
				return err
			}
			return m.recordDetached(ctx, c, t, p, now, due(t, p, now))
		}
		if t.InCitusMetadata {
			// One transaction: the fence, the check, the DETACH and its
			// record.
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) (err error) {
				if err := m.toWorkers(ctx, tx, t); err != nil {
					return err
				}
				if reason, detail, err = m.fencedCheck(ctx, tx, t, p.Ident(), now); err != nil || reason != "" {
					return err
				}
				if m.TestSignals.BeforeDetach != nil {
					m.TestSignals.BeforeDetach(p)
				}
				return m.detachInCitus(ctx, tx, t, p, now)
			})
		}
		// DETACH ... CONCURRENTLY cannot run in a transaction block, and the
		// fence is a transaction's lock: a transaction on another
		// connection holds it, after checking the holds under it, until
		// the detach has ended. A hold writer waits for it meanwhile.
		fence, err := m.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer fence.Rollback(context.WithoutCancel(ctx))
		if reason, detail, err = m.fencedCheck(ctx, fence, t, p.Ident(), now); err != nil || reason != "" {
			return err
		}
		if _, err := c.Exec(ctx, `INSERT INTO inboxkeeper.partitions (table_name, partition_schema, partition_name, lower_bound, upper_bound, detach_started, relid, bound)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`, t.Name, p.Schema, p.Name, lowerOr(p), p.Upper, now, p.OID, p.Bound); err != nil {
			return fmt.Errorf("record the detach: %w", err)
		}
		if m.TestSignals.BeforeDetach != nil {
			m.TestSignals.BeforeDetach(p)
		}
		if _, err := c.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", t.Ident, p.Ident())); err != nil {
			return err
		}
		return m.recordDetached(ctx, c, t, p, now, true)
	})
	return reason, detail, err
}

// detachInCitus detaches p from a parent Citus manages (distributed, or a
// Citus local table) with a plain DETACH, in tx: Citus refuses CONCURRENTLY
// on them. A plain DETACH takes ACCESS EXCLUSIVE on the parent and the
// partition, on the coordinator and on the workers' shards of them, so each
// of those waits must be bounded: the session's lock_timeout covers the
// coordinator only, and an application query routed to a shard holds its
// lock on the worker, where a DETACH waiting for it would queue every later
// insert into that shard behind it. tx therefore carries the lock timeout
// to the workers (toWorkers) before it gets here. It commits at once (no
// rows move) or not at all, so it never leaves a pending detach; the record
// of its end commits with it.
func (m *Manager) detachInCitus(ctx context.Context, tx pgx.Tx, t *catalog.Table, p Partition, now time.Time) error {
	if _, err := tx.Exec(ctx, `INSERT INTO inboxkeeper.partitions (table_name, partition_schema, partition_name, lower_bound, upper_bound, detach_started, relid, bound)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`, t.Name, p.Schema, p.Name, lowerOr(p), p.Upper, now, p.OID, p.Bound); err != nil {
		return fmt.Errorf("record the detach: %w", err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", t.Ident, p.Ident())); err != nil {
		return err
	}
	return m.recordDetached(ctx, tx, t, p, now, true)
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
		m.Logger.Warn("partitions: finished a detach someone else started on a partition that is not due; the table is left in place and will not be dropped",
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
INSERT INTO inboxkeeper.partitions (table_name, partition_schema, partition_name, lower_bound, upper_bound, detach_started, detached_at, relid, bound)
SELECT $3, $1, $2, $5, $6, $4, $4, $7, $8 WHERE NOT EXISTS (SELECT 1 FROM upd)`, p.Schema, p.Name, t.Name, now, lowerOr(p), p.Upper, p.OID, p.Bound)
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

// fencedCheck takes the hold fence in tx, within the DDL lock timeout, and
// then says whether an active hold or replay covers a row of source: no
// hold can commit after the check until tx ends.
func (m *Manager) fencedCheck(ctx context.Context, tx pgx.Tx, t *catalog.Table, source string, now time.Time) (reason, detail string, err error) {
	s := m.txSettings()
	s.LockTimeout = m.LockTimeout
	if _, err := s.Apply(ctx, tx); err != nil {
		return "", "", err
	}
	if _, err := tx.Exec(ctx, holds.BatchFenceSQL); err != nil {
		if retry.Code(err) == retry.SQLStateLockTimeout {
			return "", "", holds.FenceBlocked(ctx, m.pool, err)
		}
		return "", "", err
	}
	return coveredIn(ctx, tx, t, source, now, dbconn.TxSettings{})
}

func coveredIn(ctx context.Context, tx pgx.Tx, t *catalog.Table, source string, now time.Time, s dbconn.TxSettings) (reason, detail string, err error) {
	if s != (dbconn.TxSettings{}) {
		if _, err := s.Apply(ctx, tx); err != nil {
			return "", "", err
		}
	}
	cov, err := holds.Active(ctx, tx, t, now)
	if err != nil || cov.Empty() {
		return "", "", err
	}
	var args sqlargs.List
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
	ids := make([]int64, 0, len(c.Holds))
	for _, h := range c.Holds {
		ids = append(ids, h.ID)
	}
	return "covered by an active hold (" + someIDs(ids) + ")"
}

func replayIDs(c holds.Coverage) string {
	ids := make([]int64, 0, len(c.Replays))
	for _, r := range c.Replays {
		ids = append(ids, r.ID)
	}
	return "covered by an active replay (" + someIDs(ids) + ")"
}

// someIDs lists the first ten ids, and how many more there are.
func someIDs(ids []int64) string {
	s := "ids"
	for i, id := range ids {
		if i == 10 {
			return s + fmt.Sprintf(" and %d more", len(ids)-10)
		}
		s += fmt.Sprintf(" %d", id)
	}
	return s
}

// dropDetached settles the control schema's records: a detach that a dead
// pass started is found, and every partition detached for longer than
// detached_retention is dropped, its permanent keys copied out first in the
// same transaction, unless a hold or replay covers a row of it.
func (m *Manager) dropDetached(ctx context.Context, t *catalog.Table, now time.Time, res *TableResult) error {
	type rec struct {
		schema, name  string
		lower         pgtype.Timestamptz // -infinity: a partition FROM (MINVALUE) (lowerOr)
		upper         time.Time
		started       time.Time
		detachedAt    *time.Time
		relid         *uint32
		exists, child bool
	}
	rows, err := m.pool.Query(ctx, `
SELECT r.partition_schema, r.partition_name, r.lower_bound, r.upper_bound, r.detach_started, r.detached_at, r.relid,
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
		err := r.Scan(&x.schema, &x.name, &x.lower, &x.upper, &x.started, &x.detachedAt, &x.relid, &x.exists, &x.child)
		return x, err
	})
	if err != nil {
		return fmt.Errorf("read detached partitions: %w", err)
	}
	keep := t.Policy.Partitions.DetachedRetention
	if m.DryRun && keep <= 0 {
		// With no retention, the pass drops what it detaches (it passed
		// the holds check already, as the detach would): a dry run lists
		// those too, which are not yet recorded as detached.
		res.Dropped = append(res.Dropped, res.Detached...)
	}
	for _, r := range recs {
		p := Partition{Schema: r.schema, Name: r.name}
		key := []any{r.schema, r.name, r.started}
		switch {
		case !r.exists:
			m.Logger.Warn("partitions: a detached partition is gone (dropped by hand?)", "table", t.Name, "partition", p.String())
			if !m.DryRun {
				if _, err := m.pool.Exec(ctx, `UPDATE inboxkeeper.partitions SET dropped_at = $4
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now)...); err != nil {
					return err
				}
			}
			continue
		case r.detachedAt == nil && r.child:
			// Still attached (the retire step finishes pending ones), or
			// its detach failed before phase one: nothing to drop.
			if !m.DryRun {
				if _, err := m.pool.Exec(ctx, `DELETE FROM inboxkeeper.partitions r WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3
AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = to_regclass(quote_ident($1) || '.' || quote_ident($2)) AND NOT i.inhdetachpending)`, key...); err != nil {
					return err
				}
			}
			continue
		case r.detachedAt == nil:
			// Detached by a pass that died before recording it.
			if !m.DryRun {
				if _, err := m.pool.Exec(ctx, `UPDATE inboxkeeper.partitions SET detached_at = $4
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now)...); err != nil {
					return err
				}
			}
			r.detachedAt = &now
		}
		dropAt := r.detachedAt.Add(keep)
		var lower *time.Time
		if r.lower.Valid && r.lower.InfinityModifier == pgtype.Finite {
			lower = &r.lower.Time
		}
		w := Detached{Schema: r.schema, Name: r.name, Lower: lower, Upper: r.upper, DetachedAt: r.detachedAt, DropAt: &dropAt}
		if dropAt.After(now) {
			res.Waiting = append(res.Waiting, w)
			continue
		}
		rec := record{schema: r.schema, name: r.name, relid: r.relid}
		dropped, reason, detail, err := m.drop(ctx, t, rec, key, now)
		if reason == ReasonUntrusted {
			m.untrusted(t, rec, detail, res)
			continue
		}
		if err != nil {
			var stop retry.StopError
			if errors.As(err, &stop) || ctx.Err() != nil {
				return err
			}
			if retry.KindOf(err) == retry.KindPrivilege {
				return m.privilegeError(ctx, t, "drop "+p.String(), err)
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
// that the relation bears its record out (vouch) and the holds (under the
// fence), and copies the permanent keys out.
func (m *Manager) drop(ctx context.Context, t *catalog.Table, rec record, key []any, now time.Time) (dropped bool, reason, detail string, err error) {
	p := Partition{Schema: rec.schema, Name: rec.name}
	if m.DryRun {
		if err := m.mayDDL(ctx, t, "drop "+p.String()); err != nil {
			return false, "", "", err
		}
		err = pgx.BeginTxFunc(ctx, m.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			why, err := m.vouch(ctx, tx, t, rec, now)
			if err != nil || why != "" {
				reason, detail = ReasonUntrusted, why
				return err
			}
			reason, detail, err = coveredIn(ctx, tx, t, p.Ident(), now, m.txSettings())
			return err
		})
		return reason == "" && err == nil, reason, detail, err
	}
	// Its keys go out in paced slices first, while a standby streams
	// (keys.go); the copy below then finds them there.
	ahead, err := m.copyKeysAhead(ctx, t, p, now)
	if err != nil {
		return false, "", "", err
	}
	var copied int64
	// The DROP takes ACCESS EXCLUSIVE on the table's shards too.
	err = m.ddlTx(ctx, t, "drop "+p.String(), true, func(tx pgx.Tx) error {
		// Another instance may have dropped it meanwhile.
		var mine bool
		dropped, reason, detail, copied = false, "", "", ahead
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inboxkeeper.partitions
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3 AND dropped_at IS NULL FOR UPDATE)`, key...).Scan(&mine); err != nil || !mine {
			return err
		}
		why, err := m.vouch(ctx, tx, t, rec, now)
		if err != nil || why != "" {
			reason, detail = ReasonUntrusted, why
			return err
		}
		if reason, detail, err = m.fencedCheck(ctx, tx, t, p.Ident(), now); err != nil || reason != "" {
			return err
		}
		// Copying keys reads the whole partition: no statement
		// timeout for it.
		if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', '0', true)"); err != nil {
			return err
		}
		n, err := tiering.CopyPermanentKeys(ctx, tx, t, p.Ident())
		if err != nil {
			return fmt.Errorf("copy permanent keys out of %s: %w", p, err)
		}
		copied += n
		if _, err := tx.Exec(ctx, "DROP TABLE "+p.Ident()); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE inboxkeeper.partitions SET dropped_at = $4, keys_copied = $5
WHERE partition_schema = $1 AND partition_name = $2 AND detach_started = $3`, append(key, now, copied)...)
		dropped = err == nil
		return err
	})
	if err != nil || !dropped {
		return false, reason, detail, err
	}
	m.Logger.Info("partitions: dropped", "table", t.Name, "partition", p.String(), "permanent_keys_copied", copied)
	if mm := m.metrics; mm != nil {
		mm.Dropped.WithLabelValues(t.Name).Inc()
	}
	return true, "", "", nil
}
