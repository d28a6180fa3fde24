package tiering

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// The tier model: what a tier is for a table (its tiers section resolved
// against the catalog), owned here with all of its SQL. catalog.Resolve
// resolves it with the table's other checks (the section "tiers",
// registered below), so its problems are reported with theirs; the
// deleter, the demoter and the partition manager ask for it with Of.

// section is the policy section this package resolves.
const section = "tiers"

func init() { catalog.RegisterSection(section, resolveSection) }

// Of is t's tiers section resolved; nil when its policy has none.
func Of(t *catalog.Table) *Tiers {
	r := t.Section(section)
	if r == nil {
		if t.Policy.Tiers != nil {
			// A catalog.Table not made by catalog.Resolve: it would
			// delete rows without their permanent keys.
			panic("tiering: table " + t.Name + " has a tiers section that was not resolved (catalog.Resolve)")
		}
		return nil
	}
	return r.(*Tiers)
}

// KeyOf is t's permanent key; nil when its policy names none.
func KeyOf(t *catalog.Table) *PermanentKey {
	if ti := Of(t); ti != nil {
		return ti.Key
	}
	return nil
}

// Tiers is a table's tiers section resolved against the catalog.
type Tiers struct {
	HotFor time.Duration
	// Anchor is the column the hot window counts from, on the table. With a
	// side table it is also the side table's column of the same name.
	Anchor catalog.Column
	// Payload are the columns emptied in place; nil with a side table.
	Payload []catalog.Column
	// PartialIndex: in place, the anchor index skips rows without payload
	// (WHERE payload IS NOT NULL), so demoted rows are not walked again.
	PartialIndex bool
	Side         *SideTable    // the side-table layout; nil in place
	Key          *PermanentKey // nil: no permanent key
}

// TimeColumns is the anchor: the local-time warnings read it
// (catalog.Resolved).
func (ti *Tiers) TimeColumns() []catalog.Column { return []catalog.Column{ti.Anchor} }

// ReadColumns are the table's columns demotion and the permanent keys
// read: the anchor, the payload in place (whether it is empty yet) and
// the key's (catalog.Resolved).
func (ti *Tiers) ReadColumns() []catalog.Column {
	cols := append([]catalog.Column{ti.Anchor}, ti.Payload...)
	if ti.Key != nil {
		cols = append(cols, ti.Key.Columns...)
	}
	return cols
}

// sideReadColumns are the side table's columns demotion reads: the key's,
// the anchor, the hold columns it has, and ctid.
func (ti *Tiers) sideReadColumns(t *catalog.Table) []string {
	cols := []string{"ctid"}
	add := func(c *catalog.Column) {
		if c != nil && !slices.Contains(cols, c.Name) {
			cols = append(cols, c.Name)
		}
	}
	for i := range t.Key {
		add(&t.Key[i])
	}
	add(&ti.Side.Anchor)
	add(ti.Side.Scope)
	add(ti.Side.EventTime)
	return cols
}

// checkReadable is catalog.CheckReadable for t and its side table.
func checkReadable(ctx context.Context, q catalog.Querier, t *catalog.Table) error {
	if err := catalog.CheckReadable(ctx, q, t); err != nil {
		return err
	}
	if ti := Of(t); ti != nil && ti.Side != nil {
		return catalog.CheckColumns(ctx, q, ti.Side.Name, ti.Side.OID, ti.sideReadColumns(t))
	}
	return nil
}

// SideTable holds the payload, one row per identity, keyed by the table's
// key columns (same names and types).
type SideTable struct {
	Name   string // canonical spelling
	Ident  string // quoted, for SQL text
	OID    uint32
	Kind   string         // "r" ordinary, "p" partitioned
	Anchor catalog.Column // the side table's anchor column
	// Scope and EventTime are the side table's columns of the same name
	// and type as the table's; when every hold column is there, holds are
	// matched on the side row without a join.
	Scope, EventTime *catalog.Column
}

// HoldColumnsLocal reports whether holds can be matched on the side row
// alone: it has every column a hold of table t can name.
func (s *SideTable) HoldColumnsLocal(t *catalog.Table) bool {
	return (t.Scope == nil || s.Scope != nil) && (t.EventTime == nil || s.EventTime != nil)
}

// LocalTable is t as seen from its side table: the hold columns are the side
// table's, so that holds.Coverage predicates can be written over a side row.
func (s *SideTable) LocalTable(t *catalog.Table) *catalog.Table {
	c := *t
	c.Scope, c.EventTime = s.Scope, s.EventTime
	return &c
}

