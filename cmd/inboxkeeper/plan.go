package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/redisprobe"
	"github.com/inboxkeeper/inboxkeeper/internal/sqlident"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/retention"
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
		return a.applyPlans(ctx, plans)
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

// checkLine is one check's verdict, printed as one line.
type checkLine struct {
	verdict string // OK, FAIL or SKIP
	subject string
	detail  string
}

func (a *app) checkPlans(ctx context.Context, plans []retention.Plan, p *policy.Policy, redisURL string) error {
	// Resolve every named table first: a record that names a table the
	// database does not match is a configuration error, as for every command.
	tables := map[string]*catalog.Table{}
	var pool *pgxpool.Pool
	for _, pl := range plans {
		name := pl.Rule.Table
		if name == "" || tables[name] != nil {
			continue
		}
		if p == nil {
			return configError{fmt.Errorf("plan --check: the record for %q names table %s, but there is no policy file (%s) to find it in", pl.Rule.Scope, name, a.cfg.PolicyFile)}
		}
		var pt *policy.Table
		for i := range p.Tables {
			if p.Tables[i].Name.String() == name {
				pt = &p.Tables[i]
			}
		}
		if pt == nil {
			return configError{fmt.Errorf("plan --check: the record for %q names table %s, which is not in the policy file %s", pl.Rule.Scope, name, p.Source)}
		}
		if pool == nil {
			var err error
			if pool, err = a.connect(ctx); err != nil {
				return err
			}
		}
		t, err := catalog.Resolve(ctx, pool, *pt)
		if err != nil {
			return fmt.Errorf("%s: %w", p.Source, err)
		}
		tables[name] = t
	}

	failed, total := 0, 0
	report := func(l checkLine) {
		switch l.verdict {
		case "FAIL":
			failed++
			total++
		case "OK":
			total++
		}
		fmt.Fprintf(a.stdout, "%-4s %s: %s\n", l.verdict, l.subject, l.detail)
	}
	for _, pl := range plans {
		subject := pl.Rule.Scope
		t := tables[pl.Rule.Table]
		if t == nil {
			report(checkLine{"SKIP", subject, "the record names no table, so there is no deployment to compare it with"})
			continue
		}
		subject += " (" + t.Name + ")"
		for _, l := range a.checkTable(ctx, pool, pl.Rule, t) {
			l.subject = subject
			report(l)
		}
	}
	if redisURL != "" {
		for _, l := range checkRedis(ctx, redisURL) {
			report(l)
		}
	}
	if failed > 0 {
		return fmt.Errorf("plan --check: %d of %d checks failed: the deployment does not keep the promise of the retention record", failed, total)
	}
	return nil
}

// checkTable compares one table with the rule of its record: the expiry
// rule, every row's expiry, and partition coverage.
func (a *app) checkTable(ctx context.Context, pool *pgxpool.Pool, r retention.Rule, t *catalog.Table) []checkLine {
	var out []checkLine
	if ea := t.Policy.ExpiresAfter; ea != nil {
		if ea.After < r.Retention {
			out = append(out, checkLine{"FAIL", "", fmt.Sprintf("expiry rule: expires_after %s + %s is shorter than the computed retention %s (%s longest scenario + %s margin); rows would be deleted before the promise ends",
				ea.Column, dur(ea.After), dur(r.Retention), dur(r.Retention-r.Margin), dur(r.Margin))})
		} else {
			out = append(out, checkLine{"OK", "", fmt.Sprintf("expiry rule: expires_after %s + %s covers the retention %s", ea.Column, dur(ea.After), dur(r.Retention))})
		}
	}
	out = append(out, a.checkRows(ctx, pool, r, t))
	return append(out, checkCoverage(ctx, pool, r, t)...)
}

