package retention

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/redisprobe"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// CoveredUntil reads the end of the unbroken run of t's partitions that
// starts at now (partitions.CoveredUntil, which this package cannot import:
// the partitions' tests use the claim path, which uses this package).
type CoveredUntil func(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table, now time.Time) (*time.Time, error)

// Verdict is one check of a deployment against a retention record, printed
// as one line by plan --check: whether the deployment keeps the record's
// promise there.
type Verdict struct {
	Result  string // OK, FAIL or SKIP
	Subject string
	Detail  string
}

// String is the verdict as plan --check prints it: "FAIL subject: detail".
func (v Verdict) String() string { return fmt.Sprintf("%-4s %s: %s", v.Result, v.Subject, v.Detail) }

// Deployment is what plan --check compares the records with.
type Deployment struct {
	Pool   *pgxpool.Pool
	Tables map[string]*catalog.Table // the tables the records name, resolved, by name
	Tx     dbconn.TxSettings
	// CoveredUntil is partitions.CoveredUntil; FallingDueRate is
	// expiry.FallingDueRate (which this package cannot import either: the
	// deleter uses the claim path's package, which uses this one).
	CoveredUntil    CoveredUntil
	FallingDueRate  func(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table) (float64, error)
	VacuumDeadRatio float64 // INBOXKEEPER_VACUUM_DEAD_RATIO: the daemon's own VACUUM
	RedisURL        string  // a Redis to judge as a volatile tier; "" for none
	// Installed reads the rule plan --apply installed for a record's table
	// and scope (inbox.LoadRule, through FromClaimRule); nil when none is.
	// Nil: not checked.
	Installed func(ctx context.Context, table, scope string) (*Rule, error)
}

// Check judges d against the records of plans, giving report each verdict
// as it is reached: each record's table (CheckTable; SKIP for a record that
// names none), the vacuum of each table (CheckVacuum), then the Redis
// (CheckRedis). It returns how many of the verdicts failed, of how many
// were OK or FAIL.
func Check(ctx context.Context, plans []Plan, d Deployment, report func(Verdict)) (failed, total int) {
	judge := func(v Verdict) {
		switch v.Result {
		case "FAIL":
			failed++
			total++
		case "OK":
			total++
		}
		report(v)
	}
	for _, pl := range plans {
		t := d.Tables[pl.Rule.Table]
		if t == nil {
			judge(Verdict{"SKIP", pl.Rule.Scope, "the record names no table, so there is no deployment to compare it with"})
			continue
		}
		for _, v := range CheckTable(ctx, d.Pool, pl.Rule, t, d.Tx, d.CoveredUntil) {
			v.Subject = pl.Rule.Scope + " (" + t.Name + ")"
			judge(v)
		}
		if d.Installed != nil {
			v := Verdict{Result: "FAIL", Subject: pl.Rule.Scope + " (" + t.Name + ")"}
			if installed, err := d.Installed(ctx, pl.Rule.Table, pl.Rule.Scope); err != nil {
				v.Detail = err.Error()
			} else {
				v = CheckInstalled(pl.Rule, installed)
				v.Subject = pl.Rule.Scope + " (" + t.Name + ")"
			}
			judge(v)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.Tables)) {
		t := d.Tables[name]
		rate, err := d.FallingDueRate(ctx, d.Pool, t)
		if err != nil {
			judge(Verdict{"FAIL", "vacuum (" + t.Name + ")", err.Error()})
			continue
		}
		judge(CheckVacuum(ctx, d.Pool, t, rate, d.VacuumDeadRatio))
	}
	if d.RedisURL != "" {
		for _, v := range CheckRedis(ctx, d.RedisURL) {
			judge(v)
		}
	}
	return failed, total
}

// CheckTable compares one table with the rule of its record: the expiry
// rule, every row's expiry, and partition coverage. Its verdicts name no
// subject: the caller's is the record.
//
// coveredUntil reads how far t's partitions reach from now without a gap
// (partitions.CoveredUntil: nil when a MAXVALUE partition ends them).
func CheckTable(ctx context.Context, pool *pgxpool.Pool, r Rule, t *catalog.Table, s dbconn.TxSettings, coveredUntil CoveredUntil) []Verdict {
	var out []Verdict
	if ea := t.Policy.ExpiresAfter; ea != nil {
		if ea.After < r.Retention {
			out = append(out, Verdict{"FAIL", "", fmt.Sprintf("expiry rule: expires_after %s + %s is shorter than the computed retention %s (%s longest scenario + %s margin); rows would be deleted before the promise ends",
				ea.Column, days(ea.After), days(r.Retention), days(r.Retention-r.Margin), days(r.Margin))})
		} else {
			out = append(out, Verdict{"OK", "", fmt.Sprintf("expiry rule: expires_after %s + %s covers the retention %s", ea.Column, days(ea.After), days(r.Retention))})
		}
	}
	out = append(out, checkRows(ctx, pool, r, t, s))
	return append(out, checkCoverage(ctx, pool, r, t, coveredUntil)...)
}

