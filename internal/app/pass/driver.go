package pass

import (
	"context"
	"errors"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/outage"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Driver runs passes over the tables in force: the one pass of `once` and
// the demo (Once), and every pass of `run` (Daemon). It builds the stages
// with the runtime settings in force, and builds them again when those
// change (a settings watch, asked with the lease before every DDL
// statement and read in every batch's transaction, stops a pass as soon
// as they do); the deleters and
// demoters it built keep what they learnt of each table (the batch size)
// from pass to pass while the settings stay.
type Driver struct {
	// Wiring builds the services; its Active, BatchActive and Watch are
	// set from Lease and the settings watch.
	Wiring
	// Env is the environment's configuration, which the runtime settings
	// apply to.
	Env config.Config
	// Lease, when set, is asked before every batch and DDL statement: an
	// error (the lease was lost) stops the table's pass.
	Lease func() error
	// AfterStage, when set, is told each stage's results as soon as the
	// stage ends (once prints them as the pass goes).
	AfterStage func(stage string, results []TableResult)

	tables   []*catalog.Table
	watch    *settings.Watch
	runner   Runner
	deleters []*expiry.Deleter
	tiers    *tiering.Collector // made by measureSlow
	space    *compact.Collector
	retained *expiry.Retained
	// slowAtScrape: what changes over minutes (the tiers, what each table
	// remembers) is measured when /metrics is scraped (run), not after
	// every pass (once, which exports once, after its pass).
	slowAtScrape bool
	// outages, when set (run), takes a measurement that failed because the
	// database does not answer into its outage, said once.
	outages *outage.Log
}

// warn logs a failed measurement, unless it is the database not answering
// and the daemon says that once (outages).
func (d *Driver) warn(msg string, err error) {
	if !d.outages.DatabaseFailed(err) {
		d.Log.Warn(msg, "error", err)
	}
}

// Use puts tables in force, a policy that passed its checks: the next pass
// builds its stages for them, and the metrics say the policy in force is
// the file's, loaded now (inboxkeeper_config_last_reload_successful 1, in
// run as in once's export).
func (d *Driver) Use(tables []*catalog.Table) {
	d.tables, d.watch = tables, nil
	if d.Metrics != nil {
		d.Metrics.PolicyLoaded()
	}
}

// record exports what a pass measured besides its counters, the same for
// run and once: each table's facts (rows protected, retained expiries,
// bytes per key) after the pass; the tiers and what each table remembers
// (the installed rules' horizons, the retained ranges, the replays beyond
// the window) after once's pass, and at run's scrapes (measureSlow). A dry
// run exports none of them: it measured nothing.
func (d *Driver) record(ctx context.Context, res Result) {
	if d.Metrics == nil || d.DryRun {
		return
	}
	results := d.Metrics.results()
	for _, r := range Of[expiry.TableResult](res.Tables) {
		results.Record(r)
	}
	if !d.slowAtScrape {
		d.measureSlow(ctx, d.tables)
	}
}

// measureSlow measures the tiers of tables, what each remembers, and the
// space of each heap.
func (d *Driver) measureSlow(ctx context.Context, tables []*catalog.Table) {
	if d.tiers == nil {
		d.tiers = tiering.NewCollector(d.Pool, d.Metrics.Tiering, d.Metrics.Daemon.BytesPerKey, d.Log)
		d.retained = expiry.NewRetained(d.Pool, d.Metrics.retained(), d.Log)
		d.space = compact.NewCollector(d.Pool, d.Metrics.Compact, d.Log)
		d.tiers.Said, d.space.Said = d.outages.DatabaseFailed, d.outages.DatabaseFailed
	}
	_ = d.tiers.Update(ctx, tables)
	_ = d.space.Update(ctx, tables)
	if err := d.retained.Update(ctx, tables); err != nil && ctx.Err() == nil {
		d.warn("inboxkeeper: read the control schema for metrics", err)
	}
}

// Tables are the tables in force.
func (d *Driver) Tables() []*catalog.Table { return d.tables }

// EnsureKeyTables creates the permanent key tables the tables in force
// need: a deletion writes its keys in the same statement, so they must
// exist before anything runs (tiering.ErrKeyTable when the role may not
// create one). A dry run creates none, but checks that it could.
func (d *Driver) EnsureKeyTables(ctx context.Context) error {
	if d.DryRun {
		return tiering.CheckKeyTables(ctx, d.Pool, d.tables)
	}
	return tiering.EnsureKeyTables(ctx, d.Pool, d.tables, d.Log)
}

// Changed reports whether the runtime settings changed during the last
// pass, which stopped there: the next pass, started at once, applies them.
func (d *Driver) Changed() bool { return d.watch != nil && d.watch.Changed() }

// SettingsError is a pass that could not start because the runtime
// settings could not be read, or do not hold together.
type SettingsError struct{ Err error }

func (e SettingsError) Error() string { return e.Err.Error() }
func (e SettingsError) Unwrap() error { return e.Err }

// tune builds the stages for the runtime settings in force, unless they
// are built for that version already. Settings that do not hold together
// are the error: the stages in force stay, and only a later change is
// looked at; without stages yet, the environment's configuration is used.
func (d *Driver) tune(ctx context.Context) error {
	if d.watch != nil && !d.watch.Changed() {
		// One cheap read between passes (the daemon's first of a pass: it
		// tells an outage): the settings are read whole only when their
		// version moved, and the stages built again only when they were
		// built settings.RestartAtMostEvery ago or more; a change before
		// waits for a pass after that (the batch sizes learnt go with the
		// stages).
		if v, err := settings.Version(ctx, d.Pool); err == nil && (v == d.watch.Version() || !d.watch.Settled()) {
			return nil
		}
	}
	tn, err := settings.Read(ctx, d.Pool, d.Env, d.tables)
	if err != nil {
		if d.watch != nil {
			// Wait for the next change rather than stop every pass for this one.
			v := d.watch.Version()
			if tn.Version > 0 {
				v = tn.Version
			}
			d.watch.Rebase(v)
			return err
		}
		tn = settings.Fixed(d.Env)
	}
	if d.watch == nil || d.watch.Version() != tn.Version {
		d.build(tn)
	}
	return err
}

// build builds the stages for tn, with a settings watch of its version.
func (d *Driver) build(tn settings.Tuning) {
	d.watch = settings.NewWatch(d.Pool, tn.Version).Settling(settings.RestartAtMostEvery)
	if d.Throttle != nil {
		d.Throttle.SetLimits(tn.Global.Limits())
	}
	w := d.Wiring
	w.Active, w.BatchActive, w.Watch = both(d.Lease, d.watch.Check), d.Lease, d.watch
	var stages []Stage
	stages, d.deleters = w.Stages(d.tables, tn)
	d.runner = Runner{Stages: stages, RunTime: tn.Global.RunTime, AfterStage: d.AfterStage}
}

// both asks the lease (if any), then the settings watch.
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

// Once runs one pass with each table's configuration in force; a setting
// changed during it stops it before its next batch, and the pass starts
// again with it. It returns how many table steps failed, out of how many.
// Settings that cannot be read or do not hold together end it, a
// SettingsError, before anything runs.
func (d *Driver) Once(ctx context.Context) (failed, total int, err error) {
	if d.Metrics != nil && d.Lease != nil {
		d.Metrics.Daemon.Active.Set(1) // this instance holds the lease
	}
	// A dry run creates nothing, but refuses what the real run would.
	if err := d.EnsureKeyTables(ctx); err != nil {
		return 0, 0, err
	}
	for {
		tn, err := settings.Read(ctx, d.Pool, d.Env, d.tables)
		if err != nil {
			return failed, total, SettingsError{err}
		}
		d.build(tn)
		res, err := d.runner.Run(ctx)
		if err == nil {
			d.record(ctx, res)
		}
		if d.Metrics != nil {
			d.Metrics.PassEnded(res.Outcome())
		}
		f, _, n := res.Counts()
		failed, total = failed+f, total+n
		if err != nil || !d.watch.Changed() {
			return failed, total, err
		}
		d.Log.Info("inboxkeeper: the runtime settings changed; the pass starts again with them")
	}
}

// IsSettingsError reports a pass that the runtime settings kept from
// starting.
func IsSettingsError(err error) bool {
	var se SettingsError
	return errors.As(err, &se)
}
