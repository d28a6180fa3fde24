// Package settings keeps the runtime settings in the control schema: the
// tunables an operator changes with `inboxkeeper set`, for every instance,
// without a restart, kept across restarts and audited. It resolves what is
// in force for a table, and says where each value comes from:
//
//	table setting > global setting > the policy table's tuning block >
//	environment variable > default
//
// Values are checked exactly like the environment variables
// (config.Config.With). Daemon internals.
package settings

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
)

// Where a value comes from.
const (
	SourceDefault     = "default"
	SourceEnvironment = "environment"
	SourcePolicy      = "policy tuning"
	SourceGlobal      = "global setting"
	SourceTable       = "table setting"
)

// Global is the table name of a setting for every table.
const Global = ""

// Setting is one stored setting.
type Setting struct {
	Table, Key, Value string
	ChangedAt         time.Time
	ChangedBy, Reason string
}

// Change is one entry of the history.
type Change struct {
	ID                int64
	Table, Key        string
	Old, New          *string // nil: not set / unset
	ChangedAt         time.Time
	ChangedBy, Reason string
}

// Querier reads: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Beginner starts a transaction: *pgxpool.Pool, *pgx.Conn.
type Beginner interface {
	Begin(context.Context) (pgx.Tx, error)
}

// ErrInvalid marks a setting refused before anything was written.
var ErrInvalid = errors.New("invalid setting")

// Load reads every stored setting.
func Load(ctx context.Context, q Querier) ([]Setting, error) {
	rows, err := q.Query(ctx, `SELECT table_name, key, value, changed_at, changed_by, reason FROM inboxkeeper.settings ORDER BY table_name, key`)
	if err != nil {
		return nil, fmt.Errorf("read the settings: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Setting, error) {
		var s Setting
		err := r.Scan(&s.Table, &s.Key, &s.Value, &s.ChangedAt, &s.ChangedBy, &s.Reason)
		return s, err
	})
}

// Version changes whenever a setting does: the history's highest id. An
// instance compares it before each batch.
func Version(ctx context.Context, q Querier) (int64, error) {
	var v int64
	err := q.QueryRow(ctx, versionSQL).Scan(&v)
	return v, err
}

const versionSQL = `SELECT coalesce(max(id), 0) FROM inboxkeeper.settings_history`

// History lists the changes, newest first; limit 0 means all.
func History(ctx context.Context, q Querier, limit int) ([]Change, error) {
	sql := `SELECT id, table_name, key, old_value, new_value, changed_at, changed_by, reason FROM inboxkeeper.settings_history ORDER BY id DESC`
	if limit > 0 {
		sql += fmt.Sprintf(" LIMIT %d", limit)
	}
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("read the settings history: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Change, error) {
		var c Change
		err := r.Scan(&c.ID, &c.Table, &c.Key, &c.Old, &c.New, &c.ChangedAt, &c.ChangedBy, &c.Reason)
		return c, err
	})
}

// Write stores values (key to value; a nil value unsets the key) for table
// (Global for all) in one transaction, with a history entry for each that
// changes, and returns those entries. check runs inside the transaction,
// with every setting as it will be, and refuses the change by returning an
// error: nothing is written then.
func Write(ctx context.Context, db Beginner, table string, values map[string]*string, reason string, check func([]Setting) error) ([]Change, error) {
	if strings.TrimSpace(reason) == "" {
		return nil, fmt.Errorf("%w: a change needs --reason", ErrInvalid)
	}
	keys := make([]string, 0, len(values))
	canonical := map[string]*string{}
	for k, v := range values {
		t, ok := config.TunableByKey(k)
		if !ok {
			return nil, fmt.Errorf("%w: unknown key %q (known: %s)", ErrInvalid, k, strings.Join(Keys(), ", "))
		}
		if table != Global && t.DatabaseWide {
			return nil, fmt.Errorf("%w: %s holds for the whole database (the standbys and the active window serve every table); set it without --table", ErrInvalid, k)
		}
		if v != nil {
			// Stored as the one printer writes it (1h, not 60m): the
			// settings and their history then say the same.
			c, err := config.Config{}.Set(t.Env, *v)
			if err != nil {
				return nil, fmt.Errorf("%w: %s", ErrInvalid, config.InKeys(err.Error()))
			}
			text := c.Get(t.Env)
			v = &text
		}
		canonical[k] = v
		keys = append(keys, k)
	}
	values = canonical
	slices.Sort(keys)
	var changes []Change
	// Durable: a setting that was reported changed stays changed after a
	// crash.
	err := dbconn.Durable(ctx, db, func(tx pgx.Tx) error {
		// One writer at a time: the check sees what the others wrote.
		if _, err := tx.Exec(ctx, "LOCK TABLE inboxkeeper.settings IN SHARE ROW EXCLUSIVE MODE"); err != nil {
			return err
		}
		for _, k := range keys {
			var old *string
			err := tx.QueryRow(ctx, "SELECT value FROM inboxkeeper.settings WHERE table_name = $1 AND key = $2", table, k).Scan(&old)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			nv := values[k]
			if (old == nil && nv == nil) || (old != nil && nv != nil && *old == *nv) {
				continue
			}
			var tag pgconn.CommandTag
			if nv == nil {
				tag, err = tx.Exec(ctx, "DELETE FROM inboxkeeper.settings WHERE table_name = $1 AND key = $2", table, k)
			} else {
				tag, err = tx.Exec(ctx, `INSERT INTO inboxkeeper.settings (table_name, key, value, reason) VALUES ($1, $2, $3, $4)
ON CONFLICT (table_name, key) DO UPDATE SET value = excluded.value, reason = excluded.reason, changed_at = now(), changed_by = current_user`,
					table, k, *nv, reason)
			}
			if err != nil {
				return err
			}
			_ = tag
			c := Change{Table: table, Key: k, Old: old, New: nv, Reason: reason}
			if err := tx.QueryRow(ctx, `INSERT INTO inboxkeeper.settings_history (table_name, key, old_value, new_value, reason)
VALUES ($1, $2, $3, $4, $5) RETURNING id, changed_at, changed_by`, table, k, old, nv, reason).Scan(&c.ID, &c.ChangedAt, &c.ChangedBy); err != nil {
				return err
			}
			changes = append(changes, c)
		}
		all, err := Load(ctx, tx)
		if err != nil {
			return err
		}
		return check(all)
	})
	if err != nil {
		return nil, err
	}
	return changes, nil
}

