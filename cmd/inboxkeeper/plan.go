package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/sqlident"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/retention"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// plan prints the retention record of every consumer scope or, with
// --check, compares the records with what is deployed.
func (a *app) plan(ctx context.Context, args []string) error {
	fl := a.newFlags("plan")
	asJSON := fl.Bool("json", false, "print the records as a JSON array")
	check := fl.Bool("check", false, "compare the records with the deployed tables; exit 1 when a promise is not kept")
	redisURL := fl.String("redis-url", "", "with --check: also judge this Redis (redis://[user:password@]host[:port]) as a volatile tier")
	apply := fl.Bool("apply", false, "install each record's rule in the control schema, for the claim path (inboxkeeper.claim)")
	files, err := a.parseInterleaved(fl, args) // flags before or after FILE
	if err != nil {
		return err
	}
	switch {
	case len(files) > 1:
		return usagef("plan: unexpected argument %q (give at most one FILE)", files[1])
	case *redisURL != "" && !*check:
		return usagef("plan: --redis-url needs --check")
	case *asJSON && *check:
		return usagef("plan: --json and --check cannot be combined")
	case *apply && (*check || *asJSON):
		return usagef("plan: --apply cannot be combined with --check or --json")
	}
	plans, p, err := a.loadPlans(files)
	if err != nil {
		return err
	}
	if *check {
		return a.checkPlans(ctx, plans, p, *redisURL)
	}
	if *apply {
		return a.applyPlans(ctx, plans, p)
	}
	if *asJSON {
		out, err := json.MarshalIndent(plans, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s\n", out)
		return nil
	}
	for i, pl := range plans {
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		fmt.Fprint(a.stdout, pl.Markdown())
	}
	return nil
}

// loadPlans plans FILE, or the policy file's retention section. The policy
// file is read with FILE too, when it exists, so that the tables a record
// names are checked against it.
func (a *app) loadPlans(files []string) ([]retention.Plan, *policy.Policy, error) {
	if len(files) == 0 {
		p, err := a.loadPolicy()
		if err != nil {
			return nil, nil, err
		}
		if p.Retention == nil {
			return nil, nil, configError{fmt.Errorf("%s: no retention section; add one, or give a file: inboxkeeper plan FILE", p.Source)}
		}
		plans, err := retention.Load(p)
		if err != nil {
			return nil, nil, configError{err}
		}
		return plans, p, nil
	}
	var p *policy.Policy
	if _, err := os.Stat(a.cfg.PolicyFile); err == nil {
		if p, err = a.loadPolicy(); err != nil {
			return nil, nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, configError{err}
	}
	plans, err := retention.LoadFile(files[0], p)
	if err != nil {
		return nil, nil, configError{err}
	}
	return plans, p, nil
}

func (a *app) checkPlans(ctx context.Context, plans []retention.Plan, p *policy.Policy, redisURL string) error {
	tables, pool, err := a.recordTables(ctx, plans, p, "--check")
	if err != nil {
		return err
	}
	failed, total := retention.Check(ctx, plans, retention.Deployment{Pool: pool, Tables: tables, Tx: a.txSettings(),
		CoveredUntil: partitions.CoveredUntil, FallingDueRate: expiry.FallingDueRate, VacuumDeadRatio: a.cfg.VacuumDeadRatio, RedisURL: redisURL,
		Installed: func(ctx context.Context, table, scope string) (*retention.Rule, error) {
			qn, err := sqlident.ParseQualifiedName(table)
			if err != nil {
				return nil, err
			}
			r, err := inbox.LoadRule(ctx, pool, qn.Schema, qn.Name, scope)
			if r == nil || err != nil {
				return nil, err
			}
			installed := retention.FromClaimRule(*r)
			return &installed, nil
		}},
		func(v retention.Verdict) { fmt.Fprintln(a.stdout, v) })
	if failed > 0 {
		return fmt.Errorf("plan --check: %d of %d checks failed: the deployment does not keep the promise of the retention record", failed, total)
	}
	return nil
}

// recordTables resolves every table the records name against the policy
// file: a record that names a table the database does not match is a
// configuration error, as for every command. The pool is nil when no
// record names a table.
func (a *app) recordTables(ctx context.Context, plans []retention.Plan, p *policy.Policy, mode string) (map[string]*catalog.Table, *pgxpool.Pool, error) {
	tables := map[string]*catalog.Table{}
	var pool *pgxpool.Pool
	for _, pl := range plans {
		name := pl.Rule.Table
		if name == "" || tables[name] != nil {
			continue
		}
		if p == nil {
			return nil, nil, configError{fmt.Errorf("plan %s: the record for %q names table %s, but there is no policy file (%s) to find it in", mode, pl.Rule.Scope, name, a.cfg.PolicyFile)}
		}
		pt := p.Table(name)
		if pt == nil {
			return nil, nil, configError{fmt.Errorf("plan %s: the record for %q names table %s, which is not in the policy file %s", mode, pl.Rule.Scope, name, p.Source)}
		}
		if pool == nil {
			var err error
			if pool, err = a.connect(ctx); err != nil {
				return nil, nil, err
			}
		}
		t, err := catalog.Resolve(ctx, pool, *pt)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.Source, err)
		}
		tables[name] = t
	}
	return tables, pool, nil
}