// checkCoverage compares how far ahead the rule writes expiries with the
// table's partitions: a new row beyond the last partition fails its insert.
// Retirement cannot cut a promise short (a partition goes only once its
// upper bound has passed), so coverage is the one thing to check.
func checkCoverage(ctx context.Context, pool *pgxpool.Pool, r retention.Rule, t *catalog.Table) []checkLine {
	if !t.Partitioned() {
		return []checkLine{{"OK", "", "partition coverage: not partitioned"}}
	}
	now, err := dbconn.Now(ctx, pool)
	if err != nil {
		return []checkLine{{"FAIL", "", "partition coverage: read the clock: " + err.Error()}}
	}
	// A message first seen now gets at most the longest scenario plus the
	// margin; a deadline may reach further.
	ahead := r.Retention
	if r.Deadline != nil {
		ahead = max(ahead, r.Deadline.Add(r.Margin).Sub(now))
	}
	var out []checkLine
	if me := t.Policy.Partitions.MaxExpiry; me < ahead {
		out = append(out, checkLine{"FAIL", "", fmt.Sprintf("partition coverage: partitions.max_expiry %s is shorter than the %s ahead the rule writes; premake will not keep partitions for the newest rows", dur(me), dur(ahead))})
	} else {
		out = append(out, checkLine{"OK", "", fmt.Sprintf("partition coverage: partitions.max_expiry %s covers the %s ahead the rule writes", dur(me), dur(ahead))})
	}
	until, err := partitions.CoveredUntil(ctx, pool, t, now)
	switch {
	case err != nil:
		out = append(out, checkLine{"FAIL", "", "partition coverage: " + err.Error()})
	case until == nil:
		out = append(out, checkLine{"OK", "", "partition coverage: a MAXVALUE partition takes every row"})
	case until.Sub(now) < ahead:
		out = append(out, checkLine{"FAIL", "", fmt.Sprintf("partition coverage: the partitions reach %s (%s ahead), the rule writes up to %s ahead: inserts beyond fail; run inboxkeeper partitions ensure",
			until.UTC().Format(time.RFC3339), dur(until.Sub(now).Round(time.Second)), dur(ahead))})
	default:
		out = append(out, checkLine{"OK", "", fmt.Sprintf("partition coverage: the partitions reach %s, beyond the %s the rule writes", until.UTC().Format(time.RFC3339), dur(ahead))})
	}
	return out
}

// checkRows says whether any row of the scope has an expiry before the one
// the rule computes from its own anchors (retention.CheckRows).
func (a *app) checkRows(ctx context.Context, pool *pgxpool.Pool, r retention.Rule, t *catalog.Table) checkLine {
	rc, err := retention.CheckRows(ctx, pool, r, t, a.txSettings())
	scope := ""
	if t.Scope != nil {
		scope = fmt.Sprintf(" (scope %q)", r.Scope)
	}
	formula := strings.TrimPrefix(r.String(), "remember_until = ")
	switch {
	case errors.Is(err, retention.ErrNoAnchor):
		return checkLine{"FAIL", "", "rows: the table lacks the first_seen or event_time column the rule counts from"}
	case err != nil:
		return checkLine{"FAIL", "", "rows: could not check: " + err.Error()}
	case rc.NoScenario:
		return checkLine{"OK", "", "rows: the rule has no inbox scenario (every path is left to the permanent business key); nothing to compare"}
	case rc.Early == 0:
		return checkLine{"OK", "", fmt.Sprintf("rows: none with an expiry earlier than %s%s", formula, scope)}
	}
	count := fmt.Sprint(rc.Early)
	if rc.Capped {
		count = fmt.Sprintf("more than %d", retention.RowCheckCap)
	}
	id := make([]string, len(t.Key))
	for i, k := range t.Key {
		v := "NULL"
		if rc.First.Key[i] != nil {
			v = *rc.First.Key[i]
		}
		id[i] = k.Name + "=" + v
	}
	return checkLine{"FAIL", "", fmt.Sprintf("rows: %s with an expiry earlier than %s%s, so forgotten too early; the first: %s: expiry %s, rule %s",
		count, formula, scope, strings.Join(id, " "), rc.First.Expiry.UTC().Format(time.RFC3339), rc.First.Until.UTC().Format(time.RFC3339))}
}

// checkRedis judges a volatile tier: its TTLs are kept only if nothing
// evicts the keys and a restart does not wipe them.
func checkRedis(ctx context.Context, url string) []checkLine {
	s, err := redisprobe.Probe(ctx, url)
	if err != nil {
		return []checkLine{{"FAIL", "redis", "cannot read its settings, so nothing shows it keeps a key for its TTL: " + err.Error()}}
	}
	var out []checkLine
	for _, f := range s.Findings() {
		v := "OK"
		if !f.OK {
			v = "FAIL"
		}
		out = append(out, checkLine{v, "redis " + s.Addr, f.Check + ": " + f.Detail})
	}
	return out
}

func dur(d time.Duration) string { return policy.Duration(d).String() }

// applyPlans installs every record's rule, in one transaction, for the claim
// path. A record without a table has nothing to install it on.
func (a *app) applyPlans(ctx context.Context, plans []retention.Plan) error {
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	var lines []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
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
			if err := inbox.InstallRule(ctx, tx, qn.Schema, qn.Name, pl.Rule); err != nil {
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
	return nil
}
