// Package holds stores holds (legal hold, incident, redrive) and replay
// markers in the control schema, and turns the active ones into the SQL
// predicate the deleter uses to leave covered rows alone.
//
// The fence: a cleanup batch locks the table inboxkeeper.fence in ROW
// EXCLUSIVE mode before it reads the active holds, and adding a hold or
// starting a replay locks it in SHARE mode, which conflicts, before
// committing. So a batch that was in flight when the hold was written
// commits before the hold's command returns, and every batch that commits
// later took its snapshot after the hold committed. A table lock, unlike an
// advisory lock, is bounded by the table's grants: a role that was granted
// nothing on inboxkeeper.fence cannot take it, and so cannot stall either
// side.
//
// Holds, replay markers and their ends are written with a durable commit
// (dbconn.Durable): whatever synchronous_commit the session inherits, a
// hold that `hold add` reported survives a crash.
//
// Daemon internals: the command line and the daemon use it; its API may change
// between releases. Holds are added with `inboxkeeper hold add`.
package holds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// FenceTable is the relation the hold fence locks. No row is ever written
// to it.
const FenceTable = "inboxkeeper.fence"

// BatchFenceSQL takes the fence for a cleanup step (a delete or demotion
// batch, a partition's detach or drop): ROW EXCLUSIVE, which needs INSERT on
// inboxkeeper.fence, does not conflict with itself, and conflicts with the
// writers' SHARE.
const BatchFenceSQL = "LOCK TABLE inboxkeeper.fence IN ROW EXCLUSIVE MODE"

// writerFenceSQL takes the fence for a hold or replay writer: SHARE, which
// needs UPDATE on inboxkeeper.fence.
const writerFenceSQL = "LOCK TABLE inboxkeeper.fence IN SHARE MODE"

// ErrFenceBlocked is a cleanup step that could not take the fence within
// its lock_timeout: a hold or replay is being written, or a session holds a
// conflicting lock on inboxkeeper.fence. The step takes nothing and is
// tried again.
var ErrFenceBlocked = retry.ErrFence

// FenceBlocked wraps err, a lock timeout on the fence, naming who holds it.
func FenceBlocked(ctx context.Context, db Beginner, err error) error {
	who, rerr := FenceHolders(ctx, db)
	if rerr != nil {
		who = "(could not read them: " + rerr.Error() + ")"
	}
	return fmt.Errorf("%w by %s; a hold or replay writer holds it for a moment, anything longer is a session to end: %w", ErrFenceBlocked, who, err)
}

// Querier is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Querier interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Beginner starts transactions: *pgx.Conn or *pgxpool.Pool.
type Beginner interface {
	Begin(context.Context) (pgx.Tx, error)
}

// ErrNotFound is returned for an id that names no hold or replay, or one
// already released or finished.
var ErrNotFound = errors.New("not found")

// ErrInvalid marks a hold or replay the table's policy cannot honour.
var ErrInvalid = errors.New("invalid")

// Hold keeps rows of one table, optionally only one scope value and/or one
// event-time range [From, To), until released or expired.
type Hold struct {
	ID         int64
	Table      string
	Scope      *string
	From, To   *time.Time
	Reason     string
	Owner      string
	CreatedAt  time.Time
	ExpiresAt  *time.Time
	ReleasedAt *time.Time
	// Blocks is what the hold stops: BlocksAll (demotion and deletion, a
	// legal hold) or BlocksDelete (deletion only, like a replay marker).
	Blocks string
}

// What a hold blocks.
const (
	BlocksAll    = "all"    // demotion of the payload and deletion of the row
	BlocksDelete = "delete" // deletion only: the payload may still be demoted
)

// Replay marks a scope and event-time range being replayed: its rows must
// stay until the replay finishes.
type Replay struct {
	ID         int64
	Table      string
	Scope      string
	From, To   time.Time
	Owner      string
	StartedAt  time.Time
	FinishedAt *time.Time
	// BeyondWindow: started with --force although it reaches past what is
	// still remembered.
	BeyondWindow bool
}

// HoldSpec is what `inboxkeeper hold add` asks for.
type HoldSpec struct {
	Scope    *string
	From, To *time.Time
	Reason   string
	Owner    string
	// Expires ends the hold at that instant, which must lie in the future
	// on the database's clock; or ExpiresIn ends it that long after the
	// database's now. At most one of them; neither: the hold stays until
	// released.
	Expires   *time.Time
	ExpiresIn time.Duration
	Blocks    string // BlocksAll or BlocksDelete; "" means BlocksAll
	Fence     FenceOptions
}

// FenceOptions bound how a hold or replay writer waits for the fence.
type FenceOptions struct {
	// Timeout is the longest the writer waits for the cleanup batches in
	// flight (default config.DefaultFenceTimeout); then it fails with
	// ErrFenceTimeout, naming the sessions that hold the fence, and writes
	// nothing.
	Timeout time.Duration
	// IdleTimeout is the transaction's idle_in_transaction_session_timeout
	// (default config.DefaultIdleTimeout).
	IdleTimeout time.Duration
}

// ErrFenceTimeout: the fence could not be taken in time; nothing was written.
var ErrFenceTimeout = errors.New("timed out waiting for the cleanup batches in flight (the hold fence)")

