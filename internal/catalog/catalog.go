// Package catalog checks a policy table against the live database catalog
// and describes it for the code that writes SQL: which columns exist, their
// types, and how an expiry instant is compared with them.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/sqlident"
)

// Querier is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Column is a resolved column of a managed table.
type Column struct {
	Name   string // as the catalog spells it
	Type   string // format_type() of the column, typmod included
	Quoted string // ready for SQL text
	// Zone is the IANA zone a timestamp-without-time-zone column is written
	// in (the policy's time_zone, default UTC); "" for any other type.
	Zone string
}

// typmod matches the precision of a timestamp type, as in timestamp(3).
var typmod = regexp.MustCompile(`\(\d+\)`)

// baseType is a format_type() without its precision.
func baseType(typ string) string { return typmod.ReplaceAllString(typ, "") }

// IsTimestamptz reports whether the column is timestamp with time zone, of
// any precision.
func (c Column) IsTimestamptz() bool { return baseType(c.Type) == "timestamp with time zone" }

// isTimestamp reports whether typ is a timestamp of either kind.
func isTimestamp(typ string) bool {
	b := baseType(typ)
	return b == "timestamp with time zone" || b == "timestamp without time zone"
}

// zoneLiteral is the column's zone as an SQL string literal. Zones are
// checked IANA names, but quoting keeps the SQL right whatever they hold.
func (c Column) zoneLiteral() string { return sqlident.QuoteLiteral(c.Zone) }

// Instant returns SQL that turns the timestamptz expression expr into a
// value comparable with this column, so that the comparison stays on the
// column's own index: for a local-time column, the latest wall-clock value
// whose instant is at or before expr. In the hour a daylight-saving change
// repeats, the plain wall clock of expr reads an hour ahead (PostgreSQL takes
// an ambiguous local time as the later instant), so the value is moved back
// by that difference: "col <= Instant(now)" never takes a row early, and
// "col >= Instant(from)" never leaves out a row from `from` on.
func (c Column) Instant(expr string) string {
	if c.Zone == "" {
		return expr
	}
	local := "(" + expr + " AT TIME ZONE " + c.zoneLiteral() + ")"
	// -infinity (the first keyset bound) has no offset to take away.
	return "(CASE WHEN isfinite(" + expr + ") THEN " + local + " - ((" + local + " AT TIME ZONE " + c.zoneLiteral() + ") - " + expr + ") ELSE " + local + " END)"
}

// InstantAbove is Instant for an exclusive upper bound ("col < X"): the
// plain wall clock of expr, which is never below the exact bound, so a
// range ending at expr keeps every row before it.
func (c Column) InstantAbove(expr string) string {
	if c.Zone == "" {
		return expr
	}
	return "(" + expr + " AT TIME ZONE " + c.zoneLiteral() + ")"
}

// AsTimestamptz returns SQL reading this column (qualified by alias when
// given) as a timestamptz.
func (c Column) AsTimestamptz(alias string) string {
	ref := c.Quoted
	if alias != "" {
		ref = alias + "." + ref
	}
	if c.Zone == "" {
		return ref
	}
	return "(" + ref + " AT TIME ZONE " + c.zoneLiteral() + ")"
}

// lookupColumn finds a column the policy names in cols (name to
// format_type); timestamp requires a timestamp type.
func lookupColumn(pt policy.Table, field, name string, cols map[string]string, timestamp bool) (Column, error) {
	typ, ok := cols[name]
	if !ok {
		return Column{}, invalid(pt, field, "column %q does not exist%s", name, suggest(name, cols))
	}
	c := Column{Name: name, Type: typ, Quoted: sqlident.QuoteIdent(name)}
	if baseType(typ) == "timestamp without time zone" {
		c.Zone = pt.Zone()
	}
	if timestamp && !isTimestamp(typ) {
		return c, invalid(pt, field, "column %q is %s; it must be timestamptz (or timestamp, read in the table's time_zone, UTC by default)", name, typ)
	}
	return c, nil
}

// Table is a policy table as it exists in the database.
type Table struct {
	Policy    policy.Table
	Name      string // canonical spelling, the key for holds and metrics
	Ident     string // quoted, for SQL text
	OID       uint32
	Kind      string // "r" ordinary, "p" partitioned
	Key       []Column
	Expiry    Column
	Scope     *Column
	EventTime *Column
	FirstSeen *Column // the first-receipt column, for the retention rule
	Tiers     *Tiers  // the tiers section, resolved (tiers.go); nil without one
	// Citus is set when the table is hash-distributed by Citus (the
	// database is a coordinator); nil for an ordinary table.
	Citus *Distribution
	// InCitusMetadata is set when Citus has the table in its metadata: a
	// distributed table, or a reference or Citus local table (Citus is nil
	// for those). DDL on such a table goes through Citus, which refuses
	// some statements PostgreSQL allows (DETACH PARTITION ... CONCURRENTLY).
	InCitusMetadata bool
}

// TimeColumns are the table's timestamp columns the policy names.
func (t *Table) TimeColumns() []Column {
	all := []*Column{&t.Expiry, t.EventTime, t.FirstSeen}
	if t.Tiers != nil {
		all = append(all, &t.Tiers.Anchor)
	}
	var cs []Column
	for _, c := range all {
		if c != nil && !slices.ContainsFunc(cs, func(d Column) bool { return d.Name == c.Name }) {
			cs = append(cs, *c)
		}
	}
	return cs
}

// HasScope and HasEventTime say whether holds may name a scope or a range.
func (t *Table) HasScope() bool { return t.Scope != nil }

// Partitioned reports whether the table is a partitioned parent, managed by
// retiring whole partitions instead of deleting rows.
func (t *Table) Partitioned() bool { return t.Kind == "p" }

