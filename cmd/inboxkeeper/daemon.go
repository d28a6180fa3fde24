package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/robfig/cron/v3"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// daemon is `inboxkeeper run`: passes on a schedule that never overlap, one
// active instance per database, metrics on a listener, nothing done against
// a standby, and a clean stop on SIGTERM.
func (a *app) daemon(ctx context.Context, args []string) error {
	fs := newFlags("run", a.stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("run: unexpected argument %q", fs.Arg(0))
	}
	var sched cron.Schedule
	if a.cfg.Schedule != "" {
		s, err := cron.ParseStandard(a.cfg.Schedule)
		if err != nil {
			return configError{fmt.Errorf("INBOXKEEPER_SCHEDULE: %v", err)}
		}
		sched = s
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := expiry.NewMetrics(reg)
	tmetrics := tiering.NewMetrics(reg)
	pmetrics := partitions.NewMetrics(reg)
	pmetrics.Errors, pmetrics.CleanupLag, pmetrics.LastSuccess = metrics.Errors, metrics.CleanupLag, metrics.LastSuccess
	dm := daemonmetrics.New(reg, buildVersion())
	if a.cfg.MetricsAddr != "" {
		stopServer, err := serveMetrics(a, reg)
		if err != nil {
			return err
		}
		defer stopServer()
	}

	pool, tables, err := a.prepareWithRetry(ctx, dm.PolicyMismatch)
	if err != nil || ctx.Err() != nil {
		return err
	}
	th, err := a.startThrottle(ctx, pool, reg)
	if err != nil {
		return err
	}
	defer th.Stop()

	ls := lease.New(pool, a.cfg.LeaseTTL, a.log)
	leaseCtx, stopLease := context.WithCancel(ctx)
	leaseDone := make(chan struct{})
	go func() { defer close(leaseDone); ls.Keep(leaseCtx) }()
	defer func() {
		stopLease()
		<-leaseDone
		// Hand over at once instead of making the next instance wait a ttl.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ls.Release(rctx)
	}()

	d := a.deleter(pool, tables, false, th, metrics, a.progressPrinter())
	d.SetActive(ls.Check)
	pm := a.partitionManager(pool, tables, false, th, pmetrics)
	pm.SetActive(ls.Check)
	a.log.Info("inboxkeeper: running", "tables", len(tables), "interval", a.cfg.Interval, "schedule", a.cfg.Schedule,
		"database", config.RedactURL(a.cfg.DatabaseURL), "instance", ls.Name())
	p := &passer{a: a, pool: pool, d: d, pm: pm, ls: ls, dm: dm, m: metrics, pmm: pmetrics,
		tables: map[string]*catalog.Table{}, scopeIdx: map[string]*expiry.ScopeIndexes{}}
	for _, t := range tables {
		p.tables[t.Name] = t
	}
	p.dem, p.tm = a.demoter(pool, tables, false, th, tmetrics, metrics.Errors), tmetrics
	p.dem.SetActive(ls.Check)
	for {
		start := time.Now()
		if err := p.run(ctx); err != nil {
			a.log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", true)
			return nil
		}
		next := start.Add(a.cfg.Interval)
		if sched != nil {
			next = sched.Next(time.Now())
		}
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			a.log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", false)
			return nil
		case <-timer.C:
		}
	}
}

// passer runs the daemon's passes and keeps what it must remember between
// them, so that state changes are logged once, not every pass.
type passer struct {
	a         *app
	pool      *pgxpool.Pool
	d         *expiry.Deleter
	pm        *partitions.Manager
	pmm       *partitions.Metrics
	ls        *lease.Lease
	dm        *daemonmetrics.Metrics
	m         *expiry.Metrics
	dem       *tiering.Demoter // demotion through the tiers (tiers.go)
	tm        *tiering.Metrics
	lastState string

	// Per-scope ranges are measured only where an index makes them cheap;
	// which indexes exist is looked up once.
	tables    map[string]*catalog.Table
	scopeIdx  map[string]*expiry.ScopeIndexes
	seenIdx   map[string]bool // table -> an index leads with first_seen
	seenKnown bool
}

func (p *passer) say(state string, args ...any) {
	if state != p.lastState {
		p.a.log.Info("inboxkeeper: "+state, args...)
		p.lastState = state
	}
}