// CheckInstalled compares the rule the policy computes for a record with
// the one plan --apply installed (nil: none), which is what the claim path
// writes remember_until by and replay start judges by: one installed
// before the policy changed keeps writing the old expiries until plan
// --apply runs again. Its verdict names no subject.
func CheckInstalled(r Rule, installed *Rule) Verdict {
	if installed == nil {
		return Verdict{"SKIP", "", "installed rule: none for this scope; the claim path and replay start read the rule plan --apply installs"}
	}
	us := func(d time.Duration) time.Duration { return d.Truncate(time.Microsecond) }
	same := us(r.PostReceipt) == installed.PostReceipt && us(r.Replay) == installed.Replay && us(r.Margin) == installed.Margin &&
		(r.Deadline == nil) == (installed.Deadline == nil) && (r.Deadline == nil || r.Deadline.Truncate(time.Microsecond).Equal(*installed.Deadline)) &&
		r.Extension.OnDuplicate == installed.Extension.OnDuplicate &&
		(!r.Extension.OnDuplicate || us(r.Extension.By) == installed.Extension.By && us(r.Extension.Cap) == installed.Extension.Cap)
	if same {
		return Verdict{"OK", "", "installed rule: " + describeInstalled(*installed) + ", as the policy says"}
	}
	return Verdict{"FAIL", "", fmt.Sprintf("installed rule: %s, where the policy says %s; the claim path writes and replay start judges by the installed one until plan --apply installs the policy's",
		describeInstalled(*installed), describeInstalled(r))}
}

// describeInstalled is a rule as CheckInstalled compares it: its
// remember_until and its extension on duplicates.
func describeInstalled(r Rule) string {
	s := r.String()
	if r.Extension.OnDuplicate {
		s += fmt.Sprintf(" (a duplicate extends it to now + %s, at most first_seen + %s)", days(r.Extension.By), days(r.Extension.Cap))
	}
	return s
}

// checkCoverage compares how far ahead the rule writes expiries with the
// table's partitions: a new row beyond the last partition fails its insert.
// Retirement cannot cut a promise short (a partition goes only once its
// upper bound has passed), so coverage is the one thing to check.
func checkCoverage(ctx context.Context, pool *pgxpool.Pool, r Rule, t *catalog.Table, coveredUntil CoveredUntil) []Verdict {
	if !t.Partitioned() {
		return []Verdict{{"OK", "", "partition coverage: not partitioned"}}
	}
	now, err := dbconn.Now(ctx, pool)
	if err != nil {
		return []Verdict{{"FAIL", "", "partition coverage: read the clock: " + err.Error()}}
	}
	// A message first seen now gets at most the longest scenario plus the
	// margin; a deadline may reach further.
	ahead := r.Retention
	if r.Deadline != nil {
		ahead = max(ahead, r.Deadline.Add(r.Margin).Sub(now))
	}
	var out []Verdict
	if me := t.Policy.Partitions.MaxExpiry; me < ahead {
		out = append(out, Verdict{"FAIL", "", fmt.Sprintf("partition coverage: partitions.max_expiry %s is shorter than the %s ahead the rule writes; premake will not keep partitions for the newest rows", days(me), days(ahead))})
	} else {
		out = append(out, Verdict{"OK", "", fmt.Sprintf("partition coverage: partitions.max_expiry %s covers the %s ahead the rule writes", days(me), days(ahead))})
	}
	until, err := coveredUntil(ctx, pool, t, now)
	switch {
	case err != nil:
		out = append(out, Verdict{"FAIL", "", "partition coverage: " + err.Error()})
	case until == nil:
		out = append(out, Verdict{"OK", "", "partition coverage: a MAXVALUE partition takes every row"})
	case until.Sub(now) < ahead:
		out = append(out, Verdict{"FAIL", "", fmt.Sprintf("partition coverage: the partitions reach %s (%s ahead), the rule writes up to %s ahead: inserts beyond fail; run inboxkeeper partitions ensure",
			until.UTC().Format(time.RFC3339), days(until.Sub(now).Round(time.Second)), days(ahead))})
	default:
		out = append(out, Verdict{"OK", "", fmt.Sprintf("partition coverage: the partitions reach %s, beyond the %s the rule writes", until.UTC().Format(time.RFC3339), days(ahead))})
	}
	return out
}

