package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// tuning is what a pass runs with: the configuration in force globally and
// for each table, with the runtime settings and the policy's tuning blocks
// applied (internal/settings), and the settings version it was read at.
type tuning struct {
	version int64
	global  config.Config
	tables  map[string]config.Config
}

// loadTuning reads the runtime settings and resolves them for every table.
// A combination that does not hold together (say, set before a policy
// change) is an error: the caller keeps what it had.
func (a *app) loadTuning(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table) (tuning, error) {
	tn := tuning{tables: map[string]config.Config{}}
	var err error
	if tn.version, err = settings.Version(ctx, pool); err != nil {
		return tn, err
	}
	stored, err := settings.Load(ctx, pool)
	if err != nil {
		return tn, err
	}
	var errs []error
	if tn.global, _, err = settings.Resolve(a.cfg, nil, stored, settings.Global); err != nil {
		errs = append(errs, err)
	}
	for _, t := range tables {
		c, _, err := settings.Resolve(a.cfg, t.Policy.Tuning, stored, t.Name)
		errs = append(errs, err)
		tn.tables[t.Name] = c
	}
	return tn, errors.Join(errs...)
}

// errSettingsChanged stops a pass before its next batch when a runtime
// setting changed: the next pass, started at once, applies it.
var errSettingsChanged = retry.ErrSettingsChanged

// settingsWatch is checked before every batch and DDL statement (with the
// lease): it stops the pass as soon as the settings version moves past the
// one the pass was built with.
type settingsWatch struct {
	pool    *pgxpool.Pool
	version int64
	changed bool
}

func (w *settingsWatch) check() error {
	if w.changed {
		return errSettingsChanged
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := settings.Version(ctx, w.pool)
	if err == nil && v != w.version {
		w.changed = true
		return errSettingsChanged
	}
	return nil // a failed read changes nothing: the batch itself will tell
}

// both runs the lease check (if any), then the settings watch.
func both(lease, watch func() error) func() error {
	return func() error {
		if lease != nil {
			if err := lease(); err != nil {
				return err
			}
		}
		return watch()
	}
}

// stages builds a pass's stages with each table's configuration in force:
// partitions for every partitioned table, then demotion and deletion one
// table at a time, in policy order, each with its own batch settings and,
// when it has one of its own, its own RUN_TIME within the pass's.
func (a *app) stages(pool *pgxpool.Pool, tables []*catalog.Table, tn tuning, dryRun bool, ms *metricSet, th *throttle.Throttler,
	active func() error, progress func(expiry.Progress)) ([]pass.Stage, []*expiry.Deleter) {
	w := wiring{pool: pool, dryRun: dryRun, th: th, active: active}
	var (
		em   *expiry.Metrics
		errs *prometheus.CounterVec
		pmm  *partitions.Metrics
		tm   *tiering.Metrics
	)
	if ms != nil {
		em, errs, pmm, tm = ms.expiry, ms.expiry.Errors, ms.partitions, ms.tiering
	}
	out := []pass.Stage{pass.Partitions(a.partitionManager(w, tables, pmm))}
	var deletes []pass.Stage
	var deleters []*expiry.Deleter
	for _, t := range tables {
		c, ok := tn.tables[t.Name]
		if !ok {
			c = tn.global
		}
		one := []*catalog.Table{t}
		if t.Tiers != nil && !t.Partitioned() {
			out = append(out, limit(pass.Tiering(a.demoter(c, w, one, tm, errs)), c.RunTime, tn.global.RunTime))
		}
		if !t.Partitioned() {
			d := a.deleter(c, w, one, em, progress)
			deleters = append(deleters, d)
			deletes = append(deletes, limit(pass.Expiry(d), c.RunTime, tn.global.RunTime))
		}
	}
	return append(out, deletes...), deleters
}

// limit gives a table with a RUN_TIME of its own (a runtime setting or a
// tuning block) that budget within the pass's.
func limit(s pass.Stage, own, global time.Duration) pass.Stage {
	if own <= 0 || own == global {
		return s
	}
	return pass.Limit(s, own)
}

// describeTuning lists, for status, the values in force that are not the
// defaults, with their source.
func describeTuning(vals []settings.Value) string {
	var out string
	for _, v := range vals {
		if v.Source == settings.SourceDefault {
			continue
		}
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%s=%s (%s)", v.Key, v.Value, v.Source)
	}
	return out
}

// tuningValues resolves every tunable, globally and per table, for status.
func (a *app) tuningValues(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table) (map[string][]settings.Value, error) {
	stored, err := settings.Load(ctx, pool)
	if err != nil {
		return nil, err
	}
	out := map[string][]settings.Value{}
	_, out[settings.Global], _ = settings.Resolve(a.cfg, nil, stored, settings.Global)
	for _, t := range tables {
		_, out[t.Name], _ = settings.Resolve(a.cfg, t.Policy.Tuning, stored, t.Name)
	}
	return out, nil
}

// applyLimits puts the database-wide keys of the settings in force
// (max_replica_lag, max_replica_lag_bytes, active_hours, active_tz) into a
// running throttle.
func applyLimits(th *throttle.Throttler, c config.Config) {
	if th != nil {
		th.SetLimits(c.Limits())
	}
}
