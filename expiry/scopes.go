package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
)

// ScopeRange is what one scope of a table still remembers: the oldest and
// newest expiry, and the oldest and newest first receipt. A nil field was
// not measured (no index makes it cheap) or the scope has no such row.
type ScopeRange struct {
	OldestExpiry, NewestExpiry       *time.Time
	OldestFirstSeen, NewestFirstSeen *time.Time
}

// ScopeIndexes says which per-scope ranges of t can be read from an index
// (scope, expiry) or (scope, first_seen): each is then four index probes,
// and without the index it would be a scan of the scope's rows every pass.
type ScopeIndexes struct{ Expiry, FirstSeen bool }

// FindScopeIndexes looks for the indexes that make ScopeRanges cheap.
func FindScopeIndexes(ctx context.Context, q catalog.Querier, t *catalog.Table) (ScopeIndexes, error) {
	var si ScopeIndexes
	if t.Scope == nil {
		return si, nil
	}
	var err error
	if si.Expiry, err = catalog.IndexLeads(ctx, q, t, *t.Scope, t.Expiry); err != nil {
		return si, err
	}
	if t.FirstSeen != nil {
		si.FirstSeen, err = catalog.IndexLeads(ctx, q, t, *t.Scope, *t.FirstSeen)
	}
	return si, err
}

// FirstSeenIndexed reports whether an index leads with t's first_seen
// column, which makes FirstSeenRange two index probes.
func FirstSeenIndexed(ctx context.Context, q catalog.Querier, t *catalog.Table) (bool, error) {
	if t.FirstSeen == nil {
		return false, nil
	}
	return catalog.IndexLeads(ctx, q, t, *t.FirstSeen)
}

// FirstSeenRange is the first receipt of the oldest and newest identity t
// retains (nil, nil for an empty table).
func FirstSeenRange(ctx context.Context, q catalog.Querier, t *catalog.Table) (oldest, newest *time.Time, err error) {
	var o, n pgtype.Timestamptz
	c := t.FirstSeen
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT %[1]s FROM %[2]s t WHERE t.%[3]s IS NOT NULL ORDER BY t.%[3]s LIMIT 1),
       (SELECT %[1]s FROM %[2]s t WHERE t.%[3]s IS NOT NULL ORDER BY t.%[3]s DESC LIMIT 1)`, c.AsTimestamptz("t"), t.Ident, c.Quoted)).Scan(&o, &n)
	if err != nil {
		return nil, nil, fmt.Errorf("table %s: measure the first-seen range: %w", t.Name, err)
	}
	if o.Valid {
		oldest = &o.Time
	}
	if n.Valid {
		newest = &n.Time
	}
	return oldest, newest, nil
}

// ScopeRanges measures one scope value of t, reading only what si says is
// indexed. The expiry is column + expires_after, as elsewhere.
func ScopeRanges(ctx context.Context, q catalog.Querier, t *catalog.Table, si ScopeIndexes, scope string) (ScopeRange, error) {
	var r ScopeRange
	if t.Scope == nil {
		return r, nil
	}
	probe := func(c catalog.Column, dir string) string {
		return fmt.Sprintf("(SELECT %[1]s FROM %[2]s t WHERE t.%[3]s = CAST($1 AS %[4]s) AND t.%[5]s IS NOT NULL ORDER BY t.%[5]s %[6]s LIMIT 1)",
			c.AsTimestamptz("t"), t.Ident, t.Scope.Quoted, t.Scope.Type, c.Quoted, dir)
	}
	var cols []string
	var dests []*pgtype.Timestamptz
	var oe, ne, of, nf pgtype.Timestamptz
	if si.Expiry {
		cols = append(cols, probe(t.Expiry, "ASC"), probe(t.Expiry, "DESC"))
		dests = append(dests, &oe, &ne)
	}
	if si.FirstSeen && t.FirstSeen != nil {
		cols = append(cols, probe(*t.FirstSeen, "ASC"), probe(*t.FirstSeen, "DESC"))
		dests = append(dests, &of, &nf)
	}
	if len(cols) == 0 {
		return r, nil
	}
	sql := "SELECT " + cols[0]
	for _, c := range cols[1:] {
		sql += ", " + c
	}
	scan := make([]any, len(dests))
	for i := range dests {
		scan[i] = dests[i]
	}
	if err := q.QueryRow(ctx, sql, scope).Scan(scan...); err != nil {
		return r, fmt.Errorf("table %s, scope %q: measure retained identities: %w", t.Name, scope, err)
	}
	at := func(v pgtype.Timestamptz, off time.Duration) *time.Time {
		if !v.Valid {
			return nil
		}
		x := v.Time.Add(off)
		return &x
	}
	off := t.Policy.ExpiryOffset()
	r.OldestExpiry, r.NewestExpiry = at(oe, off), at(ne, off)
	r.OldestFirstSeen, r.NewestFirstSeen = at(of, 0), at(nf, 0)
	return r, nil
}
