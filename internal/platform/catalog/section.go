package catalog

import (
	"context"
	"fmt"
	"sync"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
)

// A policy section that a domain package owns (tiering owns tiers) is
// resolved against the catalog when its table is: the domain package
// registers a SectionResolver from init, Resolve runs it, and the table
// keeps what it made (Table.Section) without knowing what it is. The
// catalog stays the generic facts of a table; what a section means, its
// checks and its SQL stay with the package that owns it.

// Resolved is what a SectionResolver made of a table's section.
type Resolved interface {
	// TimeColumns are the table's time columns the section names, for
	// the local-time warnings (WarnLocalTime).
	TimeColumns() []Column
	// ReadColumns are the table's columns the section's statements read
	// (Table.ReadColumns, CheckReadable).
	ReadColumns() []Column
}

// SectionResolver checks t's section against the catalog, cols being the
// table's columns (name → format_type), and returns what it made; nil and
// no error when t's policy has no such section. Its problems are
// ErrInvalid errors (Invalid), reported with the table's others.
type SectionResolver func(ctx context.Context, q Querier, t *Table, cols map[string]string) (Resolved, error)

var sections struct {
	sync.Mutex
	names     []string
	resolvers map[string]SectionResolver
}

// RegisterSection registers the resolver of the policy section name; call
// it from init. Sections resolve in the order they were registered.
func RegisterSection(name string, r SectionResolver) {
	sections.Lock()
	defer sections.Unlock()
	if _, dup := sections.resolvers[name]; dup {
		panic(fmt.Sprintf("catalog: section %q registered twice", name))
	}
	if sections.resolvers == nil {
		sections.resolvers = map[string]SectionResolver{}
	}
	sections.names = append(sections.names, name)
	sections.resolvers[name] = r
}

// Section is what the resolver of section name made of t; nil when t's
// policy has none, or no package registered the section.
func (t *Table) Section(name string) Resolved { return t.sections[name] }

// resolveSections runs every registered resolver on t.
func resolveSections(ctx context.Context, q Querier, t *Table, cols map[string]string) error {
	sections.Lock()
	names, resolvers := sections.names, sections.resolvers
	sections.Unlock()
	for _, name := range names {
		r, err := resolvers[name](ctx, q, t, cols)
		if err != nil {
			return err
		}
		if r != nil {
			if t.sections == nil {
				t.sections = map[string]Resolved{}
			}
			t.sections[name] = r
		}
	}
	return nil
}

// Invalid is a problem of table pt's policy field against the catalog
// (ErrInvalid), worded as every other: "table NAME: FIELD: what".
func Invalid(pt policy.Table, field, format string, args ...any) error {
	return invalid(pt, field, format, args...)
}

// LookupColumn finds the column name that field of pt's policy names in
// cols (name → format_type); timestamp requires a time column, read as
// the table's time columns are (time_zone, epoch_unit).
func LookupColumn(pt policy.Table, field, name string, cols map[string]string, timestamp bool) (Column, error) {
	return lookupColumn(pt, field, name, cols, timestamp)
}

// Suggest is the hint, for an error, of the column of cols that name most
// likely meant; "" when none is close.
func Suggest(name string, cols map[string]string) string { return suggest(name, cols) }

// Colocated refuses the relation name (canonical, ident quoted) that holds
// what of t's rows, as field of the policy names it, unless Citus
// hash-distributes it on t's distribution column, co-located with t.
func Colocated(ctx context.Context, q Querier, t *Table, field, what, name, ident string) error {
	return colocated(ctx, q, t.Policy, t, field, what, name, ident)
}

// ColumnsOf reads the columns of the relation oid: name → format_type.
func ColumnsOf(ctx context.Context, q Querier, oid uint32) (map[string]string, error) {
	return columnsOf(ctx, q, oid)
}

func columnsOf(ctx context.Context, q Querier, oid uint32) (map[string]string, error) {
	rows, err := q.Query(ctx, `
SELECT attname::text, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, oid)
	if err != nil {
		return nil, err
	}
	cols := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		cols[name] = typ
	}
	return cols, rows.Err()
}

// sectionTimeColumns are the time columns t's sections name, in the order
// the sections were registered.
func (t *Table) sectionTimeColumns() []Column {
	sections.Lock()
	names := sections.names
	sections.Unlock()
	var cs []Column
	for _, name := range names {
		if r := t.sections[name]; r != nil {
			cs = append(cs, r.TimeColumns()...)
		}
	}
	return cs
}