// Keys are the tunables' keys.
func Keys() []string {
	out := make([]string, len(config.Tunables))
	for i, t := range config.Tunables {
		out[i] = t.Key
	}
	return out
}

// Value is a tunable in force, and where it comes from.
type Value struct {
	Key, Value, Source string
	// Shell: the value is this process's environment's or the default,
	// because no active instance published its own (Env.Instance ""): a
	// daemon's may differ.
	Shell bool
	// Given is what Source gave, when a value of a higher layer moved it
	// to the bound it sets (BoundBy, from BoundBySource): a table's
	// batch_size_max of 123 bounds a batch_size of 500 from the
	// environment. "" when the value is Source's own.
	Given, BoundBy, BoundBySource string
}

// layers ranks the sources: a higher layer's value wins, and bounds what
// lower layers give.
var layers = map[string]int{SourceDefault: 0, SourceEnvironment: 1, SourcePolicy: 2, SourceGlobal: 3, SourceTable: 4}

// Resolve applies, on top of base (the environment and defaults), the
// policy table's tuning block, the global settings and the table's own
// settings, in that order of precedence (the last wins), and checks the
// result as the environment is checked. A value from a higher layer bounds
// what lower layers give (config.BoundBatchSizes): only values of one
// layer that contradict each other are an error. It returns the
// configuration in force for the table and every tunable's value, its
// source and, when another layer's value bounded it, what its source gave.
// table "" (a command's global view) takes no table layers.
func Resolve(base config.Config, tuning map[string]string, stored []Setting, table string) (config.Config, []Value, error) {
	return ResolveIn(Own(base), tuning, stored, table)
}

// ResolveIn is Resolve on top of env: this process's environment (Own) or
// an active instance's as it published it (Published).
func ResolveIn(env Env, tuning map[string]string, stored []Setting, table string) (config.Config, []Value, error) {
	c := env.Config
	vals := make([]Value, len(config.Tunables))
	for i, t := range config.Tunables {
		src := SourceEnvironment
		if !env.Sets(t.Env) {
			// The default as such: the environment's values may have
			// bounded it (config.Load); the bounds are drawn again below,
			// with every layer.
			src = SourceDefault
			c, _ = c.Set(t.Env, config.Default(t.Env))
		}
		vals[i] = Value{Key: t.Key, Value: c.Get(t.Env), Source: src, Shell: env.Instance == ""}
	}
	set := func(key, value, source string) error {
		t, ok := config.TunableByKey(key)
		if !ok {
			// A row written by hand: refused, named, never applied.
			return fmt.Errorf("%w: %s: unknown key %q in inboxkeeper.settings (known: %s)", ErrInvalid, source, key, strings.Join(Keys(), ", "))
		}
		next, err := c.Set(t.Env, value)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, source, config.InKeys(err.Error()))
		}
		c = next
		for i := range vals {
			if vals[i].Key == key {
				vals[i] = Value{Key: key, Value: c.Get(t.Env), Source: source}
			}
		}
		return nil
	}
	var errs []error
	if table != "" {
		for _, k := range Keys() {
			if v, ok := tuning[k]; ok {
				errs = append(errs, set(k, v, SourcePolicy))
			}
		}
	}
	for _, scope := range []struct{ table, source string }{{Global, SourceGlobal}, {table, SourceTable}} {
		if scope.source == SourceTable && table == "" {
			continue
		}
		for _, s := range stored {
			if s.Table == scope.table {
				errs = append(errs, set(s.Key, s.Value, scope.source))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, vals, err
	}
	byEnv := func(env string) *Value {
		for i, t := range config.Tunables {
			if t.Env == env {
				return &vals[i]
			}
		}
		return nil
	}
	for _, b := range c.BoundBatchSizes(func(env string) int { return layers[byEnv(env).Source] }) {
		v, by := byEnv(b.Env), byEnv(b.By)
		v.Value, v.Given, v.BoundBy, v.BoundBySource = c.Get(b.Env), b.Given, by.Key, by.Source
	}
	// The values together, checked as the environment is (BATCH_SIZE between
	// its bounds and the like), in the keys' names.
	if err := c.Validate(); err != nil {
		where := "the global settings"
		if table != "" {
			where = "the settings of " + table
		}
		return c, vals, fmt.Errorf("%w: %s would not hold together: %s", ErrInvalid, where, config.InKeys(err.Error()))
	}
	return c, vals, nil
}