// PermanentKey describes the compact key table and the table's columns a
// key row is made of.
type PermanentKey struct {
	Table  sqlident.QualifiedName
	Name   string // canonical spelling
	Ident  string // quoted, for SQL text
	Exists bool   // the table existed when the policy was resolved
	// Columns are the key columns, then the scope (when the policy has one
	// and it is not a key column), then the hash (when named): the key
	// table's columns, named and typed as in the source table.
	Columns []catalog.Column
	NKey    int    // the first NKey of Columns are the primary key
	Hash    string // the hash column's name, "" when none
	// FirstSeen is the source of the key table's first_seen date: the
	// policy's first_seen column, else the tiers anchor.
	FirstSeen catalog.Column
}

// resolveSection checks the tiers section of t against the catalog, cols being
// the table's columns (name → format_type): catalog.SectionResolver. It
// runs once the table's own columns and its Citus distribution resolved.
func resolveSection(ctx context.Context, q catalog.Querier, t *catalog.Table, cols map[string]string) (catalog.Resolved, error) {
	pt := t.Policy.Tiers
	if pt == nil {
		return nil, nil
	}
	res := &Tiers{HotFor: pt.HotFor}
	anchor, err := catalog.LookupColumn(t.Policy, "tiers.anchor", pt.Anchor, cols, true)
	if err != nil {
		return nil, err
	}
	res.Anchor = anchor

	if pt.PayloadTable != nil {
		if res.Side, err = resolveSide(ctx, q, t, *pt.PayloadTable, anchor); err != nil {
			return nil, err
		}
	} else {
		if err := resolveInPlace(ctx, q, t, res, pt.PayloadColumns, cols); err != nil {
			return nil, err
		}
	}
	if pt.PermanentKey != nil {
		if res.Key, err = resolveKey(ctx, q, t, pt.PermanentKey, anchor, cols); err != nil {
			return nil, err
		}
	}
	if err := resolveCitus(ctx, q, t, res); err != nil {
		return nil, err
	}
	return res, nil
}

func resolveInPlace(ctx context.Context, q catalog.Querier, t *catalog.Table, res *Tiers, names []string, cols map[string]string) error {
	pt := t.Policy
	for i, name := range names {
		field := fmt.Sprintf("tiers.payload_columns[%d]", i)
		c, err := catalog.LookupColumn(pt, field, name, cols, false)
		if err != nil {
			return err
		}
		var notNull bool
		if err := q.QueryRow(ctx, `SELECT attnotnull FROM pg_attribute WHERE attrelid = $1 AND attname = $2`, t.OID, name).Scan(&notNull); err != nil {
			return fmt.Errorf("table %s: read column %q: %w", t.Name, name, err)
		}
		if notNull {
			return catalog.Invalid(pt, field, "column %q is NOT NULL, so it cannot be emptied in place; drop the constraint (ALTER TABLE %s ALTER COLUMN %s DROP NOT NULL) or move the payload to a side table (payload_table)",
				name, t.Ident, c.Quoted)
		}
		res.Payload = append(res.Payload, c)
	}
	// The anchor must lead a btree index; best a partial one that leaves
	// out the rows already demoted, so a pass does not walk them again.
	full, partial, err := anchorIndex(ctx, q, t.OID, res.Anchor.Name, names)
	if err != nil {
		return fmt.Errorf("table %s: read indexes: %w", t.Name, err)
	}
	if !full && !partial {
		return catalog.Invalid(pt, "tiers.anchor", "no valid btree index leads with column %q; create one first, best one that leaves out demoted rows: CREATE INDEX CONCURRENTLY ON %s (%s) WHERE %s",
			res.Anchor.Name, t.Ident, res.Anchor.Quoted, hasPayload(res.Payload, ""))
	}
	res.PartialIndex = partial
	return nil
}

// hasPayload is the SQL condition "the row still has payload" over the
// alias: some payload column is not NULL. It is written exactly as the
// recommended partial index's predicate, so that the planner uses it.
func hasPayload(payload []catalog.Column, alias string) string {
	if alias != "" {
		alias += "."
	}
	var ps []string
	for _, c := range payload {
		ps = append(ps, alias+c.Quoted+" IS NOT NULL")
	}
	if len(ps) == 1 {
		return ps[0]
	}
	return "(" + strings.Join(ps, " OR ") + ")"
}

