// Package catalog checks a policy table against the live database catalog
// and describes it for the code that writes SQL: which columns exist, their
// types, and how an expiry instant is compared with them.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
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
	// Epoch is the unit of Unix time an integer or numeric time column
	// holds (the policy's epoch_unit: policy.EpochSeconds or
	// policy.EpochMilliseconds); "" for a timestamp.
	Epoch string
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
	if c.Epoch != "" {
		return c.epochOf(expr, "floor")
	}
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
	if c.Epoch != "" {
		return c.epochOf(expr, "ceil")
	}
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
	if c.Epoch != "" {
		return c.timestamptzOf(ref)
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
	switch {
	case !timestamp || isTimestamp(typ):
	case isEpochType(typ) && pt.EpochUnit != "":
		c.Epoch = pt.EpochUnit
	case isEpochType(typ):
		return c, invalid(pt, field, "column %q is %s; a time column is timestamptz (or timestamp, read in the table's time_zone, UTC by default), or Unix time in an integer or numeric column with epoch_unit set (seconds or milliseconds)", name, typ)
	default:
		return c, invalid(pt, field, "column %q is %s; it must be timestamptz (or timestamp, read in the table's time_zone, UTC by default, or Unix time in an integer or numeric column, with epoch_unit)", name, typ)
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
	// sections are what the domain packages made of the policy
	// sections they own (section.go: tiering's tiers).
	sections map[string]Resolved
	// Citus is set when the table is hash-distributed by Citus (the
	// database is a coordinator); nil for an ordinary table.
	Citus *Distribution
	// InCitusMetadata is set when Citus has the table in its metadata: a
	// distributed table, or a reference or Citus local table (Citus is nil
	// for those). DDL on such a table goes through Citus, which refuses
	// some statements PostgreSQL allows (DETACH PARTITION ... CONCURRENTLY).
	InCitusMetadata bool
	// CitusReference is set for a Citus reference table. Citus keeps its
	// copies in step by locking the whole table for every session that
	// writes to it or locks a row of it (a lock on its shard), so a batch
	// waits for such a session whichever rows the two touch.
	CitusReference bool
	// Filter keeps the policy to some rows (only_when; with Windows, the
	// union of theirs); nil: every row (rows.go).
	Filter *Filter
	// Windows are the table's retention windows when it has several
	// (Window(i) is the table as one of them sees it); nil: one.
	Windows []Window
	// WindowLabel names the window this table is (Window): "" for a table
	// seen whole.
	WindowLabel string
	// References are the foreign keys of other tables that point at this
	// one.
	References []Reference
	// DeleteTriggers are the triggers a DELETE of its rows fires (the
	// table's own, and the foreign key checks of the tables that
	// reference it), and Toasted says its rows have values in TOAST: what
	// makes a deleted row cost more than a plain one (RowCosts).
	DeleteTriggers int
	Toasted        bool
}

// TimeColumns are the table's timestamp columns the policy names.
func (t *Table) TimeColumns() []Column {
	all := []*Column{&t.Expiry, t.EventTime, t.FirstSeen}
	for _, c := range t.sectionTimeColumns() {
		all = append(all, &c)
	}
	var cs []Column
	for _, c := range all {
		if c != nil && !slices.ContainsFunc(cs, func(d Column) bool { return d.Name == c.Name }) {
			cs = append(cs, *c)
		}
	}
	return cs
}

// ReadColumns are the columns of the table the daemon's statements read:
// those the policy names (key, expiry, scope, event time, first seen,
// only_when's and the windows', and its sections': the tiers' anchor,
// payload and permanent key), each once, and ctid, by which a batch
// deletes the rows it picked. A role granted SELECT on fewer columns
// (deploy/sql/role.sql's private_columns) must still have these.
func (t *Table) ReadColumns() []string {
	cols := []string{"ctid"}
	add := func(cs ...*Column) {
		for _, c := range cs {
			if c != nil && !slices.Contains(cols, c.Name) {
				cols = append(cols, c.Name)
			}
		}
	}
	for i := range t.Key {
		add(&t.Key[i])
	}
	add(&t.Expiry, t.Scope, t.EventTime, t.FirstSeen)
	if t.Filter != nil {
		add(&t.Filter.Column)
	}
	for _, w := range t.Windows {
		if w.Filter != nil {
			add(&w.Filter.Column)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.sections)) {
		for _, c := range t.sections[name].ReadColumns() {
			add(&c)
		}
	}
	return cols
}

// CheckReadable fails before any statement on t when this role may not
// read a column those statements read (ReadColumns): a SELECT granted
// column by column that leaves one out would otherwise fail each batch
// with PostgreSQL's "permission denied for table", which names no column.
// The error wraps retry.ErrPrivilege.
func CheckReadable(ctx context.Context, q Querier, t *Table) error {
	return CheckColumns(ctx, q, t.Name, t.OID, t.ReadColumns())
}

// CheckColumns is CheckReadable for the columns cols of the relation
// name (oid).
func CheckColumns(ctx context.Context, q Querier, name string, oid uint32, cols []string) error {
	missing, err := Unreadable(ctx, q, oid, cols)
	if err != nil {
		return fmt.Errorf("could not read which columns of %s this role may read: %w", name, err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("permission denied: this role may not read %s of %s, which inboxkeeper's statements on it read "+
			"(of the columns the policy names, and ctid); where SELECT is granted by column (deploy/sql/role.sql's private_columns), "+
			"leave them out of the private ones: GRANT SELECT (%s) ON %s TO <this role> (%w)",
			strings.Join(missing, ", "), name, strings.Join(quoteAll(missing), ", "), name, retry.ErrPrivilege)
	}
	return nil
}

// Unreadable are the columns of cols (of the relation oid) this role may
// not SELECT, in their order.
func Unreadable(ctx context.Context, q Querier, oid uint32, cols []string) ([]string, error) {
	var missing []string
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(c ORDER BY o), '{}') FROM unnest($2::text[]) WITH ORDINALITY u(c, o)
WHERE NOT has_column_privilege($1::oid, c, 'SELECT')`, oid, cols).Scan(&missing)
	return missing, err
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = pgx.Identifier{n}.Sanitize()
	}
	return out
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

// Resolve looks the table up and checks every column the policy names, the
// rows it manages (only_when, windows, epoch_unit, references: rows.go),
// and that a valid btree index serves its expiry order (without it every
// batch would scan the whole table). Every problem of the table is
// reported at once (errors.Join of ErrInvalid errors); a check that needs
// what failed before it is skipped.
func Resolve(ctx context.Context, q Querier, pt policy.Table) (*Table, error) {
	t := &Table{Policy: pt, Name: pt.Name.String(), Ident: pt.Name.Sanitize()}
	err := q.QueryRow(ctx, `
SELECT c.oid, c.relkind::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, pt.Name.Schema, pt.Name.Name).Scan(&t.OID, &t.Kind)
	if errors.Is(err, pgx.ErrNoRows) {
		hint, err := similarTable(ctx, q, pt.Name)
		if err != nil {
			return nil, fmt.Errorf("table %s: look up: %w", t.Name, err)
		}
		return nil, invalid(pt, "table", "no such table in the database (schema %q, name %q)%s", pt.Name.Schema, pt.Name.Name, hint)
	}
	if err != nil {
		return nil, fmt.Errorf("table %s: look up: %w", t.Name, err)
	}
	var bad problems
	switch {
	case t.Kind == "r" && pt.Partitions != nil:
		bad.add(invalid(pt, "partitions", "the table is not partitioned; a table managed by partition must be created PARTITION BY RANGE (%s) (see docs/guides/partitions.md), or remove the partitions section to expire rows one by one",
			sqlident.QuoteIdent(pt.ExpiryColumn())))
	case t.Kind == "r":
	case t.Kind == "p" && pt.Partitions == nil:
		advice, err := partitionedAdvice(ctx, q, t)
		if err != nil {
			return nil, err
		}
		bad.add(invalid(pt, "table", "%s", advice))
	case t.Kind == "p":
	default:
		return nil, invalid(pt, "table", "is not a table (relkind %s)", t.Kind)
	}

	cols, err := columnsOf(ctx, q, t.OID)
	if err != nil {
		return nil, fmt.Errorf("table %s: read columns: %w", t.Name, err)
	}
	column := func(field, name string) *Column {
		c, err := lookupColumn(pt, field, name, cols, false)
		if !bad.add(err) {
			return nil
		}
		return &c
	}
	timeColumn := func(field, name string) *Column {
		c, err := lookupColumn(pt, field, name, cols, true)
		if !bad.add(err) {
			return nil
		}
		return &c
	}
	if pt.TimeZone != "" {
		var known bool
		if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = $1)", pt.TimeZone).Scan(&known); err != nil {
			return nil, fmt.Errorf("table %s: look up time zone: %w", t.Name, err)
		}
		if !known {
			bad.add(invalid(pt, "time_zone", "%q is not a time zone this PostgreSQL knows (pg_timezone_names)", pt.TimeZone))
		}
	}
	keysOK := true
	for i, k := range pt.Key {
		if c := column(fmt.Sprintf("key[%d]", i), k); c != nil {
			t.Key = append(t.Key, *c)
		} else {
			keysOK = false
		}
	}
	expiryOK := false
	if c := timeColumn(expiryField(pt), pt.ExpiryColumn()); c != nil {
		t.Expiry, expiryOK = *c, true
	}
	if pt.Scope != "" {
		t.Scope = column("scope", pt.Scope)
	}
	if pt.EventTime != "" {
		t.EventTime = timeColumn("event_time", pt.EventTime)
	}
	if pt.FirstSeen != "" {
		t.FirstSeen = timeColumn("first_seen", pt.FirstSeen)
	}
	if bad.fatal(checkEpochUnit(pt, t)) {
		return nil, bad.err()
	}
	if bad.fatal(resolveRows(ctx, q, t, cols)) || bad.fatal(resolveReferences(ctx, q, t)) {
		return nil, bad.err()
	}
	if !bad.empty() {
		// The checks below read the columns above.
		return nil, bad.err()
	}
	if bad.fatal(resolveCitus(ctx, q, pt, t, cols)) || bad.fatal(resolveSections(ctx, q, t, cols)) {
		return nil, bad.err()
	}
	if t.ThroughCitus() && len(t.DeletesFirst()) > 0 {
		kind := "distributed"
		if !t.Distributed() {
			kind = "reference or Citus local"
		}
		bad.add(invalid(pt, "delete_referencing", "is not supported on a Citus %s table: its batches go through the coordinator as one statement each, without the referencing rows", kind))
	}
	if t.ThroughCitus() && pt.Compact != nil {
		bad.add(invalid(pt, "compact", "is not supported on a Citus table: Citus refuses the moves' row locks (FOR UPDATE SKIP LOCKED) there; compact its shards or copies on each node (VACUUM FULL or pg_repack there)"))
	}

	if t.Partitioned() {
		if t.Expiry.Zone != "" && t.Expiry.Zone != "UTC" {
			bad.add(invalid(pt, "time_zone", "monthly partitions are cut in UTC, so a partitioned table's %s column must be timestamptz, or timestamp written in UTC; %q is not supported here",
				t.Expiry.Type, pt.TimeZone))
		}
		if t.Expiry.Epoch != "" {
			bad.add(invalid(pt, expiryField(pt), "monthly partitions are cut on timestamps: a partitioned table's expiry column must be timestamptz or timestamp, not %s", t.Expiry.Type))
		}
		// Whole partitions go; no batch walks an expiry index.
		if bad.empty() && bad.fatal(checkPartitioned(ctx, q, t)) {
			return nil, bad.err()
		}
		return t, bad.err()
	}
	if keysOK && expiryOK && bad.fatal(checkExpiryIndex(ctx, q, t)) {
		return nil, bad.err()
	}
	if bad.fatal(readRowCosts(ctx, q, t)) {
		return nil, bad.err()
	}
	if !bad.empty() {
		return nil, bad.err()
	}
	return t, nil
}