// checkRows says whether any row of the scope has an expiry before the one
// the rule computes from its own anchors (CheckRows).
func checkRows(ctx context.Context, pool *pgxpool.Pool, r Rule, t *catalog.Table, s dbconn.TxSettings) Verdict {
	rc, err := CheckRows(ctx, pool, r, t, s)
	scope := ""
	if t.Scope != nil {
		scope = fmt.Sprintf(" (scope %q)", r.Scope)
	}
	formula := strings.TrimPrefix(r.String(), "remember_until = ")
	switch {
	case errors.Is(err, ErrNoAnchor):
		return Verdict{"FAIL", "", "rows: the table lacks the first_seen or event_time column the rule counts from"}
	case err != nil:
		return Verdict{"FAIL", "", "rows: could not check: " + err.Error()}
	case rc.NoScenario:
		return Verdict{"OK", "", "rows: the rule has no inbox scenario (every path is left to the permanent business key); nothing to compare"}
	case rc.Early == 0:
		return Verdict{"OK", "", fmt.Sprintf("rows: none with an expiry earlier than %s%s", formula, scope)}
	}
	count := fmt.Sprint(rc.Early)
	if rc.Capped {
		count = fmt.Sprintf("more than %d", RowCheckCap)
	}
	id := make([]string, len(t.Key))
	for i, k := range t.Key {
		v := "NULL"
		if rc.First.Key[i] != nil {
			v = *rc.First.Key[i]
		}
		id[i] = k.Name + "=" + v
	}
	return Verdict{"FAIL", "", fmt.Sprintf("rows: %s with an expiry earlier than %s%s, so forgotten too early; the first: %s: expiry %s, rule %s",
		count, formula, scope, strings.Join(id, " "), rc.First.Expiry.UTC().Format(time.RFC3339), rc.First.Until.UTC().Format(time.RFC3339))}
}

// CheckRedis judges a volatile tier: its TTLs are kept only if nothing
// evicts the keys and a restart does not wipe them.
func CheckRedis(ctx context.Context, url string) []Verdict {
	s, err := redisprobe.Probe(ctx, url)
	if err != nil {
		return []Verdict{{"FAIL", "redis", "cannot read its settings, so nothing shows it keeps a key for its TTL: " + err.Error()}}
	}
	var out []Verdict
	for _, f := range s.Findings() {
		v := "OK"
		if !f.OK {
			v = "FAIL"
		}
		out = append(out, Verdict{v, "redis " + s.Addr, f.Check + ": " + f.Detail})
	}
	return out
}

// CheckVacuum judges whether the space of t's deleted rows is kept
// reclaimed at the rate rows fall due now (rate, rows a second): by the
// daemon's VACUUM after its passes (daemonRatio, INBOXKEEPER_VACUUM_DEAD_RATIO,
// when this role may vacuum the table), or by autovacuum (vacuum.Advise).
// A FAIL names the reloptions to set (plan --apply sets them) and, when
// they cannot do it, the autovacuum_naptime it would take.
func CheckVacuum(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table, rate, daemonRatio float64) Verdict {
	subject := "vacuum (" + t.Name + ")"
	if t.Partitioned() || t.ThroughCitus() {
		return Verdict{"SKIP", subject, "partitions go whole, and a Citus table's shards are vacuumed on its nodes"}
	}
	st, err := vacuum.Read(ctx, pool, t)
	if err != nil {
		return Verdict{"FAIL", subject, err.Error()}
	}
	a := vacuum.Advise(st, rate)
	switch {
	case daemonRatio > 0 && st.MayVacuum:
		return Verdict{"OK", subject, fmt.Sprintf("the daemon vacuums it after a pass that leaves %.0f%% of its tuples dead; %s", 100*daemonRatio, a)}
	case a.KeepsUp:
		return Verdict{"OK", subject, "autovacuum keeps up: " + a.String()}
	}
	detail := "autovacuum cannot keep up: " + a.String()
	if sql := a.AlterSQL(t.Ident); sql != "" {
		detail += "; set, as the table's owner (plan --apply does): " + sql
	}
	if daemonRatio > 0 {
		detail += "; the daemon's VACUUM needs a role that may vacuum the table (its owner; from PostgreSQL 17, GRANT MAINTAIN)"
	}
	return Verdict{"FAIL", subject, detail}
}