// anchorIndex looks for valid btree indexes of rel leading with column:
// full is a non-partial one; partial one whose predicate is "some payload
// column is not NULL" (as hasPayload writes it).
func anchorIndex(ctx context.Context, q catalog.Querier, rel uint32, column string, payload []string) (full, partial bool, err error) {
	err = q.QueryRow(ctx, `
WITH want AS (
  SELECT CASE WHEN cardinality($3::text[]) = 1 THEN '(' || quote_ident(($3::text[])[1]) || ' IS NOT NULL)'
         ELSE '(' || (SELECT string_agg('(' || quote_ident(c) || ' IS NOT NULL)', ' OR ' ORDER BY o)
                      FROM unnest($3::text[]) WITH ORDINALITY u(c, o)) || ')' END AS pred
)
SELECT coalesce(bool_or(i.indpred IS NULL), false),
       coalesce(bool_or(cardinality($3::text[]) > 0 AND pg_get_expr(i.indpred, i.indrelid) = (SELECT pred FROM want)), false)
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_am am ON am.oid = ic.relam
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = $1 AND a.attname = $2 AND am.amname = 'btree' AND i.indisvalid AND i.indisready`,
		rel, column, payload).Scan(&full, &partial)
	return full, partial, err
}

func resolveSide(ctx context.Context, q catalog.Querier, t *catalog.Table, name sqlident.QualifiedName, anchor catalog.Column) (*SideTable, error) {
	pt := t.Policy
	const field = "tiers.payload_table"
	s := &SideTable{Name: name.String(), Ident: name.Sanitize()}
	err := q.QueryRow(ctx, `
SELECT c.oid, c.relkind::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, name.Schema, name.Name).Scan(&s.OID, &s.Kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, catalog.Invalid(pt, field, "no such table in the database (schema %q, name %q)", name.Schema, name.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("table %s: look up %s: %w", t.Name, s.Name, err)
	}
	if s.Kind != "r" && s.Kind != "p" {
		return nil, catalog.Invalid(pt, field, "%s is not a table (relkind %s)", s.Name, s.Kind)
	}
	cols, err := catalog.ColumnsOf(ctx, q, s.OID)
	if err != nil {
		return nil, fmt.Errorf("table %s: read the columns of %s: %w", t.Name, s.Name, err)
	}
	same := func(what string, c catalog.Column) (*catalog.Column, error) {
		typ, ok := cols[c.Name]
		if !ok {
			return nil, nil
		}
		if typ != c.Type {
			return nil, catalog.Invalid(pt, field, "%s: column %q (%s) is %s there and %s in %s; it must have the table's type", s.Name, c.Name, what, typ, c.Type, t.Name)
		}
		return &catalog.Column{Name: c.Name, Type: typ, Quoted: c.Quoted, Zone: c.Zone}, nil
	}
	for i, k := range t.Key {
		c, err := same(fmt.Sprintf("key[%d]", i), k)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, catalog.Invalid(pt, field, "%s has no key column %q: the side table is keyed by the table's key columns, with the same names%s", s.Name, k.Name, catalog.Suggest(k.Name, cols))
		}
	}
	a, err := same("tiers.anchor", anchor)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, catalog.Invalid(pt, field, "%s has no anchor column %q: the side table needs the anchor, with the same name, to find the rows to demote%s", s.Name, anchor.Name, catalog.Suggest(anchor.Name, cols))
	}
	s.Anchor = *a
	if t.Scope != nil {
		if s.Scope, err = same("scope", *t.Scope); err != nil {
			return nil, err
		}
	}
	if t.EventTime != nil {
		if s.EventTime, err = same("event_time", *t.EventTime); err != nil {
			return nil, err
		}
	}
	full, _, err := anchorIndex(ctx, q, s.OID, anchor.Name, nil)
	if err != nil {
		return nil, fmt.Errorf("table %s: read the indexes of %s: %w", t.Name, s.Name, err)
	}
	if !full {
		return nil, catalog.Invalid(pt, field, "no valid, non-partial btree index of %s leads with column %q; create one first: CREATE INDEX CONCURRENTLY ON %s (%s)",
			s.Name, anchor.Name, s.Ident, anchor.Quoted)
	}
	return s, nil
}

func resolveKey(ctx context.Context, q catalog.Querier, t *catalog.Table, pk *policy.PermanentKey, anchor catalog.Column, cols map[string]string) (*PermanentKey, error) {
	pt := t.Policy
	k := &PermanentKey{Table: pk.Table, Name: pk.Table.String(), Ident: pk.Table.Sanitize(), Hash: pk.Hash, FirstSeen: anchor}
	for i, name := range pk.Columns {
		c, err := catalog.LookupColumn(pt, fmt.Sprintf("tiers.permanent_key.columns[%d]", i), name, cols, false)
		if err != nil {
			return nil, err
		}
		k.Columns = append(k.Columns, c)
	}
	k.NKey = len(k.Columns)
	if t.Scope != nil && !slices.Contains(pk.Columns, t.Scope.Name) {
		k.Columns = append(k.Columns, *t.Scope)
	}
	if pk.Hash != "" {
		c, err := catalog.LookupColumn(pt, "tiers.permanent_key.hash", pk.Hash, cols, false)
		if err != nil {
			return nil, err
		}
		if t.Scope == nil || c.Name != t.Scope.Name {
			k.Columns = append(k.Columns, c)
		}
	}
	if t.FirstSeen != nil {
		k.FirstSeen = *t.FirstSeen
	}

	const field = "tiers.permanent_key.table"
	var oid uint32
	err := q.QueryRow(ctx, `
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, pk.Table.Schema, pk.Table.Name).Scan(&oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, nil // created by migrate or by the daemon
	}
	if err != nil {
		return nil, fmt.Errorf("table %s: look up %s: %w", t.Name, k.Name, err)
	}
	k.Exists = true
	have, err := catalog.ColumnsOf(ctx, q, oid)
	if err != nil {
		return nil, fmt.Errorf("table %s: read the columns of %s: %w", t.Name, k.Name, err)
	}
	want := append(slices.Clone(k.Columns), catalog.Column{Name: policy.FirstSeenColumn, Type: "date"})
	for _, c := range want {
		typ, ok := have[c.Name]
		if !ok {
			return nil, catalog.Invalid(pt, field, "%s exists but has no column %q (%s); drop it, or name another table", k.Name, c.Name, c.Type)
		}
		if typ != c.Type {
			return nil, catalog.Invalid(pt, field, "%s: column %q is %s, but the permanent key needs %s", k.Name, c.Name, typ, c.Type)
		}
	}
	var unique bool
	var names []string
	for _, c := range k.Columns[:k.NKey] {
		names = append(names, c.Name)
	}
	err = q.QueryRow(ctx, `
SELECT EXISTS (
  SELECT 1 FROM pg_index i
  WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indnkeyatts = cardinality($2::text[])
    AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
         WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey[0:i.indnkeyatts - 1]))
        = (SELECT array_agg(n ORDER BY n) FROM unnest($2::text[]) n))`, oid, names).Scan(&unique)
	if err != nil {
		return nil, fmt.Errorf("table %s: read the indexes of %s: %w", t.Name, k.Name, err)
	}
	if !unique {
		return nil, catalog.Invalid(pt, field, "%s exists but has no primary key or unique index on exactly the key columns %q", k.Name, names)
	}
	return k, nil
}