// expiryField is the policy field that names the expiry column.
func expiryField(pt policy.Table) string {
	switch {
	case len(pt.Windows) > 0:
		return "windows[0]." + expiryField(policy.Table{ExpiresAt: pt.Windows[0].ExpiresAt, ExpiresAfter: pt.Windows[0].ExpiresAfter})
	case pt.ExpiresAfter != nil:
		return "expires_after.column"
	}
	return "expires_at"
}

// problems collects a table's catalog problems, so that one run reports
// them all.
type problems struct{ errs []error }

// add records err when it is a problem (ErrInvalid) and says whether
// there was none; any other error is recorded too (fatal says so).
func (p *problems) add(err error) bool {
	if err == nil {
		return true
	}
	p.errs = append(p.errs, err)
	return false
}

// fatal records err and says whether the checks must stop: an error that
// is not a problem of the policy (the database failed us).
func (p *problems) fatal(err error) bool {
	if err == nil {
		return false
	}
	if !errors.Is(err, ErrInvalid) {
		p.errs = []error{err}
		return true
	}
	p.errs = append(p.errs, err)
	return false
}

func (p *problems) empty() bool { return len(p.errs) == 0 }

// err is every problem, joined (nil: none). A failure of the database
// comes alone.
func (p *problems) err() error { return errors.Join(p.errs...) }

// suggest names the column that name most likely meant: one that differs
// only in case (the most common slip when mapping framework tables with
// quoted mixed-case names, or folded unquoted ones), or a near miss.
func suggest(name string, cols map[string]string) string {
	c, ok := sqlident.Closest(name, slices.Collect(maps.Keys(cols)))
	if !ok {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q? column names are exact)", c)
}