// run does one pass if this instance may; it returns an error only when
// ctx ended the pass.
func (p *passer) run(ctx context.Context) error {
	start := time.Now()
	outcome := daemonmetrics.PassSkipped
	defer func() {
		p.dm.Passes.WithLabelValues(outcome).Inc()
		p.dm.LastPass.Set(float64(time.Now().Unix()))
	}()
	standby, err := inRecovery(ctx, p.pool)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		outcome = daemonmetrics.PassFailed
		p.dm.Active.Set(0)
		p.say("database unreachable; retrying next pass", "error", err)
		return nil
	}
	if standby {
		p.dm.InRecovery.Set(1)
		p.inactive()
		p.say("the database is a standby (in recovery): doing nothing until it is promoted")
		return nil
	}
	p.dm.InRecovery.Set(0)
	if !p.ls.Held() {
		// Try now rather than wait for the keeper's next tick: a promoted
		// standby or a restarted database should not wait a ttl.
		if held, h, _ := p.ls.TryAcquire(ctx); !held {
			p.inactive()
			p.say("another instance is active; waiting", "holder", h.Name)
			return nil
		}
	}
	p.dm.Active.Set(1)
	p.say("active")
	p.dm.PassesInFlight.Set(1)
	defer p.dm.PassesInFlight.Set(0)
	// One RUN_TIME for the whole pass. Partitions first: a missing month
	// makes inserts fail, an expired row only waits.
	deadline := batchloop.Deadline(p.a.cfg.RunTime)
	presults, err := p.pm.RunPass(ctx)
	if err != nil {
		return err
	}
	// Demotion before deletion: a row due for both loses its payload
	// first, then goes with its permanent key.
	tresults, err := p.demote(ctx, deadline)
	if err != nil {
		return err
	}
	results, err := p.d.RunPassUntil(ctx, deadline)
	if err != nil {
		return err
	}
	failed, early := 0, 0
	count := func(err error, stopped string) {
		switch {
		case err != nil:
			failed++
		case stopped != "":
			early++
		}
	}
	for _, r := range presults {
		count(r.Err, r.StoppedEarly)
	}
	for _, r := range results {
		count(r.Err, r.StoppedEarly)
		p.record(r)
	}
	for _, r := range tresults {
		count(r.Err, r.StoppedEarly)
	}
	p.measureTiers(ctx)
	total := len(results) + len(presults) + len(tresults)
	switch {
	case failed == total && failed > 0:
		outcome = daemonmetrics.PassFailed
	case failed > 0 || early > 0:
		outcome = daemonmetrics.PassPartial
	default:
		outcome = daemonmetrics.PassOK
	}
	if err := p.controlStats(ctx); err != nil && ctx.Err() == nil {
		p.a.log.Warn("inboxkeeper: read the control schema for metrics", "error", err)
	}
	p.a.log.Info("inboxkeeper: pass done", "outcome", outcome, "tables", total, "failed", failed,
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// inactive clears what this instance measured while it was the active one:
// stale per-table gauges from a waiting instance would contradict the
// active one's. Counters and last-success timestamps keep their history.
func (p *passer) inactive() {
	p.dm.Active.Set(0)
	for _, g := range []*prometheus.GaugeVec{p.dm.RowsProtected, p.dm.OldestExpiry, p.dm.NewestExpiry, p.dm.BytesPerKey,
		p.dm.ReplayHorizon, p.dm.PostReceipt, p.dm.Margin, p.dm.ReplaysBeyond, p.m.CleanupLag, p.m.BatchSize,
		p.pmm.Coverage, p.pmm.Blocked, p.pmm.Count, p.dm.ScopeExpiry, p.dm.ScopeFirstSeen, p.dm.FirstSeen} {
		g.Reset()
	}
	if p.tm != nil {
		p.tm.TierRows.Reset()
	}
}

// record exports what a pass measured about one table.
func (p *passer) record(r expiry.TableResult) {
	if r.Err != nil {
		return
	}
	p.dm.RowsProtected.WithLabelValues(r.Table, "hold").Set(float64(r.ProtectedByHolds))
	p.dm.RowsProtected.WithLabelValues(r.Table, "replay").Set(float64(r.ProtectedByReplays))
	if r.Oldest != nil {
		p.dm.OldestExpiry.WithLabelValues(r.Table).Set(float64(r.Oldest.Unix()))
		p.dm.NewestExpiry.WithLabelValues(r.Table).Set(float64(r.Newest.Unix()))
	} else {
		p.dm.OldestExpiry.DeleteLabelValues(r.Table)
		p.dm.NewestExpiry.DeleteLabelValues(r.Table)
	}
	if r.BytesPerKey > 0 {
		p.dm.BytesPerKey.WithLabelValues(r.Table, "all").Set(r.BytesPerKey)
	} else {
		p.dm.BytesPerKey.DeleteLabelValues(r.Table, "all") // unknown before the first ANALYZE
	}
	p.countPermanent(r)
}

// firstSeenStats exports, per table whose first_seen column leads an
// index, the first receipt of the oldest and newest identity retained.
func (p *passer) firstSeenStats(ctx context.Context) error {
	if !p.seenKnown {
		p.seenIdx = map[string]bool{}
		for name, t := range p.tables {
			ok, err := expiry.FirstSeenIndexed(ctx, p.pool, t)
			if err != nil {
				return err
			}
			p.seenIdx[name] = ok
		}
		p.seenKnown = true
	}
	p.dm.FirstSeen.Reset()
	for name, ok := range p.seenIdx {
		if !ok {
			continue
		}
		oldest, newest, err := expiry.FirstSeenRange(ctx, p.pool, p.tables[name])
		if err != nil {
			return err
		}
		if oldest != nil {
			p.dm.FirstSeen.WithLabelValues(name, "oldest").Set(float64(oldest.Unix()))
			p.dm.FirstSeen.WithLabelValues(name, "newest").Set(float64(newest.Unix()))
		}
	}
	return nil
}

// scopeStats exports the retained range of one scope that has a retention
// rule: bounded label values, and four index probes per scope.
func (p *passer) scopeStats(ctx context.Context, table, scope string) error {
	t := p.tables[table]
	if t == nil || t.Scope == nil {
		return nil
	}
	si := p.scopeIdx[table]
	if si == nil {
		found, err := expiry.FindScopeIndexes(ctx, p.pool, t)
		if err != nil {
			return err
		}
		si = &found
		p.scopeIdx[table] = si
		if !si.Expiry || (t.FirstSeen != nil && !si.FirstSeen) {
			p.a.log.Info("inboxkeeper: per-scope retained ranges need an index leading with the scope column: without it they would scan the scope every pass",
				"table", table, "expiry_indexed", si.Expiry, "first_seen_indexed", si.FirstSeen)
		}
	}
	r, err := expiry.ScopeRanges(ctx, p.pool, t, *si, scope)
	if err != nil {
		return err
	}
	set := func(g *prometheus.GaugeVec, end string, v *time.Time) {
		if v != nil {
			g.WithLabelValues(table, scope, end).Set(float64(v.Unix()))
		}
	}
	set(p.dm.ScopeExpiry, "oldest", r.OldestExpiry)
	set(p.dm.ScopeExpiry, "newest", r.NewestExpiry)
	set(p.dm.ScopeFirstSeen, "oldest", r.OldestFirstSeen)
	set(p.dm.ScopeFirstSeen, "newest", r.NewestFirstSeen)
	return nil
}

// controlStats exports the installed retention rules (the configured replay
// and redrive horizons) and the replays forced past the window.
func (p *passer) controlStats(ctx context.Context) error {
	rows, err := p.pool.Query(ctx, `SELECT schema_name, table_name, scope,
       extract(epoch FROM post_receipt)::float8, extract(epoch FROM replay)::float8, extract(epoch FROM margin)::float8
FROM inboxkeeper.retention_rules`)
	if err != nil {
		return err
	}
	defer rows.Close()
	p.dm.ReplayHorizon.Reset()
	p.dm.PostReceipt.Reset()
	p.dm.Margin.Reset()
	type scoped struct{ table, scope string }
	var scopes []scoped
	for rows.Next() {
		var schema, table, scope string
		var post, replay *float64
		var margin float64
		if err := rows.Scan(&schema, &table, &scope, &post, &replay, &margin); err != nil {
			return err
		}
		name := policy.QualifiedName{Schema: schema, Name: table}.String()
		if post != nil {
			p.dm.PostReceipt.WithLabelValues(name, scope).Set(*post)
		}
		if replay != nil {
			p.dm.ReplayHorizon.WithLabelValues(name, scope).Set(*replay)
		}
		p.dm.Margin.WithLabelValues(name, scope).Set(margin)
		scopes = append(scopes, scoped{name, scope})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	if err := p.firstSeenStats(ctx); err != nil {
		return err
	}
	p.dm.ScopeExpiry.Reset()
	p.dm.ScopeFirstSeen.Reset()
	for _, s := range scopes {
		if err := p.scopeStats(ctx, s.table, s.scope); err != nil {
			if ctx.Err() != nil {
				return err
			}
			p.a.log.Warn("inboxkeeper: per-scope retained range", "table", s.table, "scope", s.scope, "error", err)
		}
	}
	rows, err = p.pool.Query(ctx, `SELECT table_name, count(*) FILTER (WHERE beyond_window)
FROM inboxkeeper.replays WHERE finished_at IS NULL GROUP BY table_name`)
	if err != nil {
		return err
	}
	p.dm.ReplaysBeyond.Reset()
	for rows.Next() {
		var table string
		var n float64
		if err := rows.Scan(&table, &n); err != nil {
			return err
		}
		p.dm.ReplaysBeyond.WithLabelValues(table).Set(n)
	}
	return rows.Err()
}

// prepareWithRetry is prepare for a daemon: a database that is not up yet,
// a control schema a migrate job has not created yet, or tables the
// application's migration has not created yet, are waited for with backoff
// instead of crash-looping (a crash-looping native sidecar would take its
// database pod out of service). The policy file is read again on every try,
// so a corrected ConfigMap is picked up. A bad environment or a policy file
// that does not parse still ends it (exit 2).
func (a *app) prepareWithRetry(ctx context.Context, mismatch prometheus.Gauge) (*pgxpool.Pool, []*catalog.Table, error) {
	wait := time.Second
	for {
		pool, tables, err := a.prepare(ctx)
		if err == nil {
			// A deletion writes its permanent keys in the same statement:
			// the key tables must exist before anything runs.
			if err = a.ensureKeyTables(ctx, pool, tables); err == nil {
				mismatch.Set(0)
				return pool, tables, nil
			}
		}
		var ce configError
		var ue usageError
		switch {
		case errors.Is(err, tiering.ErrKeyTable):
			mismatch.Set(1)
			a.log.Error("inboxkeeper: waiting for a permanent key table; nothing is touched until it exists", "error", err, "retry_in", wait)
		case errors.As(err, &ce) || errors.As(err, &ue):
			return nil, nil, err
		case errors.Is(err, catalog.ErrInvalid):
			mismatch.Set(1)
			a.log.Error("inboxkeeper: the policy does not match the database; nothing is touched until it does", "error", err, "retry_in", wait)
		case errors.Is(err, migrations.ErrNotMigrated):
			a.log.Warn("inboxkeeper: waiting for the control schema", "error", err, "retry_in", wait)
		default:
			a.log.Warn("inboxkeeper: waiting for the database", "error", err, "retry_in", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, nil
		case <-t.C:
		}
		wait = min(wait*2, 30*time.Second)
	}
}

// waitForLease makes `once` the active instance, waiting (and saying so)
// while another instance holds the lease.
func (a *app) waitForLease(ctx context.Context, pool *pgxpool.Pool) (*lease.Lease, func(), error) {
	ls := lease.New(pool, a.cfg.LeaseTTL, a.log)
	tick := time.NewTicker(a.cfg.LeaseTTL / 3)
	defer tick.Stop()
	// RUN_TIME bounds the wait too: a cron job must end within its slot.
	var giveUp <-chan time.Time
	if a.cfg.RunTime > 0 {
		t := time.NewTimer(a.cfg.RunTime)
		defer t.Stop()
		giveUp = t.C
	}
	for {
		held, h, err := ls.TryAcquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		if held {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-giveUp:
			return nil, nil, fmt.Errorf("another instance (%s) held the lease for the whole INBOXKEEPER_RUN_TIME (%s); nothing deleted", h.Name, a.cfg.RunTime)
		case <-tick.C:
		}
	}
	keepCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ls.Keep(keepCtx) }()
	return ls, func() {
		stop()
		<-done
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ls.Release(rctx)
	}, nil
}

func inRecovery(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var standby bool
	err := pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby)
	return standby, err
}