// resolveCitus checks the tiers tables of a distributed table: the side
// table and an existing permanent key table must be hash-distributed on the
// same column and co-located with it, so that demoting a row, or writing
// its key as it is deleted, stays on the row's node; and the permanent key
// must include the distribution column, which Citus requires of the key
// table's primary key. A key table not created yet is created distributed
// (EnsureKeyTable). Tables that exist are never redistributed here:
// that copies their rows, an owner's decision, so the error names the
// statement.
func resolveCitus(ctx context.Context, q catalog.Querier, t *catalog.Table, ti *Tiers) error {
	if !t.Distributed() {
		return nil
	}
	col := t.Citus.Column.Name
	if s := ti.Side; s != nil {
		if err := catalog.Colocated(ctx, q, t, "tiers.payload_table", "payload", s.Name, s.Ident); err != nil {
			return err
		}
	}
	k := ti.Key
	if k == nil {
		return nil
	}
	if !slices.ContainsFunc(k.Columns[:k.NKey], func(c catalog.Column) bool { return c.Name == col }) {
		return catalog.Invalid(t.Policy, "tiers.permanent_key.columns", "the table is distributed on %q, which is not one of the permanent key's columns: the key table is distributed on it like the table, and Citus needs it in the key table's primary key; add %q to the columns", col, col)
	}
	if !k.Exists {
		return nil
	}
	return catalog.Colocated(ctx, q, t, "tiers.permanent_key.table", "permanent key", k.Name, k.Ident)
}
