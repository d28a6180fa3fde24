package settings

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// Tuning is what a pass runs with: the configuration in force globally and
// for each table, with the runtime settings and the policy's tuning blocks
// applied, and the settings version it was read at.
type Tuning struct {
	Version int64
	Global  config.Config
	Tables  map[string]config.Config
}

// For is the configuration in force for table: its own, or the global one.
func (tn Tuning) For(table string) config.Config {
	if c, ok := tn.Tables[table]; ok {
		return c
	}
	return tn.Global
}

// Read reads the runtime settings and resolves them, on top of base (the
// environment), for every table. A combination that does not hold together
// (say, set before a policy change) is an error: the caller keeps what it
// had. The Tuning returned with it has the version read, when it was.
func Read(ctx context.Context, q Querier, base config.Config, tables []*catalog.Table) (Tuning, error) {
	tn := Tuning{Tables: map[string]config.Config{}}
	var err error
	if tn.Version, err = Version(ctx, q); err != nil {
		return tn, err
	}
	stored, err := Load(ctx, q)
	if err != nil {
		return tn, err
	}
	var errs []error
	if tn.Global, _, err = Resolve(base, nil, stored, Global); err != nil {
		errs = append(errs, err)
	}
	for _, t := range tables {
		c, _, err := Resolve(base, t.Policy.Tuning, stored, t.Name)
		errs = append(errs, err)
		tn.Tables[t.Name] = c
	}
	return tn, errors.Join(errs...)
}

// Fixed is the tuning of base alone, at no settings version: what is in
// force before the runtime settings could be read.
func Fixed(base config.Config) Tuning {
	return Tuning{Version: -1, Global: base, Tables: map[string]config.Config{}}
}

// InForce is the global configuration in force: base with the global
// runtime settings applied. Settings that cannot be read leave base (a
// command run before migrate); settings that do not hold together leave
// base too, and are the error.
func InForce(ctx context.Context, q Querier, base config.Config) (config.Config, error) {
	stored, err := Load(ctx, q)
	if err != nil {
		return base, nil
	}
	g, _, err := Resolve(base, nil, stored, Global)
	if err != nil {
		return base, err
	}
	return g, nil
}

// Values resolves every tunable on env, globally and for each of tables,
// for status: the scopes settings shows.
func Values(ctx context.Context, q Querier, env Env, tables []*catalog.Table) ([]Scope, error) {
	stored, err := Load(ctx, q)
	if err != nil {
		return nil, err
	}
	named := []namedTuning{{Global, nil}}
	for _, t := range tables {
		named = append(named, namedTuning{t.Name, t.Policy.Tuning})
	}
	return scopes(env, stored, named), nil
}

// Scope is every tunable in force in one scope, the global one or a
// table's, and why they do not hold together when they do not: what
// `inboxkeeper settings` shows.
type Scope struct {
	Table    string // "global" for the global scope
	Settings []Value
	Error    string
}

// Scopes resolves every tunable on top of env with the stored settings:
// globally, then for each table of p with its tuning block.
func Scopes(env Env, stored []Setting, p *policy.Policy) []Scope {
	named := []namedTuning{{Global, nil}}
	for _, t := range p.Tables {
		named = append(named, namedTuning{t.Name.String(), t.Tuning})
	}
	return scopes(env, stored, named)
}

// namedTuning is a scope's name (Global, or a table's) and its tuning
// block.
type namedTuning struct {
	name   string
	tuning map[string]string
}

func scopes(env Env, stored []Setting, named []namedTuning) []Scope {
	var out []Scope
	for _, n := range named {
		_, vals, err := ResolveIn(env, n.tuning, stored, n.name)
		s := Scope{Table: ScopeName(n.name), Settings: vals}
		if err != nil {
			s.Error = err.Error()
		}
		out = append(out, s)
	}
	return out
}

// ScopeName names a scope for people: the table, or "global".
func ScopeName(table string) string {
	if table == Global {
		return "global"
	}
	return table
}

// HoldTogether is the check of Write that every table of p still has a
// configuration that holds together, globally and with its tuning block,
// on top of base.
func HoldTogether(base config.Config, p *policy.Policy) func([]Setting) error {
	return func(all []Setting) error {
		if _, _, err := Resolve(base, nil, all, ""); err != nil {
			return err
		}
		for _, t := range p.Tables {
			if _, _, err := Resolve(base, t.Tuning, all, t.Name.String()); err != nil {
				return err
			}
		}
		return nil
	}
}

// RestartAtMostEvery is how often, at most, a change of the runtime
// settings stops a pass to start it again with them. Each restart costs a
// pass its start (the count of what is due, the heap's sample, a batch
// rolled back, the batch size learnt): two loops of `inboxkeeper set`, 58
// changes a second, let 47,000 of 400,000 rows go in 3 minutes when every
// change restarted it. A change within this time of the pass's start (or
// its last restart) applies when it has passed, or at the next pass.
const RestartAtMostEvery = 5 * time.Second

// Watch is checked before every batch and DDL statement (with the lease):
// it stops the pass once the settings version moves past the one the pass
// was built with, and it has settled (Settling).
type Watch struct {
	q       Querier
	version atomic.Int64
	changed atomic.Bool
	// settled is when a change may stop the pass (Settling). Before, the
	// version is not even read.
	settled time.Time
}

// NewWatch watches for a version other than version, from now on.
func NewWatch(q Querier, version int64) *Watch {
	w := &Watch{q: q}
	w.version.Store(version)
	return w
}

// Settling makes w stop no pass for d from now (RestartAtMostEvery for a
// pass just built or restarted), and returns it. Call it before w is used.
func (w *Watch) Settling(d time.Duration) *Watch {
	w.settled = time.Now().Add(d)
	return w
}

// Settled reports whether a change may stop the pass now (Settling).
func (w *Watch) Settled() bool { return !time.Now().Before(w.settled) }

// Rebase watches for a version other than version from now on: settings
// that could not be applied are not a change to stop every pass for.
func (w *Watch) Rebase(version int64) {
	w.version.Store(version)
	w.changed.Store(false)
}

// Check returns retry.ErrSettingsChanged once the version moved (and the
// watch settled). A failed read changes nothing: the batch itself will
// tell.
func (w *Watch) Check() error {
	if w.changed.Load() {
		return retry.ErrSettingsChanged
	}
	if !w.Settled() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := Version(ctx, w.q)
	if err == nil && v != w.version.Load() {
		w.changed.Store(true)
		return retry.ErrSettingsChanged
	}
	return nil
}

// QueueCheck queues the version's read on b, for a batch transaction that
// reads it in the round trip that opens it (service.TxWatch): *stop is set
// to retry.ErrSettingsChanged once the version moved. A failed read changes
// nothing here: it fails the batch, as a failed statement of its
// transaction does. Before the watch settled nothing is queued.
func (w *Watch) QueueCheck(b *pgx.Batch, stop *error) {
	if w.changed.Load() {
		*stop = retry.ErrSettingsChanged
		return
	}
	if !w.Settled() {
		return
	}
	b.Queue(versionSQL).QueryRow(func(row pgx.Row) error {
		var v int64
		if err := row.Scan(&v); err != nil {
			return err
		}
		if v != w.version.Load() {
			w.changed.Store(true)
			*stop = retry.ErrSettingsChanged
		}
		return nil
	})
}

// Changed reports whether a check saw the version move.
func (w *Watch) Changed() bool { return w.changed.Load() }

// Version is the version the watch was built with.
func (w *Watch) Version() int64 { return w.version.Load() }