// ReplaySpec is what `inboxkeeper replay start` asks for.
type ReplaySpec struct {
	Scope    string
	From, To time.Time
	Owner    string
	// Force starts a replay whose range reaches past what is still
	// remembered; the marker records that it did.
	Force bool
	Fence FenceOptions
	// Record is what the policy's retention record of the scope promises,
	// for a scope whose rule is not installed (plan --apply); nil: the
	// policy has no record with an event-time horizon for it.
	Record *Record
}

// Record is a retention record's promise for event-time replays: an
// identity is remembered Replay + Margin after its event time.
type Record struct {
	Replay, Margin time.Duration
	Source         string // where the record is, for messages ("the retention record of scope payments in inboxkeeper.yaml")
}

// ErrBeyondWindow refuses a replay that reaches further back than the
// deployed retention rule remembers: its oldest messages may already be
// forgotten and would be applied again.
var ErrBeyondWindow = errors.New("replay reaches past the deduplication window")

func checkRange(t *catalog.Table, from, to *time.Time) error {
	if (from == nil) != (to == nil) {
		return fmt.Errorf("%w: --from and --to go together", ErrInvalid)
	}
	if from == nil {
		return nil
	}
	if !t.HasEventTime() {
		return fmt.Errorf("%w: table %s has no event_time column in the policy, so an event-time range cannot be held", ErrInvalid, t.Name)
	}
	if !from.Before(*to) {
		return fmt.Errorf("%w: --from (%s) must be before --to (%s)", ErrInvalid, from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	return nil
}

// normaliseScope casts the value to the scope column's type and back, so
// that "ABC" given for a uuid column matches the stored "abc", and a value
// the column could never hold is refused now rather than at cleanup time.
func normaliseScope(ctx context.Context, tx pgx.Tx, t *catalog.Table, v string) (string, error) {
	if !t.HasScope() {
		return "", fmt.Errorf("%w: table %s has no scope column in the policy, so a scope cannot be held", ErrInvalid, t.Name)
	}
	var out string
	err := tx.QueryRow(ctx, fmt.Sprintf("SELECT CAST(CAST($1 AS text) AS %s)::text", t.Scope.Type), v).Scan(&out)
	if err != nil {
		return "", fmt.Errorf("%w: scope %q is not a valid %s for column %s: %v", ErrInvalid, v, t.Scope.Type, t.Scope.Name, err)
	}
	return out, nil
}

// writeFenced runs write in a durable transaction, then takes the fence: it
// waits for every cleanup batch in flight to finish and keeps new ones out
// until the transaction commits. The wait is bounded by o.Timeout; past it
// the transaction rolls back and the error names the sessions holding the
// fence.
func writeFenced(ctx context.Context, db Beginner, o FenceOptions, write func(tx pgx.Tx) error) error {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = config.DefaultFenceTimeout
	}
	err := dbconn.Durable(ctx, db, func(tx pgx.Tx) error {
		if _, err := (dbconn.TxSettings{IdleInTx: o.IdleTimeout}).Apply(ctx, tx); err != nil {
			return err
		}
		if err := write(tx); err != nil {
			return err
		}
		// The timeout covers the fence alone: set just before it.
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", retry.Millis(timeout)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, writerFenceSQL)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != retry.SQLStateLockTimeout {
		return err
	}
	who, rerr := FenceHolders(ctx, db)
	if rerr != nil {
		who = "(could not read them: " + rerr.Error() + ")"
	}
	return fmt.Errorf("%w after %s; nothing was written. Sessions holding it: %s. A batch takes a moment; a session idle in its transaction is a frozen or vanished process, which PostgreSQL ends after its idle_in_transaction_session_timeout (INBOXKEEPER_IDLE_IN_TRANSACTION_TIMEOUT)",
		ErrFenceTimeout, timeout, who)
}

// FenceHolders describes the other sessions that hold a lock on the fence
// table, and in which mode.
func FenceHolders(ctx context.Context, db Beginner) (string, error) {
	var out []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
SELECT l.pid, l.mode, coalesce(a.application_name, ''), coalesce(a.usename::text, ''), coalesce(a.state, ''), a.xact_start, a.state_change
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = to_regclass($1)
ORDER BY a.xact_start NULLS LAST, l.pid`, FenceTable)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var pid int32
			var mode, app, user, state string
			var xact, change pgtype.Timestamptz
			if err := r.Scan(&pid, &mode, &app, &user, &state, &xact, &change); err != nil {
				return "", err
			}
			s := fmt.Sprintf("pid %d (%s, role %q, application_name %q, state %q", pid, mode, user, app, state)
			if xact.Valid {
				s += ", in a transaction since " + xact.Time.UTC().Format(time.RFC3339)
			}
			if change.Valid {
				s += ", in this state since " + change.Time.UTC().Format(time.RFC3339)
			}
			return s + ")", nil
		})
		return err
	})
	if err != nil {
		return "", err
	}
	if len(out) == 0 {
		return "none any more (retry)", nil
	}
	return strings.Join(out, "; "), nil
}

// FenceBlockers describes the sessions that hold a lock on the fence in a
// mode that keeps the cleanup out (anything stronger than ROW EXCLUSIVE),
// or "" when none does: a hold or replay writer for a moment, anything
// longer a session to look at.
func FenceBlockers(ctx context.Context, db Querier) (string, error) {
	rows, err := db.Query(ctx, `
SELECT format('pid %s (%s, role %L, application_name %L, since %s)', l.pid, l.mode, coalesce(a.usename::text, ''),
       coalesce(a.application_name, ''), to_char(a.xact_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.relation = to_regclass($1)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.mode NOT IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
ORDER BY a.xact_start NULLS LAST, l.pid`, FenceTable)
	if err != nil {
		return "", fmt.Errorf("read who holds the fence: %w", err)
	}
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(who, "; "), err
}

// Powers lists what the connected role may do that the daemon's role must
// not: write holds, replay markers, retention rules or settings, or own the
// control schema. Run as the daemon's login, anything listed is what a leaked
// secret could do (deploy/sql/role.sql gives none of it).
func Powers(ctx context.Context, db Querier) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT what FROM (VALUES
  ('own the control schema inboxkeeper', pg_has_role((SELECT nspowner FROM pg_namespace WHERE nspname = 'inboxkeeper'), 'USAGE')),
  ('release holds (UPDATE on inboxkeeper.holds)', has_table_privilege('inboxkeeper.holds', 'UPDATE')),
  ('add holds (INSERT on inboxkeeper.holds)', has_table_privilege('inboxkeeper.holds', 'INSERT')),
  ('finish replays (UPDATE on inboxkeeper.replays)', has_table_privilege('inboxkeeper.replays', 'UPDATE')),
  ('change retention rules (UPDATE on inboxkeeper.retention_rules)', has_table_privilege('inboxkeeper.retention_rules', 'UPDATE')),
  ('change runtime settings (INSERT on inboxkeeper.settings)', has_table_privilege('inboxkeeper.settings', 'INSERT')),
  ('stall the cleanup (UPDATE on inboxkeeper.fence, the hold writers'' lock)', has_table_privilege('inboxkeeper.fence', 'UPDATE'))
) p(what, may) WHERE may`)
	if err != nil {
		return nil, fmt.Errorf("read what this role may do: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// AddHold writes a hold and returns its id once no cleanup transaction can
// delete a row it covers.
func AddHold(ctx context.Context, db Beginner, t *catalog.Table, s HoldSpec) (int64, error) {
	if strings.TrimSpace(s.Reason) == "" {
		return 0, fmt.Errorf("%w: a hold needs a reason", ErrInvalid)
	}
	if strings.TrimSpace(s.Owner) == "" {
		return 0, fmt.Errorf("%w: a hold needs an owner", ErrInvalid)
	}
	if err := checkRange(t, s.From, s.To); err != nil {
		return 0, err
	}
	blocks := s.Blocks
	switch blocks {
	case "":
		blocks = BlocksAll
	case BlocksAll, BlocksDelete:
	default:
		return 0, fmt.Errorf("%w: a hold blocks %q or %q, not %q", ErrInvalid, BlocksDelete, BlocksAll, s.Blocks)
	}
	if s.Expires != nil && s.ExpiresIn != 0 {
		return 0, fmt.Errorf("%w: give --expires or --for, not both", ErrInvalid)
	}
	if s.ExpiresIn < 0 {
		return 0, fmt.Errorf("%w: --for %s must be positive", ErrInvalid, s.ExpiresIn)
	}
	var id int64
	err := writeFenced(ctx, db, s.Fence, func(tx pgx.Tx) error {
		var scope *string
		if s.Scope != nil {
			v, err := normaliseScope(ctx, tx, t, *s.Scope)
			if err != nil {
				return err
			}
			scope = &v
		}
		// A hold that has already ended protects nothing: a mistyped year
		// must fail loudly, not pass for a legal hold. The database's clock
		// decides, as it does for the batches.
		var now time.Time
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return err
		}
		expires := s.Expires
		if s.ExpiresIn > 0 {
			e := now.Add(s.ExpiresIn)
			expires = &e
		}
		if expires != nil && !expires.After(now) {
			return fmt.Errorf("%w: the hold would expire at %s, which is not in the future (the database's now is %s); nothing was written",
				ErrInvalid, expires.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		if err := tx.QueryRow(ctx, `
INSERT INTO inboxkeeper.holds (table_name, scope_value, event_from, event_to, reason, owner, expires_at, blocks)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
			t.Name, scope, s.From, s.To, s.Reason, s.Owner, expires, blocks).Scan(&id); err != nil {
			return fmt.Errorf("add hold: %w", err)
		}
		return nil
	})
	return id, err
}

// ReleaseHold ends a hold. Loosening needs no fence: a batch that still sees
// the hold merely keeps rows one pass longer.
func ReleaseHold(ctx context.Context, db Beginner, id int64) error {
	return endRecord(ctx, db, "UPDATE inboxkeeper.holds SET released_at = now() WHERE id = $1 AND released_at IS NULL",
		id, "hold", "release", "released")
}

// endRecord runs update, which ends record id (what: hold or replay) unless
// it has ended already; verb and done say how it ends, for the errors.
// Ending one that does not exist, or not any more, is ErrNotFound. The
// commit is durable: an end that was reported must not come back in a
// crash, any more than a hold may be lost in one.
func endRecord(ctx context.Context, db Beginner, update string, id int64, what, verb, done string) error {
	var tag pgconn.CommandTag
	err := dbconn.Durable(ctx, db, func(tx pgx.Tx) (err error) {
		tag, err = tx.Exec(ctx, update, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s %s %d: %w", verb, what, id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s %d: %w (or already %s)", what, id, ErrNotFound, done)
	}
	return nil
}

// StartReplay writes a replay marker, fenced like AddHold.
func StartReplay(ctx context.Context, db Beginner, t *catalog.Table, s ReplaySpec) (int64, error) {
	if strings.TrimSpace(s.Owner) == "" {
		return 0, fmt.Errorf("%w: a replay needs an owner", ErrInvalid)
	}
	if err := checkRange(t, &s.From, &s.To); err != nil {
		return 0, err
	}
	var id int64
	err := writeFenced(ctx, db, s.Fence, func(tx pgx.Tx) error {
		scope, err := normaliseScope(ctx, tx, t, s.Scope)
		if err != nil {
			return err
		}
		beyond, err := beyondWindow(ctx, tx, t, scope, s)
		if err != nil {
			return err
		}
		if beyond != "" && !s.Force {
			return fmt.Errorf("%w: %s; use --force to start it anyway (it is recorded and counted)", ErrBeyondWindow, beyond)
		}
		if err := tx.QueryRow(ctx, `
INSERT INTO inboxkeeper.replays (table_name, scope_value, event_from, event_to, owner, beyond_window)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, t.Name, scope, s.From, s.To, s.Owner, beyond != "").Scan(&id); err != nil {
			return fmt.Errorf("start replay: %w", err)
		}
		return nil
	})
	return id, err
}

// beyondWindow explains why a replay reaches past what is still
// remembered, or returns "". What is remembered is, in this order: what the
// installed rule promises (every identity whose event time is at or after
// now - (replay horizon + margin)); what the policy's retention record of
// the scope promises, when its rule is not installed; else what the table
// holds: a range that ends before the oldest event it holds for the scope,
// or a scope of which it holds none, is remembered by nothing. A table
// with a permanent key remembers every key it deletes: that last judgement
// does not apply to it.
func beyondWindow(ctx context.Context, tx pgx.Tx, t *catalog.Table, scope string, s ReplaySpec) (string, error) {
	from := s.From.UTC().Format(time.RFC3339)
	var start time.Time
	err := tx.QueryRow(ctx, `SELECT now() - (replay + margin) FROM inboxkeeper.retention_rules
WHERE schema_name = $1 AND table_name = $2 AND scope = $3 AND replay IS NOT NULL`,
		t.Policy.Name.Schema, t.Policy.Name.Name, scope).Scan(&start)
	switch {
	case err == nil:
		if s.From.Before(start) {
			return fmt.Sprintf("it starts at %s, but only events since %s are still remembered for scope %q (the installed rule)",
				from, start.UTC().Format(time.RFC3339), scope), nil
		}
		return "", nil
	case !errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("read the retention rule: %w", err)
	case s.Record != nil:
		if err := tx.QueryRow(ctx, `SELECT now() - $1::int8 * interval '1 microsecond'`, (s.Record.Replay + s.Record.Margin).Microseconds()).Scan(&start); err != nil {
			return "", err
		}
		if s.From.Before(start) {
			return fmt.Sprintf("it starts at %s, but only events since %s are still remembered for scope %q (%s, not installed: plan --apply installs it)",
				from, start.UTC().Format(time.RFC3339), scope, s.Record.Source), nil
		}
		return "", nil
	case t.Policy.Tiers != nil && t.Policy.Tiers.PermanentKey != nil:
		return "", nil // its permanent key remembers what is deleted
	}
	// Neither: what the table still holds of the scope.
	var oldest *time.Time
	err = tx.QueryRow(ctx, fmt.Sprintf(`SELECT min(%s) FROM %s t WHERE t.%s = CAST($1 AS %s)`,
		t.EventTime.AsTimestamptz("t"), t.Ident, t.Scope.Quoted, t.Scope.Type), scope).Scan(&oldest)
	switch {
	case err != nil:
		return "", fmt.Errorf("read the oldest event of scope %q: %w", scope, err)
	case oldest == nil:
		return fmt.Sprintf("table %s holds no event of scope %q: nothing of it is remembered (and no retention rule or record says how long it would be)",
			t.Name, scope), nil
	case !s.To.After(*oldest):
		return fmt.Sprintf("it ends at %s, before the oldest event table %s still holds for scope %q (%s): nothing of the range is remembered (and no retention rule or record says how long it would be)",
			s.To.UTC().Format(time.RFC3339), t.Name, scope, oldest.UTC().Format(time.RFC3339)), nil
	}
	return "", nil
}

// FinishReplay ends a replay marker.
func FinishReplay(ctx context.Context, db Beginner, id int64) error {
	return endRecord(ctx, db, "UPDATE inboxkeeper.replays SET finished_at = now() WHERE id = $1 AND finished_at IS NULL",
		id, "replay", "finish", "finished")
}

const holdColumns = `id, table_name, scope_value, event_from, event_to, reason, owner, created_at, expires_at, released_at, blocks`

func scanHolds(rows pgx.Rows) ([]Hold, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Hold, error) {
		var h Hold
		err := r.Scan(&h.ID, &h.Table, &h.Scope, &h.From, &h.To, &h.Reason, &h.Owner, &h.CreatedAt, &h.ExpiresAt, &h.ReleasedAt, &h.Blocks)
		return h, err
	})
}

const replayColumns = `id, table_name, scope_value, event_from, event_to, owner, started_at, finished_at, beyond_window`

func scanReplays(rows pgx.Rows) ([]Replay, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Replay, error) {
		var p Replay
		err := r.Scan(&p.ID, &p.Table, &p.Scope, &p.From, &p.To, &p.Owner, &p.StartedAt, &p.FinishedAt, &p.BeyondWindow)
		return p, err
	})
}

// ListHolds returns the holds active at the database's now, or every hold
// ever written when all is true.
func ListHolds(ctx context.Context, db Querier, all bool) ([]Hold, error) {
	rows, err := db.Query(ctx, `SELECT `+holdColumns+` FROM inboxkeeper.holds
WHERE $1 OR (released_at IS NULL AND (expires_at IS NULL OR expires_at > now()))
ORDER BY id`, all)
	if err != nil {
		return nil, fmt.Errorf("list holds: %w", err)
	}
	return scanHolds(rows)
}

// ListReplays returns the active replay markers, or all of them.
func ListReplays(ctx context.Context, db Querier, all bool) ([]Replay, error) {
	rows, err := db.Query(ctx, `SELECT `+replayColumns+` FROM inboxkeeper.replays
WHERE $1 OR finished_at IS NULL ORDER BY id`, all)
	if err != nil {
		return nil, fmt.Errorf("list replays: %w", err)
	}
	return scanReplays(rows)
}

// Coverage is the set of holds and replays active for one table at one
// instant.
type Coverage struct {
	Holds   []Hold
	Replays []Replay
	// scale is set when the table has more than InlineMax active records
	// of a kind: the predicates then read the records in the statement
	// that applies them, and a coverage read for a batch (QueueActive)
	// carries only the first InlineMax of each kind.
	scale *scale
}

// scale is where a coverage at scale was read: the table and the instant
// (nil: the statement's now()).
type scale struct {
	table string
	at    *time.Time
	// truncated: Holds and Replays hold only the first InlineMax.
	truncated bool
}

// InlineMax is the most records of a kind a statement carries as array
// parameters. Beyond it a statement reads them from the control tables,
// with an index look-up per row: 100,000 holds sent with every batch as
// arrays cost 50 to 100 ms a statement to send, decode and plan.
const InlineMax = 100

// AtScale reports whether the predicates read the records from the control
// tables; Holds and Replays may then be the first InlineMax of them.
func (c Coverage) AtScale() bool { return c.scale != nil }

// Empty reports whether nothing protects any row.
func (c Coverage) Empty() bool { return len(c.Holds) == 0 && len(c.Replays) == 0 && c.scale == nil }

// Same reports whether c and o hold the same holds and replays (by id: a
// record's range never changes; one that was released, finished or expired
// is no longer read). Coverages at scale are never the same: what they
// hold is not all known here.
func (c Coverage) Same(o Coverage) bool {
	return c.scale == nil && o.scale == nil &&
		slices.EqualFunc(c.Holds, o.Holds, func(a, b Hold) bool { return a.ID == b.ID }) &&
		slices.EqualFunc(c.Replays, o.Replays, func(a, b Replay) bool { return a.ID == b.ID })
}

// union is a's records, then those of b whose id a lacks, each once.
func union[T any](a, b []T, id func(T) int64) []T {
	u := slices.Clone(a)
	seen := make(map[int64]bool, len(a)+len(b))
	for _, x := range a {
		seen[id(x)] = true
	}
	for _, x := range b {
		if !seen[id(x)] {
			seen[id(x)] = true
			u = append(u, x)
		}
	}
	return u
}

// Union is every hold and replay of c and o, each once: what protected a
// row at either instant. At scale it reads the records active at the
// earlier of the two.
func (c Coverage) Union(o Coverage) Coverage {
	u := Coverage{
		Holds:   union(c.Holds, o.Holds, func(h Hold) int64 { return h.ID }),
		Replays: union(c.Replays, o.Replays, func(r Replay) int64 { return r.ID }),
	}
	switch {
	case c.scale == nil:
		u.scale = o.scale
	case o.scale == nil:
		u.scale = c.scale
	default:
		sc := *c.scale
		sc.truncated = sc.truncated || o.scale.truncated
		if o.scale.at != nil && (sc.at == nil || o.scale.at.Before(*sc.at)) {
			sc.at = o.scale.at
		}
		u.scale = &sc
	}
	return u
}

// Active reads the coverage of t at now: at most InlineMax + 1 records of
// a kind, for a table with more is at scale (AtScale), and its statements
// read them. A table Citus manages gets every record: a statement Citus
// sends to the workers cannot read the coordinator's control tables, so its
// records always travel as parameters.
func Active(ctx context.Context, q Querier, t *catalog.Table, now time.Time) (Coverage, error) {
	if t.InCitusMetadata {
		return readActive(ctx, q, t.Name, now, 0)
	}
	return readActive(ctx, q, t.Name, now, InlineMax+1)
}

// ActiveAll is Active with every record in Holds and Replays, for status.
func ActiveAll(ctx context.Context, q Querier, table string, now time.Time) (Coverage, error) {
	return readActive(ctx, q, table, now, 0)
}

// CountBlocking counts the holds on table that block demotion at now.
func CountBlocking(ctx context.Context, q Querier, table string, now time.Time) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM inboxkeeper.holds h WHERE h.table_name = $1 AND `+activeHold("h", "$2")+
		` AND h.blocks <> `+sqlident.QuoteLiteral(BlocksDelete), table, now).Scan(&n)
	return n, err
}

func readActive(ctx context.Context, q Querier, table string, now time.Time, limit int) (Coverage, error) {
	var c Coverage
	rows, err := q.Query(ctx, activeHoldsSQL("$2", limit), table, now)
	if err != nil {
		return c, fmt.Errorf("read holds: %w", err)
	}
	if c.Holds, err = scanHolds(rows); err != nil {
		return c, fmt.Errorf("read holds: %w", err)
	}
	rows, err = q.Query(ctx, activeReplaysSQL(limit), table)
	if err != nil {
		return c, fmt.Errorf("read replays: %w", err)
	}
	if c.Replays, err = scanReplays(rows); err != nil {
		return c, fmt.Errorf("read replays: %w", err)
	}
	if len(c.Holds) > InlineMax || len(c.Replays) > InlineMax {
		c.scale = &scale{table: table, at: &now, truncated: limit > 0}
		if limit > 0 {
			c.Holds, c.Replays = c.Holds[:min(len(c.Holds), InlineMax)], c.Replays[:min(len(c.Replays), InlineMax)]
		}
	}
	return c, nil
}

// QueueActive queues on b what Active reads, at coalesce(pinned, now()),
// the transaction's now, into c: a batch transaction reads them in the same
// round trip as its fence, each in a statement of its own after it
// (batchloop.Begin). It reads at most InlineMax + 1 records of a kind: a
// table with more is at scale, and its batches read them in their
// statements; all reads every record (a table Citus manages: Active).
func QueueActive(b *pgx.Batch, table string, all bool, pinned *time.Time, c *Coverage) {
	limit := InlineMax + 1
	if all {
		limit = 0
	}
	atScale := func() {
		c.scale = &scale{table: table, at: pinned, truncated: !all}
	}
	b.Queue(activeHoldsSQL("coalesce($2::timestamptz, now())", limit), table, pinned).Query(func(rows pgx.Rows) (err error) {
		if c.Holds, err = scanHolds(rows); err != nil {
			return fmt.Errorf("read holds: %w", err)
		}
		if len(c.Holds) > InlineMax {
			if !all {
				c.Holds = c.Holds[:InlineMax]
			}
			atScale()
		}
		return nil
	})
	b.Queue(activeReplaysSQL(limit), table).Query(func(rows pgx.Rows) (err error) {
		if c.Replays, err = scanReplays(rows); err != nil {
			return fmt.Errorf("read replays: %w", err)
		}
		if len(c.Replays) > InlineMax {
			if !all {
				c.Replays = c.Replays[:InlineMax]
			}
			atScale()
		}
		return nil
	})
}

// activeHoldsSQL reads the holds of table $1 active at the instant at, at
// most limit of them (0: all).
func activeHoldsSQL(at string, limit int) string {
	return `SELECT ` + holdColumns + ` FROM inboxkeeper.holds
WHERE table_name = $1 AND ` + activeHold("holds", at) + ` ORDER BY id` + limitSQL(limit)
}

func activeReplaysSQL(limit int) string {
	return `SELECT ` + replayColumns + ` FROM inboxkeeper.replays
WHERE table_name = $1 AND ` + activeReplay("replays") + ` ORDER BY id` + limitSQL(limit)
}

func limitSQL(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" LIMIT %d", n)
}

// activeHold is true when the hold h (an alias) is active at the instant at.
func activeHold(h, at string) string {
	return h + ".released_at IS NULL AND (" + h + ".expires_at IS NULL OR " + h + ".expires_at > " + at + ")"
}

// activeReplay is true when the replay r (an alias) is active.
func activeReplay(r string) string { return r + ".finished_at IS NULL" }

// Predicates returns SQL expressions, over the row alias, that are true when
// a hold (respectively a replay) covers the row; "false" when none does.
// They never yield NULL. A row whose event time is NULL counts as inside
// every range (its age is unknown, so a ranged hold keeps it); a row whose
// scope is NULL belongs to no scope.
//
// However many records there are, each expression carries at most four
// parameters, arrays of the records' scopes and ranges: a statement's
// parameters are limited to 65,535, and thousands of OR'ed predicates took
// minutes to plan and compile. A scope is looked up in a hashed subplan, a
// range in a multirange built once per statement.
func (c Coverage) Predicates(t *catalog.Table, alias string, args *sqlargs.List) (hold, replay string) {
	if c.inTables(t) {
		at := c.scale.at
		return c.scale.predicate(t, alias, args, "holds", activeHold("h", "coalesce("+args.Add(at)+"::timestamptz, now())")),
			c.scale.predicate(t, alias, args, "replays", activeReplay("h"))
	}
	hs := make([]cover, 0, len(c.Holds))
	for _, h := range c.Holds {
		hs = append(hs, cover{h.Scope, h.From, h.To})
	}
	rs := make([]cover, 0, len(c.Replays))
	for _, r := range c.Replays {
		scope, from, to := r.Scope, r.From, r.To
		rs = append(rs, cover{&scope, &from, &to})
	}
	return covering(t, alias, args, hs), covering(t, alias, args, rs)
}

// DemotionPredicate returns an SQL expression, over the row alias, that is
// true when a hold that blocks demotion (BlocksAll, a legal hold) covers the
// row; "false" when none does. Replay markers and BlocksDelete holds never
// block demotion: a replay needs the identity, not the payload.
func (c Coverage) DemotionPredicate(t *catalog.Table, alias string, args *sqlargs.List) string {
	if c.inTables(t) {
		return c.scale.predicate(t, alias, args, "holds",
			activeHold("h", "coalesce("+args.Add(c.scale.at)+"::timestamptz, now())")+" AND h.blocks <> "+sqlident.QuoteLiteral(BlocksDelete))
	}
	var hs []cover
	for _, h := range c.Holds {
		if h.Blocks == BlocksDelete {
			continue
		}
		hs = append(hs, cover{h.Scope, h.From, h.To})
	}
	return covering(t, alias, args, hs)
}

// inTables says whether the predicates over t read the records from the
// control tables: at scale, unless t is one Citus manages and every record
// was read (Active), for a statement Citus sends to the workers cannot read
// the coordinator's tables.
func (c Coverage) inTables(t *catalog.Table) bool {
	return c.scale != nil && (c.scale.truncated || !t.InCitusMetadata)
}

// BlocksDemotion reports whether any hold blocks demotion: at scale, it
// may (the predicate then reads which).
func (c Coverage) BlocksDemotion() bool {
	if c.scale != nil {
		return true
	}
	for _, h := range c.Holds {
		if h.Blocks != BlocksDelete {
			return true
		}
	}
	return false
}

// predicate is true when a record of the control table kind (holds or
// replays) for which active (over the alias h) holds covers the row: the
// records are read in the statement, not sent with it. A record with a
// scope is found through the index on (table_name, scope_value), one look-up
// per row; the records without one are read once per statement (InitPlans):
// whether one covers the whole table, whether one has a range, and their
// ranges as one multirange where the event-time column is a timestamp. As
// everywhere, a record's scope counts only where the table has a scope
// column, its range only where it has an event-time column.
func (sc *scale) predicate(t *catalog.Table, alias string, args *sqlargs.List, kind, active string) string {
	tbl := args.Add(sc.table)
	from := "inboxkeeper." + kind + " h WHERE h.table_name = " + tbl + " AND " + active
	scopeless := " AND h.scope_value IS NULL"
	if t.Scope == nil {
		scopeless = "" // no scope column: every record counts as scope-less
	}
	if t.EventTime == nil {
		// No event time: a range takes no part.
		parts := []string{"(SELECT EXISTS (SELECT 1 FROM " + from + scopeless + "))"}
		if t.Scope != nil {
			parts = append(parts, fmt.Sprintf("EXISTS (SELECT 1 FROM %s AND h.scope_value = %s.%s::text)", from, alias, t.Scope.Quoted))
		}
		return orAll(parts)
	}
	col := alias + "." + t.EventTime.Quoted
	parts := []string{
		// A scope-less record without a range covers every row.
		"(SELECT EXISTS (SELECT 1 FROM " + from + scopeless + " AND h.event_from IS NULL))",
		// A row whose event time is NULL is inside every range.
		"(" + col + " IS NULL AND (SELECT EXISTS (SELECT 1 FROM " + from + scopeless + ")))",
	}
	if rng := rangeType(t); rng != "" {
		lo := t.EventTime.Instant("h.event_from")
		// coalesce: range_agg of no records is NULL.
		parts = append(parts, fmt.Sprintf("coalesce(%s <@ (SELECT range_agg(%s(%s, greatest(%s, %s), '[)')) FROM %s%s AND h.event_from IS NOT NULL), false)",
			col, rng, lo, lo, t.EventTime.InstantAbove("h.event_to"), from, scopeless))
	} else {
		parts = append(parts, fmt.Sprintf("EXISTS (SELECT 1 FROM %s%s AND h.event_from IS NOT NULL AND %s)", from, scopeless, inRange(t, col, "h.event_from", "h.event_to")))
	}
	if t.Scope != nil {
		parts = append(parts, fmt.Sprintf("EXISTS (SELECT 1 FROM %s AND h.scope_value = %s.%s::text AND (h.event_from IS NULL OR %s IS NULL OR %s))",
			from, alias, t.Scope.Quoted, col, inRange(t, col, "h.event_from", "h.event_to")))
	}
	return orAll(parts)
}

// rangeType is the range type of the table's event-time column, "" for a
// column no range type of PostgreSQL's own holds.
func rangeType(t *catalog.Table) string {
	switch {
	case t.EventTime.IsTimestamptz():
		return "tstzrange"
	case t.EventTime.Zone != "":
		return "tsrange"
	}
	return ""
}

// cover is what one hold or replay covers: a scope value, an event-time
// range [from, to), both, or (neither) the whole table.
type cover struct {
	scope    *string
	from, to *time.Time
}

// covering is the predicate over alias that is true when one of cs covers
// the row. A record's scope counts only where the table has a scope column,
// its range only where it has an event-time column, as the writers check.
func covering(t *catalog.Table, alias string, args *sqlargs.List, cs []cover) string {
	var scopes []string        // scope only
	var from, to []time.Time   // range only
	var bScopes []string       // scope and range
	var bFrom, bTo []time.Time // scope and range
	seen := map[string]bool{}
	for _, c := range cs {
		scoped := c.scope != nil && t.Scope != nil
		ranged := c.from != nil && c.to != nil && t.EventTime != nil
		switch {
		case !scoped && !ranged:
			return "true" // the whole table
		case scoped && !ranged:
			if !seen[*c.scope] {
				seen[*c.scope] = true
				scopes = append(scopes, *c.scope)
			}
		case ranged && !scoped:
			from, to = append(from, *c.from), append(to, *c.to)
		default:
			bScopes, bFrom, bTo = append(bScopes, *c.scope), append(bFrom, *c.from), append(bTo, *c.to)
		}
	}
	var parts []string
	if len(scopes) > 0 {
		parts = append(parts, inScopes(t, alias, args.Add(scopes)))
	}
	if len(from) > 0 {
		parts = append(parts, inRanges(t, alias, args.Add(from), args.Add(to)))
	}
	if len(bScopes) > 0 {
		s, f, u := args.Add(bScopes), args.Add(bFrom), args.Add(bTo)
		col := alias + "." + t.EventTime.Quoted
		parts = append(parts, fmt.Sprintf("(%s AND (%s IS NULL OR EXISTS (SELECT 1 FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[]) r(s, f, u) WHERE r.s = %s.%s::text AND %s)))",
			inScopes(t, alias, s), col, s, f, u, alias, t.Scope.Quoted, inRange(t, col, "r.f", "r.u")))
	}
	return orAll(parts)
}

// inScopes is true when the row's scope is one of the array parameter p: a
// hashed subplan, looked up in constant time per row.
func inScopes(t *catalog.Table, alias, p string) string {
	// Not coalesce(...): Citus refuses a subquery inside COALESCE in a
	// statement it sends to the workers. The array holds no NULL, so IN
	// is true or false for a scope that is not NULL.
	col := alias + "." + t.Scope.Quoted
	return fmt.Sprintf("(%s IS NOT NULL AND %s::text IN (SELECT unnest(%s::text[])))", col, col, p)
}

// inRange is true when the event time col lies in [from, to), compared on
// the column's own terms (catalog.Column.Instant), which never leaves out a
// row of the range.
func inRange(t *catalog.Table, col, from, to string) string {
	return fmt.Sprintf("%s >= %s AND %s < %s", col, t.EventTime.Instant(from), col, t.EventTime.InstantAbove(to))
}

// inRanges is true when the row's event time lies in one of the ranges
// [from[i], to[i]) of the array parameters, or is NULL. For a timestamp
// column the ranges become one multirange, built once per statement, in
// which a row is found by a binary search; another column type compares
// with each range.
func inRanges(t *catalog.Table, alias, from, to string) string {
	col := alias + "." + t.EventTime.Quoted
	rng := rangeType(t)
	if rng == "" {
		return fmt.Sprintf("(%s IS NULL OR EXISTS (SELECT 1 FROM unnest(%s::timestamptz[], %s::timestamptz[]) r(f, u) WHERE %s))",
			col, from, to, inRange(t, col, "r.f", "r.u"))
	}
	// greatest: a range whose bounds cross in a repeated hour of a local
	// clock covers nothing either way, and a range type refuses it.
	lo := t.EventTime.Instant("r.f")
	// The arrays are not empty, so the multirange is not NULL.
	return fmt.Sprintf("(%s IS NULL OR %s <@ (SELECT range_agg(%s(%s, greatest(%s, %s), '[)')) FROM unnest(%s::timestamptz[], %s::timestamptz[]) r(f, u)))",
		col, col, rng, lo, lo, t.EventTime.InstantAbove("r.u"), from, to)
}

func orAll(ps []string) string {
	if len(ps) == 0 {
		return "false"
	}
	return "(" + strings.Join(ps, " OR ") + ")"
}

// ReplaysBeyondWindow counts, per table, the active replays that were
// started with --force although they reach past what is still remembered.
func ReplaysBeyondWindow(ctx context.Context, db Querier) (map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT table_name, count(*) FILTER (WHERE beyond_window)::int
FROM inboxkeeper.replays WHERE finished_at IS NULL GROUP BY table_name`)
	if err != nil {
		return nil, fmt.Errorf("count replays beyond the window: %w", err)
	}
	out := map[string]int{}
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var table string
		var n int
		err := r.Scan(&table, &n)
		out[table] = n
		return struct{}{}, err
	})
	return out, err
}