func (t *Table) HasEventTime() bool { return t.EventTime != nil }

// ErrInvalid marks problems with the policy against the catalog (a missing
// table, column or index): configuration errors, not runtime failures.
var ErrInvalid = errors.New("policy does not match the database")

func invalid(t policy.Table, field, format string, args ...any) error {
	return fmt.Errorf("%w: table %s: %s: %s", ErrInvalid, t.Name.String(), field, fmt.Sprintf(format, args...))
}

// Resolve looks the table up and checks every column the policy names, and
// that a valid, non-partial btree index leads with the expiry column (without
// it every batch would scan the whole table).
func Resolve(ctx context.Context, q Querier, pt policy.Table) (*Table, error) {
	t := &Table{Policy: pt, Name: pt.Name.String(), Ident: pt.Name.Sanitize()}
	err := q.QueryRow(ctx, `
SELECT c.oid, c.relkind::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, pt.Name.Schema, pt.Name.Name).Scan(&t.OID, &t.Kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, invalid(pt, "table", "no such table in the database (schema %q, name %q)", pt.Name.Schema, pt.Name.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("table %s: look up: %w", t.Name, err)
	}
	switch {
	case t.Kind == "r" && pt.Partitions != nil:
		return nil, invalid(pt, "partitions", "the table is not partitioned; a table managed by partition must be created PARTITION BY RANGE (%s) (see docs/guides/partitions.md), or remove the partitions section to expire rows one by one",
			sqlident.QuoteIdent(pt.ExpiryColumn()))
	case t.Kind == "r":
	case t.Kind == "p" && pt.Partitions == nil:
		return nil, invalid(pt, "table", "is a partitioned table; add a partitions section to the policy (inboxkeeper retires whole partitions; it does not delete rows one by one from partitioned tables)")
	case t.Kind == "p":
	default:
		return nil, invalid(pt, "table", "is not a table (relkind %s)", t.Kind)
	}

	cols := map[string]string{}
	rows, err := q.Query(ctx, `
SELECT attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, t.OID)
	if err != nil {
		return nil, fmt.Errorf("table %s: read columns: %w", t.Name, err)
	}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		cols[name] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("table %s: read columns: %w", t.Name, err)
	}
	column := func(field, name string) (Column, error) { return lookupColumn(pt, field, name, cols, false) }
	timeColumn := func(field, name string) (Column, error) { return lookupColumn(pt, field, name, cols, true) }
	if pt.TimeZone != "" {
		var known bool
		if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = $1)", pt.TimeZone).Scan(&known); err != nil {
			return nil, fmt.Errorf("table %s: look up time zone: %w", t.Name, err)
		}
		if !known {
			return nil, invalid(pt, "time_zone", "%q is not a time zone this PostgreSQL knows (pg_timezone_names)", pt.TimeZone)
		}
	}
	for i, k := range pt.Key {
		c, err := column(fmt.Sprintf("key[%d]", i), k)
		if err != nil {
			return nil, err
		}
		t.Key = append(t.Key, c)
	}
	expiryField := "expires_at"
	if pt.ExpiresAfter != nil {
		expiryField = "expires_after.column"
	}
	if t.Expiry, err = timeColumn(expiryField, pt.ExpiryColumn()); err != nil {
		return nil, err
	}
	if pt.Scope != "" {
		c, err := column("scope", pt.Scope)
		if err != nil {
			return nil, err
		}
		t.Scope = &c
	}
	if pt.EventTime != "" {
		c, err := timeColumn("event_time", pt.EventTime)
		if err != nil {
			return nil, err
		}
		t.EventTime = &c
	}
	if pt.FirstSeen != "" {
		c, err := timeColumn("first_seen", pt.FirstSeen)
		if err != nil {
			return nil, err
		}
		t.FirstSeen = &c
	}
	if err := resolveTiers(ctx, q, t, cols); err != nil {
		return nil, err
	}
	if err := resolveCitus(ctx, q, pt, t, cols); err != nil {
		return nil, err
	}
	if err := resolveCitusTiers(ctx, q, pt, t); err != nil {
		return nil, err
	}

	if t.Partitioned() {
		if t.Expiry.Zone != "" && t.Expiry.Zone != "UTC" {
			return nil, invalid(pt, "time_zone", "monthly partitions are cut in UTC, so a partitioned table's %s column must be timestamptz, or timestamp written in UTC; %q is not supported here",
				t.Expiry.Type, pt.TimeZone)
		}
		// Whole partitions go; no batch walks an expiry index.
		if err := checkPartitioned(ctx, q, t); err != nil {
			return nil, err
		}
		return t, nil
	}
	var indexed bool
	err = q.QueryRow(ctx, `
SELECT EXISTS (
  SELECT 1
  FROM pg_index i
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_am am ON am.oid = ic.relam
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
  WHERE i.indrelid = $1 AND a.attname = $2 AND am.amname = 'btree'
    AND i.indisvalid AND i.indisready AND i.indpred IS NULL)`, t.OID, t.Expiry.Name).Scan(&indexed)
	if err != nil {
		return nil, fmt.Errorf("table %s: read indexes: %w", t.Name, err)
	}
	if !indexed {
		return nil, invalid(pt, expiryField, "no valid btree index leads with column %q; create one first, for example: CREATE INDEX CONCURRENTLY ON %s (%s)",
			t.Expiry.Name, t.Ident, t.Expiry.Quoted)
	}
	return t, nil
}

// suggest names a column that differs only in case, the most common slip
// when mapping framework tables with quoted mixed-case names.
func suggest(name string, cols map[string]string) string {
	for c := range cols {
		if strings.EqualFold(c, name) {
			return fmt.Sprintf(" (did you mean %q? column names are exact)", c)
		}
	}
	return ""
}
