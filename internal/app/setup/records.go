package setup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/retention"
)

// Fence is how hold and replay writers wait for the batches in flight.
func (c *Command) Fence() holds.FenceOptions {
	return holds.FenceOptions{Timeout: c.Cfg.FenceTimeout, IdleTimeout: c.Cfg.IdleTimeout}
}

// TableFor finds the policy table a hold, a replay or a compaction names
// and resolves it, so that a hold on a table the daemon does not manage, or
// a scope on a table without a scope column, is refused before anything is
// written.
func (c *Command) TableFor(ctx context.Context, name string) (*pgxpool.Pool, *catalog.Table, error) {
	if name == "" {
		return nil, nil, pass.Usagef("--table is required")
	}
	if _, err := sqlident.ParseQualifiedName(name); err != nil {
		return nil, nil, pass.Usagef("--table: %v", err)
	}
	p, err := c.LoadPolicy()
	if err != nil {
		return nil, nil, err
	}
	pt, err := p.Find(name)
	if err != nil {
		return nil, nil, pass.Usagef("--table %v", err)
	}
	pool, err := c.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := migrations.Check(ctx, pool); err != nil {
		return nil, nil, err
	}
	t, err := catalog.Resolve(ctx, pool, *pt)
	if err != nil {
		return nil, nil, err
	}
	return pool, t, nil
}

// HoldErr is a hold or replay refused for what it asks (holds.ErrInvalid,
// holds.ErrBeyondWindow) as a UsageError.
func HoldErr(err error) error {
	if errors.Is(err, holds.ErrInvalid) || errors.Is(err, holds.ErrBeyondWindow) {
		return pass.UsageError{Msg: err.Error()}
	}
	return err
}

// RetentionRecord is what the policy's retention record of scope on table
// promises for event-time replays, when it has one: what replay start
// judges a range by while the record's rule is not installed.
func (c *Command) RetentionRecord(table, scope string) (*holds.Record, error) {
	p, err := c.LoadPolicy()
	if err != nil || p.Retention == nil {
		return nil, err
	}
	plans, err := retention.Load(p)
	if err != nil {
		return nil, pass.ConfigError{Err: err}
	}
	for _, pl := range plans {
		if r := pl.Rule; r.Table == table && r.Scope == scope && r.Replay > 0 {
			return &holds.Record{Replay: r.Replay, Margin: r.Margin, Source: fmt.Sprintf("the retention record of scope %q in %s", scope, p.Source)}, nil
		}
	}
	return nil, nil
}

// LoadPlans plans FILE (files: none or one), or the policy file's
// retention section. The policy file is read with FILE too, when it exists, so that
// the tables a record names are checked against it.
func (c *Command) LoadPlans(files []string) ([]retention.Plan, *policy.Policy, error) {
	if len(files) == 0 {
		p, err := c.LoadPolicy()
		if err != nil {
			return nil, nil, err
		}
		if p.Retention == nil {
			return nil, nil, pass.ConfigError{Err: fmt.Errorf("%s: no retention section; add one, or give a file: inboxkeeper plan FILE", p.Source)}
		}
		plans, err := retention.Load(p)
		if err != nil {
			return nil, nil, pass.ConfigError{Err: err}
		}
		return plans, p, nil
	}
	var p *policy.Policy
	if _, err := os.Stat(c.Cfg.PolicyFile); err == nil {
		if p, err = c.LoadPolicy(); err != nil {
			return nil, nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, pass.ConfigError{Err: err}
	}
	plans, err := retention.LoadFile(files[0], p)
	if err != nil {
		return nil, nil, pass.ConfigError{Err: err}
	}
	return plans, p, nil
}

// Deployment is what `plan --check` and `plan --apply` (mode) compare the
// records of plans with, or act on: every table the records name, resolved
// against the policy file p. A record that names a table the database does
// not match is a configuration error, as for every command. Without a
// table in a record, its pool is connected only for apply (a nil policy:
// no table).
func (c *Command) Deployment(ctx context.Context, plans []retention.Plan, p *policy.Policy, mode string) (retention.Deployment, error) {
	d := retention.Deployment{Tables: map[string]*catalog.Table{}, Tx: c.TxSettings(), CoveredUntil: partitions.CoveredUntil,
		FallingDueRate: expiry.FallingDueRate, VacuumDeadRatio: c.Cfg.VacuumDeadRatio}
	if mode == "--apply" {
		var err error
		if d.Pool, err = c.ControlPool(ctx); err != nil || p == nil {
			return d, err
		}
	}
	for _, pl := range plans {
		name := pl.Rule.Table
		if name == "" || d.Tables[name] != nil {
			continue
		}
		if p == nil {
			return d, pass.ConfigError{Err: fmt.Errorf("plan %s: the record for %q names table %s, but there is no policy file (%s) to find it in", mode, pl.Rule.Scope, name, c.Cfg.PolicyFile)}
		}
		pt := p.Table(name)
		if pt == nil {
			return d, pass.ConfigError{Err: fmt.Errorf("plan %s: the record for %q names table %s, which is not in the policy file %s", mode, pl.Rule.Scope, name, p.Source)}
		}
		if d.Pool == nil {
			var err error
			if d.Pool, err = c.Connect(ctx); err != nil {
				return d, err
			}
		}
		t, err := catalog.Resolve(ctx, d.Pool, *pt)
		if err != nil {
			return d, fmt.Errorf("%s: %w", p.Source, err)
		}
		d.Tables[name] = t
	}
	if d.Pool != nil {
		d.Installed = retention.Installed(d.Pool)
	}
	return d, nil
}