// applyPlans installs every record's rule, in one transaction, for the claim
// path. A record without a table has nothing to install it on.
func (a *app) applyPlans(ctx context.Context, plans []retention.Plan, p *policy.Policy) error {
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	var tables map[string]*catalog.Table
	if p != nil {
		if tables, _, err = a.recordTables(ctx, plans, p, "--apply"); err != nil {
			return err
		}
	}
	var lines []string
	// Read committed, whatever the server's default: each rule compiles the
	// claim function from the rules as committed (inbox.InstallRule). Durable:
	// a rule decides the expiry every claim writes from now on.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := dbconn.MakeDurable(ctx, tx); err != nil {
			return err
		}
		if _, err := a.txSettings().Apply(ctx, tx); err != nil {
			return err
		}
		for _, pl := range plans {
			if pl.Rule.Table == "" {
				lines = append(lines, fmt.Sprintf("SKIP scope %q: the record names no table", pl.Rule.Scope))
				continue
			}
			qn, err := sqlident.ParseQualifiedName(pl.Rule.Table)
			if err != nil {
				return configError{err}
			}
			if err := inbox.InstallRule(ctx, tx, qn.Schema, qn.Name, pl.Rule.ClaimRule()); err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("applied scope %q on %s: %s", pl.Rule.Scope, pl.Rule.Table, pl.Rule))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, l := range lines {
		fmt.Fprintln(a.stdout, l)
	}
	return a.applyVacuum(ctx, pool, tables)
}

// applyVacuum sets, on each table a record names, the autovacuum
// reloptions that keep up with the rows falling due now (vacuum.Advise),
// when this role owns it; otherwise it prints the statement for the owner.
func (a *app) applyVacuum(ctx context.Context, pool *pgxpool.Pool, tables map[string]*catalog.Table) error {
	for _, name := range slices.Sorted(maps.Keys(tables)) {
		t := tables[name]
		if t.Partitioned() || t.Distributed() {
			continue
		}
		rate, err := expiry.FallingDueRate(ctx, pool, t)
		if err != nil {
			return err
		}
		st, err := vacuum.Read(ctx, pool, t)
		if err != nil {
			return err
		}
		adv := vacuum.Advise(st, rate)
		switch err := vacuum.Apply(ctx, pool, t, adv); {
		case errors.Is(err, vacuum.ErrNotOwner):
			fmt.Fprintf(a.stdout, "SKIP autovacuum of %s: only its owner may set it; as the owner: %s\n", t.Name, adv.AlterSQL(t.Ident))
		case err != nil:
			return err
		case len(adv.Set) == 0:
			fmt.Fprintf(a.stdout, "autovacuum of %s: nothing to set (%s)\n", t.Name, adv)
		default:
			fmt.Fprintf(a.stdout, "applied autovacuum of %s: %s\n", t.Name, strings.Join(adv.Set, ", "))
		}
	}
	return nil
}
