package partitions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// toWorkers makes the DDL lock timeout hold on the Citus workers for the
// rest of tx, when t is distributed: the session-level lock_timeout of a
// DDL connection stays on the coordinator, and Citus forwards only SET
// LOCAL commands, once citus.propagate_set_commands is 'local', to the
// transactions it opens on the workers. It runs first in tx, before any
// statement opens a connection to a worker. A Citus local table's DDL
// reaches the workers too (their copies of its metadata).
func (m *Manager) toWorkers(ctx context.Context, tx dbconn.Querier, t *catalog.Table) error {
	if !t.InCitusMetadata {
		return nil
	}
	_, err := dbconn.TxSettings{LockTimeout: m.LockTimeout, IdleInTx: m.IdleTimeout, Citus: true}.Apply(ctx, tx)
	return err
}

// errLockWait marks a DDL statement cancelled because a session queued
// behind a lock it held.
var errLockWait = retry.ErrLockWait

// ddl runs fn on a connection of its own with lock_timeout set for the
// session (DETACH CONCURRENTLY cannot run in a transaction block), after
// the lease and, when paced, the throttle allow it, and with the throttle
// watching for sessions that queue behind it. A detach and a drop are
// paced; creating a month ahead is not (premake): it writes a few kB of
// catalog, a missing month makes the application's inserts fail, and a
// standby that applies nothing held a `once` there for ever, whatever its
// RUN_TIME.
func (m *Manager) ddl(ctx context.Context, t *catalog.Table, what string, paced bool, fn func(c *pgxpool.Conn) error) (err error) {
	if why, ok := m.CheckActive(); !ok {
		return retry.StopError{Early: why}
	}
	if th := m.Throttle; th != nil && paced {
		// A statement's WAL (about 150 kB for a DETACH and a DROP, the
		// catalog pages' images) waits for room in the standbys' windows,
		// as a batch does.
		if err := service.AdmitWrite(ctx, th); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			reason, _ := service.Held(err)
			return retry.StopError{Early: retry.Throttled("throttled (" + reason + ")")}
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
			if mm := m.metrics; mm != nil && mm.Errors != nil {
				mm.Errors.WithLabelValues(t.Name, string(kind)).Inc()
			}
		}
	}()
	// Session settings: this connection is a session of its own (direct,
	// or INBOXKEEPER_SESSION_DATABASE_URL), never one a transaction pooler
	// shares. idle_session_timeout ends the session, and its fence lock
	// with it, should this process freeze between statements.
	// The process id is the server's: behind a session pooler the one the
	// connection was told at its start is the pooler's own.
	idle := retry.Millis(m.IdleTimeout)
	var pid uint32
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid(), set_config('lock_timeout', $1, false), set_config('idle_session_timeout', $2, false),
       set_config('idle_in_transaction_session_timeout', $2, false)`, retry.Millis(m.LockTimeout), idle).Scan(&pid, nil, nil, nil); err != nil {
		return err
	}
	defer func() {
		if _, rerr := c.Exec(context.WithoutCancel(ctx), "RESET lock_timeout; RESET idle_session_timeout; RESET idle_in_transaction_session_timeout"); rerr != nil {
			// Never hand a connection with a changed setting back.
			c.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if th := m.Throttle; th != nil {
		done, blocked := th.Watch(pid, time.Time{})
		defer func() {
			done()
			if err != nil && blocked() {
				err = fmt.Errorf("%w (%v)", errLockWait, err)
			}
		}()
	}
	if err := fn(c); err != nil {
		// A worker's error names its node (Citus).
		return fmt.Errorf("%s: %w", what, dbconn.OnNode(err))
	}
	return nil
}

// ddlTx runs fn in a transaction of a DDL session (ddl) under the DDL
// retry policy, with the lock timeout carried to the Citus workers first
// (toWorkers).
func (m *Manager) ddlTx(ctx context.Context, t *catalog.Table, what string, paced bool, fn func(tx pgx.Tx) error) error {
	return m.retrying(ctx, t, what, func() error {
		return m.ddl(ctx, t, what, paced, func(c *pgxpool.Conn) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				if err := m.toWorkers(ctx, tx, t); err != nil {
					return err
				}
				return fn(tx)
			})
		})
	})
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
		MaxRetries: m.MaxRetries,
		Base:       200 * time.Millisecond,
		Retry: func(err error, kind retry.Kind) bool {
			var stop retry.StopError
			var gone errGone
			return !errors.As(err, &stop) && !errors.As(err, &gone) && (kind.Transient() || kind == retry.KindLockWait)
		},
		OnRetry: func(kind retry.Kind, attempt int, wait time.Duration, err error) {
			m.Logger.Warn("partitions: DDL failed, retrying", "table", t.Name, "step", what, "kind", kind, "attempt", attempt+1, "wait", wait, "error", err)
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

// privilegeError says which role lacks what, for a step that failed for
// want of a privilege (42501): a failure of the pass, never a partition
// that waits, for waiting changes nothing until a grant does.
func (m *Manager) privilegeError(ctx context.Context, t *catalog.Table, step string, err error) error {
	if errors.Is(err, errPrivilegeSaid) {
		return err
	}
	var me, owner string
	if qerr := m.pool.QueryRow(ctx, `SELECT current_user::text, pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = $1`, t.OID).Scan(&me, &owner); qerr != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return fmt.Errorf("%w: %s: role %s may not: %w. Partitions are created, detached and dropped by the owner of %s (%s): make %s a member of %s, and grant it INSERT on %s (docs/operations/least-privilege.md)",
		errPrivilegeSaid, step, me, err, t.Name, owner, me, owner, "inboxkeeper.fence")
}

// errPrivilegeSaid marks an error privilegeError has already explained.
var errPrivilegeSaid = errors.New("partitions")

// mayDDL is what a dry run checks instead of running the DDL: that this
// role may take the fence and act as the owner of t.
func (m *Manager) mayDDL(ctx context.Context, t *catalog.Table, step string) error {
	var owner, fence bool
	if err := m.pool.QueryRow(ctx, `SELECT pg_has_role(current_user, relowner, 'USAGE'), has_table_privilege('inboxkeeper.fence', 'INSERT')
FROM pg_class WHERE oid = $1`, t.OID).Scan(&owner, &fence); err != nil {
		return err
	}
	if owner && fence {
		return nil
	}
	return m.privilegeError(ctx, t, step, fmt.Errorf("%w: a dry run; the pass would fail (member of the owner: %v, INSERT on inboxkeeper.fence: %v)", retry.ErrPrivilege, owner, fence))
}

// blockedReason is why a partition waits, for status and metrics, after a
// failed step: lock_timeout (a busy table) or error.
func blockedReason(err error) string {
	if k := retry.KindOf(err); k == retry.KindLockTimeout || k == retry.KindLockWait {
		return "lock_timeout"
	}
	return "error"
}
