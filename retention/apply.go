package retention

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// BadTableError is a record whose table is no schema-qualified name: a
// configuration error.
type BadTableError struct{ Err error }

func (e BadTableError) Error() string { return e.Err.Error() }
func (e BadTableError) Unwrap() error { return e.Err }

// Apply is `plan --apply`: it installs every record's rule in one
// transaction, for the claim path, then sets on each of d's tables the
// autovacuum reloptions that keep up with the rows falling due now
// (vacuum.Advise). say is given each line of what was done, the rules'
// only after their transaction committed. A record without a table has
// nothing to install it on.
func Apply(ctx context.Context, plans []Plan, d Deployment, say func(string)) error {
	var lines []string
	// Read committed, whatever the server's default: each rule compiles the
	// claim function from the rules as committed (inbox.InstallRule). Durable:
	// a rule decides the expiry every claim writes from now on.
	err := pgx.BeginTxFunc(ctx, d.Pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := dbconn.MakeDurable(ctx, tx); err != nil {
			return err
		}
		if _, err := d.Tx.Apply(ctx, tx); err != nil {
			return err
		}
		for _, pl := range plans {
			if pl.Rule.Table == "" {
				lines = append(lines, fmt.Sprintf("SKIP scope %q: the record names no table", pl.Rule.Scope))
				continue
			}
			qn, err := sqlident.ParseQualifiedName(pl.Rule.Table)
			if err != nil {
				return BadTableError{err}
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
		say(l)
	}
	return applyVacuum(ctx, d, say)
}

// applyVacuum sets, on each of d's tables, the autovacuum reloptions that
// keep up with the rows falling due now, when this role owns it; otherwise
// it says the statement for the owner.
func applyVacuum(ctx context.Context, d Deployment, say func(string)) error {
	for _, name := range slices.Sorted(maps.Keys(d.Tables)) {
		t := d.Tables[name]
		if t.Partitioned() || t.ThroughCitus() {
			continue
		}
		rate, err := d.FallingDueRate(ctx, d.Pool, t)
		if err != nil {
			return err
		}
		st, err := vacuum.Read(ctx, d.Pool, t)
		if err != nil {
			return err
		}
		adv := vacuum.Advise(st, rate)
		switch err := vacuum.Apply(ctx, d.Pool, t, adv); {
		case errors.Is(err, vacuum.ErrNotOwner):
			say(fmt.Sprintf("SKIP autovacuum of %s: only its owner may set it; as the owner: %s", t.Name, adv.AlterSQL(t.Ident)))
		case err != nil:
			return err
		case len(adv.Set) == 0:
			say(fmt.Sprintf("autovacuum of %s: nothing to set (%s)", t.Name, adv))
		default:
			say(fmt.Sprintf("applied autovacuum of %s: %s", t.Name, strings.Join(adv.Set, ", ")))
		}
	}
	return nil
}

// Installed reads, on pool, the rule plan --apply installed for a table
// and scope (inbox.LoadRule); nil when none is: Deployment.Installed.
func Installed(pool *pgxpool.Pool) func(ctx context.Context, table, scope string) (*Rule, error) {
	return func(ctx context.Context, table, scope string) (*Rule, error) {
		qn, err := sqlident.ParseQualifiedName(table)
		if err != nil {
			return nil, err
		}
		r, err := inbox.LoadRule(ctx, pool, qn.Schema, qn.Name, scope)
		if r == nil || err != nil {
			return nil, err
		}
		installed := FromClaimRule(*r)
		return &installed, nil
	}
}
