package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// The rows a policy manages, as the frameworks lay their tables out: a
// filter on a status column (only_when), several retention windows told
// apart by it, time kept as Unix time in integers (epoch_unit), and rows
// other tables point at by foreign key. See docs/design/frameworks.md.

// Filter is the policy's only_when, resolved: the column, and its values
// as the column's type reads them back (so "TRUE" and "true" are one).
type Filter struct {
	Column Column
	In     []string
}

// SQL is the filter over alias: `alias.col IN ('v1', 'v2')`, the values
// as literals the column's type coerces (no parameters: a partial index
// whose predicate is the same, or is implied, applies to every statement,
// whatever plan the statement gets).
func (f *Filter) SQL(alias string) string {
	ref := f.Column.Quoted
	if alias != "" {
		ref = alias + "." + ref
	}
	lits := make([]string, len(f.In))
	for i, v := range f.In {
		lits[i] = sqlident.QuoteLiteral(v)
	}
	return ref + " IN (" + strings.Join(lits, ", ") + ")"
}

// Window is one retention window of a table with several: its rows and how
// long after the expiry column they go.
type Window struct {
	Filter *Filter
	Policy policy.Window
}

// Label names the window in results, logs and status: the filter's values.
func (w Window) Label() string {
	return w.Filter.Column.Name + " in (" + strings.Join(w.Filter.In, ", ") + ")"
}

// Reference is a foreign key of another table that points at this one.
type Reference struct {
	Constraint string // the constraint's name
	Table      string // the referencing table, canonical spelling
	Ident      string // quoted, for SQL text
	// Columns are the referencing columns (quoted), and Referenced the
	// columns of this table they point at, in the same order.
	Columns    []string
	Referenced []Column
	// Blocks: deleting a row it points at fails (ON DELETE NO ACTION or
	// RESTRICT); otherwise the delete cascades, or sets the reference to
	// NULL or its default.
	Blocks bool
	// Delete: the policy's delete_referencing names the table, so that its
	// rows pointing at a due row are deleted with it.
	Delete bool
	// Indexed: an index of the referencing table leads with its columns.
	// Without one, every row deleted here scans that table (the foreign
	// key's own check does).
	Indexed bool
}

// Match is the SQL join of the reference's rows (alias c) with this
// table's row (alias).
func (r Reference) Match(c, alias string) string {
	var on []string
	for i, col := range r.Columns {
		on = append(on, c+"."+col+" = "+alias+"."+r.Referenced[i].Quoted)
	}
	return strings.Join(on, " AND ")
}

// Only is the SQL condition, over alias, of a row the policy manages: its
// filter, or "true".
func (t *Table) Only(alias string) string {
	if t.Filter == nil {
		return "true"
	}
	return t.Filter.SQL(alias)
}

// Referenced is the SQL condition, over alias, of a row another table's
// foreign key points at and would keep from being deleted (a blocking
// reference the policy does not delete first); "false" when there is none.
func (t *Table) Referenced(alias string) string {
	var ps []string
	for i, r := range t.References {
		if r.Blocks && !r.Delete {
			c := fmt.Sprintf("r%d", i)
			ps = append(ps, fmt.Sprintf("EXISTS (SELECT 1 FROM %s %s WHERE %s)", r.Ident, c, r.Match(c, alias)))
		}
	}
	if len(ps) == 0 {
		return "false"
	}
	return "(" + strings.Join(ps, " OR ") + ")"
}

// Deletable is the SQL condition, over alias, of a row the policy manages
// that nothing else keeps (Only, and not Referenced): every statement that
// deletes or counts due rows adds it to its expiry and holds.
func (t *Table) Deletable(alias string) string {
	only, ref := t.Only(alias), t.Referenced(alias)
	switch {
	case ref == "false":
		return only
	case only == "true":
		return "NOT " + ref
	}
	return only + " AND NOT " + ref
}

// HasReferences reports whether a row of t may be kept by a reference.
func (t *Table) HasReferences() bool {
	return slices.ContainsFunc(t.References, func(r Reference) bool { return r.Blocks && !r.Delete })
}

// DeletesFirst are the references whose rows a batch deletes first
// (delete_referencing).
func (t *Table) DeletesFirst() []Reference {
	var out []Reference
	for _, r := range t.References {
		if r.Delete {
			out = append(out, r)
		}
	}
	return out
}

// Window returns the table as one of its windows sees it: its filter, its
// expiry, its label (Label), and no other window. A table without windows
// is its own only window.
func (t *Table) Window(i int) *Table {
	if len(t.Windows) == 0 {
		return t
	}
	w := t.Windows[i]
	c := *t
	c.Windows = nil
	c.Filter = w.Filter
	c.Policy.OnlyWhen = &policy.Filter{Column: w.Filter.Column.Name, In: w.Filter.In}
	c.Policy.Windows = nil
	c.Policy.ExpiresAt, c.Policy.ExpiresAfter = w.Policy.ExpiresAt, w.Policy.ExpiresAfter
	c.WindowLabel = w.Label()
	return &c
}

// ExpiryInstant is SQL for a row's expiry instant (the expiry column as a
// timestamptz, plus its window's offset), over alias: NULL for a row no
// window manages.
func (t *Table) ExpiryInstant(alias string, micros func(time.Duration) string) string {
	at := func(off time.Duration) string {
		e := t.Expiry.AsTimestamptz(alias)
		if off != 0 {
			e = "(" + e + " + " + micros(off) + ")"
		}
		return e
	}
	if len(t.Windows) == 0 {
		if t.Filter != nil {
			return "(CASE WHEN " + t.Only(alias) + " THEN " + at(t.Policy.ExpiryOffset()) + " END)"
		}
		return at(t.Policy.ExpiryOffset())
	}
	var b strings.Builder
	b.WriteString("(CASE")
	for _, w := range t.Windows {
		fmt.Fprintf(&b, " WHEN %s THEN %s", w.Filter.SQL(alias), at(w.Policy.ExpiryOffset()))
	}
	b.WriteString(" END)")
	return b.String()
}

// isEpochType reports whether a column of type typ can hold Unix time.
func isEpochType(typ string) bool {
	b := baseType(typ)
	return b == "bigint" || b == "integer" || strings.HasPrefix(typ, "numeric")
}

// epochOf turns the timestamptz expr into the column's Unix time, rounded
// by round (floor: never after expr; ceil: never before it) for an integer
// column, exact for a numeric one. The column is compared with this
// computed bound, never converted itself, so the comparison stays on the
// column's own index. Infinite bounds (the keyset's first) become the
// integer's extremes.
func (c Column) epochOf(expr, round string) string {
	v := "extract(epoch FROM " + expr + ")"
	if c.Epoch == policy.EpochMilliseconds {
		v += " * 1000"
	}
	if strings.HasPrefix(c.Type, "numeric") {
		return "(" + v + ")"
	}
	return "(CASE WHEN isfinite(" + expr + ") THEN " + round + "(" + v + ")::bigint WHEN " + expr + " < 'epoch' THEN '-9223372036854775808'::bigint ELSE '9223372036854775807'::bigint END)"
}

// timestamptzOf reads ref, Unix time in the column's unit, as a
// timestamptz.
func (c Column) timestamptzOf(ref string) string {
	if c.Epoch == policy.EpochMilliseconds {
		return "to_timestamp((" + ref + ")::float8 / 1000)"
	}
	return "to_timestamp((" + ref + ")::float8)"
}

// checkEpochUnit refuses an epoch_unit that no time column of the table
// uses: the policy would say something the catalog does not.
func checkEpochUnit(pt policy.Table, t *Table) error {
	if pt.EpochUnit == "" {
		return nil
	}
	for _, c := range []*Column{&t.Expiry, t.EventTime, t.FirstSeen} {
		if c != nil && c.Epoch != "" {
			return nil
		}
	}
	if t.Expiry.Name == "" {
		return nil // the expiry column is reported already
	}
	return invalid(pt, "epoch_unit", "no time column the policy names is an integer or numeric column (the expiry column %q is %s): remove epoch_unit", t.Expiry.Name, t.Expiry.Type)
}

// resolveRows checks only_when and windows: the column exists, and each
// value is one the column can hold (as PostgreSQL casts it), kept as the
// column reads it back; two windows may not share a value.
func resolveRows(ctx context.Context, q Querier, t *Table, cols map[string]string) error {
	pt := t.Policy
	if len(pt.Windows) == 0 {
		if pt.OnlyWhen != nil {
			f, err := resolveFilter(ctx, q, t, "only_when", *pt.OnlyWhen, cols)
			if err != nil {
				return err
			}
			t.Filter = f
		}
		return nil
	}
	var errs []error
	owner := map[string]int{}
	union := &Filter{}
	for i, pw := range pt.Windows {
		field := fmt.Sprintf("windows[%d].only_when", i)
		f, err := resolveFilter(ctx, q, t, field, pw.OnlyWhen, cols)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				return err
			}
			errs = append(errs, err)
			continue
		}
		for _, v := range f.In {
			if j, dup := owner[v]; dup {
				errs = append(errs, invalid(pt, field+".in", "%q is windows[%d]'s too, as column %q reads it: a row belongs to one window", v, j, f.Column.Name))
			}
			owner[v] = i
		}
		union.Column = f.Column
		union.In = append(union.In, f.In...)
		t.Windows = append(t.Windows, Window{Filter: f, Policy: pw})
	}
	t.Filter = union
	return errors.Join(errs...)
}

func resolveFilter(ctx context.Context, q Querier, t *Table, field string, pf policy.Filter, cols map[string]string) (*Filter, error) {
	c, err := lookupColumn(t.Policy, field+".column", pf.Column, cols, false)
	if err != nil {
		return nil, err
	}
	f := &Filter{Column: c}
	var errs []error
	for i, v := range pf.In {
		// The column's own cast says what the value means: 'TRUE' for a
		// boolean, ' 7' for an integer, 'abc' for an enum without it.
		var norm string
		err := q.QueryRow(ctx, fmt.Sprintf("SELECT CAST(CAST($1 AS text) AS %s)::text", c.Type), v).Scan(&norm)
		var pgErr interface{ SQLState() string }
		switch {
		case errors.As(err, &pgErr):
			errs = append(errs, invalid(t.Policy, fmt.Sprintf("%s.in[%d]", field, i), "%q is not a value of column %q (%s): %v", v, c.Name, c.Type, err))
			continue
		case err != nil:
			return nil, fmt.Errorf("table %s: read the values of %s: %w", t.Name, field, err)
		case slices.Contains(f.In, norm):
			errs = append(errs, invalid(t.Policy, fmt.Sprintf("%s.in[%d]", field, i), "%q is listed already (column %q reads it as %q)", v, c.Name, norm))
			continue
		}
		f.In = append(f.In, norm)
	}
	return f, errors.Join(errs...)
}

// resolveReferences reads the foreign keys that point at t, and checks
// that every table delete_referencing names has one.
func resolveReferences(ctx context.Context, q Querier, t *Table) error {
	rows, err := q.Query(ctx, `
SELECT c.conname::text, format('%I.%I', n.nspname, r.relname), n.nspname::text, r.relname::text, c.confdeltype IN ('a', 'r'),
       ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(num, o)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.num ORDER BY k.o),
       ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(num, o)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.num ORDER BY k.o),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.conrelid AND i.indisvalid AND i.indpred IS NULL
               AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] <@ c.conkey)
FROM pg_constraint c
JOIN pg_class r ON r.oid = c.conrelid
JOIN pg_namespace n ON n.oid = r.relnamespace
WHERE c.contype = 'f' AND c.confrelid = $1 AND c.conparentid = 0
ORDER BY 2, 1`, t.OID)
	if err != nil {
		return fmt.Errorf("table %s: read the foreign keys that reference it: %w", t.Name, err)
	}
	var names []sqlident.QualifiedName
	_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		var r Reference
		var schema, name string
		var cols, refs []string
		if err := row.Scan(&r.Constraint, &r.Ident, &schema, &name, &r.Blocks, &cols, &refs, &r.Indexed); err != nil {
			return struct{}{}, err
		}
		q := sqlident.QualifiedName{Schema: schema, Name: name}
		r.Table, r.Ident = q.String(), q.Sanitize()
		r.Delete = slices.Contains(t.Policy.DeleteReferencing, q)
		for i, c := range cols {
			r.Columns = append(r.Columns, sqlident.QuoteIdent(c))
			k := slices.IndexFunc(t.Key, func(k Column) bool { return k.Name == refs[i] })
			if k >= 0 {
				r.Referenced = append(r.Referenced, t.Key[k])
			} else {
				r.Referenced = append(r.Referenced, Column{Name: refs[i], Quoted: sqlident.QuoteIdent(refs[i])})
			}
		}
		names = append(names, q)
		t.References = append(t.References, r)
		return struct{}{}, nil
	})
	if err != nil {
		return fmt.Errorf("table %s: read the foreign keys that reference it: %w", t.Name, err)
	}
	var errs []error
	for i, d := range t.Policy.DeleteReferencing {
		if slices.Contains(names, d) {
			continue
		}
		hint := "no table references it"
		if len(names) > 0 {
			var s []string
			for _, n := range names {
				s = append(s, n.String())
			}
			hint = "the tables that do: " + strings.Join(slices.Compact(s), ", ")
		}
		errs = append(errs, invalid(t.Policy, fmt.Sprintf("delete_referencing[%d]", i), "%s has no foreign key to this table (%s)", d, hint))
	}
	return errors.Join(errs...)
}

// checkExpiryIndex requires an index that serves the expiry order of the
// rows the policy manages: a valid, non-partial btree index leading with
// the expiry column; or, where the planner proves it serves the statement
// shape of a batch's bound (the policy's rows, the expiry column at or
// before a bound, in its order), a partial one whose predicate the filter
// implies, or a composite one leading with the filter's column (one value
// a window). Each window is checked with its own filter.
func checkExpiryIndex(ctx context.Context, q Querier, t *Table) error {
	var indexed bool
	err := q.QueryRow(ctx, `
SELECT EXISTS (
  SELECT 1
  FROM pg_index i
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_am am ON am.oid = ic.relam
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
  WHERE i.indrelid = $1 AND a.attname = $2 AND am.amname = 'btree'
    AND i.indisvalid AND i.indisready AND i.indpred IS NULL)`, t.OID, t.Expiry.Name).Scan(&indexed)
	if err != nil {
		return fmt.Errorf("table %s: read indexes: %w", t.Name, err)
	}
	if indexed {
		return nil
	}
	field := expiryField(t.Policy)
	fix := fmt.Sprintf("CREATE INDEX CONCURRENTLY ON %s (%s)", t.Ident, t.Expiry.Quoted)
	if t.Filter != nil {
		fix += " WHERE " + t.Filter.SQL("")
	}
	b, ok := q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return invalid(t.Policy, field, "no valid, non-partial btree index leads with column %q; create one first, for example: %s", t.Expiry.Name, fix)
	}
	n := max(1, len(t.Windows))
	for i := range n {
		w := t.Window(i)
		plan, err := expiryPlan(ctx, b, w)
		if err != nil {
			return fmt.Errorf("table %s: plan the expiry order: %w", t.Name, err)
		}
		if plan != "" {
			continue
		}
		what := "the rows the policy manages"
		if w.WindowLabel != "" {
			what = "window " + w.WindowLabel
		}
		return invalid(t.Policy, field, "no valid btree index serves the expiry order of %s (column %q%s); create one first, for example: %s",
			what, t.Expiry.Name, map[bool]string{true: ", where " + w.Only(""), false: ""}[w.Filter != nil], fix)
	}
	return nil
}

// expiryPlan asks the planner, with every other way of reading the table
// ruled out, for the shape of a batch's bound on w, and returns the index
// it reads when the plan needs no sort: "" when none serves.
func expiryPlan(ctx context.Context, b interface {
	Begin(context.Context) (pgx.Tx, error)
}, w *Table) (string, error) {
	tx, err := b.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true), set_config('enable_incremental_sort', 'off', true), set_config('jit', 'off', true)`); err != nil {
		return "", err
	}
	var out []byte
	err = tx.QueryRow(ctx, fmt.Sprintf(`EXPLAIN (FORMAT JSON) SELECT t.%[2]s FROM %[1]s t WHERE t.%[2]s <= %[3]s AND %[4]s ORDER BY t.%[2]s LIMIT 2`,
		w.Ident, w.Expiry.Quoted, w.Expiry.Instant("'infinity'::timestamptz"), w.Only("t"))).Scan(&out)
	if err != nil {
		return "", err
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) == 0 {
		return "", fmt.Errorf("read the plan: %w", err)
	}
	index, sorted := plans[0].Plan.walk()
	if sorted {
		return "", nil
	}
	return index, nil
}

type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

// walk returns the index a plan reads and whether any node sorts.
func (p planNode) walk() (index string, sorts bool) {
	if strings.Contains(p.NodeType, "Sort") {
		sorts = true
	}
	if p.NodeType == "Index Scan" || p.NodeType == "Index Only Scan" {
		index = p.IndexName
	}
	for _, c := range p.Plans {
		i, s := c.walk()
		if index == "" {
			index = i
		}
		sorts = sorts || s
	}
	return index, sorts
}

// partitionedAdvice says what to do with a partitioned table the policy
// gives no partitions section: add one where it is range-partitioned on
// the expiry column; else (LIST, HASH, or RANGE on another column) name
// its partitions, which are ordinary tables whose rows are deleted one by
// one.
func partitionedAdvice(ctx context.Context, q Querier, t *Table) (string, error) {
	var strategy string
	var key []string
	var parts []string
	err := q.QueryRow(ctx, `
SELECT p.partstrat::text,
       ARRAY(SELECT coalesce(a.attname::text, '(expression)') FROM unnest(p.partattrs::int2[]) k(num)
             LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.num),
       ARRAY(SELECT format('%I.%I', n.nspname, c.relname) FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE h.inhparent = p.partrelid ORDER BY 1)
FROM pg_partitioned_table p WHERE p.partrelid = $1`, t.OID).Scan(&strategy, &key, &parts)
	if err != nil {
		return "", fmt.Errorf("table %s: read the partition key: %w", t.Name, err)
	}
	by := map[string]string{"l": "LIST", "h": "HASH", "r": "RANGE"}[strategy]
	if strategy == "r" && len(key) == 1 && key[0] == t.Policy.ExpiryColumn() {
		return "is a partitioned table; add a partitions section to the policy (inboxkeeper retires whole partitions; it does not delete rows one by one from partitioned tables)", nil
	}
	list := "it has no partitions yet"
	if len(parts) > 0 {
		shown := parts[:min(len(parts), 5)]
		list = "its partitions: " + strings.Join(shown, ", ")
		if len(parts) > len(shown) {
			list += fmt.Sprintf(" and %d more", len(parts)-len(shown))
		}
	}
	return fmt.Sprintf("is partitioned by %s (%s): inboxkeeper retires only monthly RANGE partitions of the expiry column, and deletes rows one by one only from ordinary tables; name the partitions whose rows expire in the policy instead, each an ordinary table with its own index on the expiry column (%s)",
		by, strings.Join(key, ", "), list), nil
}

// similarTable names the table a policy entry that names none most likely
// meant: one of the same schema, or of the same name in another.
func similarTable(ctx context.Context, q Querier, name sqlident.QualifiedName) (string, error) {
	rows, err := q.Query(ctx, `
SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema'
  AND (lower(n.nspname) = lower($1) OR lower(c.relname) = lower($2))
LIMIT 10000`, name.Schema, name.Name)
	if err != nil {
		return "", err
	}
	var have []sqlident.QualifiedName
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var q sqlident.QualifiedName
		have = append(have, q)
		return struct{}{}, r.Scan(&have[len(have)-1].Schema, &have[len(have)-1].Name)
	})
	if err != nil {
		return "", err
	}
	c, ok := sqlident.ClosestTable(name, have)
	if !ok {
		return "", nil
	}
	hint := fmt.Sprintf("; did you mean %s?", c)
	if strings.EqualFold(c.Schema+"."+c.Name, name.Schema+"."+name.Name) {
		hint += " (unquoted parts of a name fold to lower case: quote the parts that have capitals, as in table: 'public.\"InboxState\"')"
	}
	return hint, nil
}

// ID tells the windows of one table apart (Name, and the window's label),
// for what a service keeps per table and window between batches and
// passes; Name is what results, metrics and holds go by.
func (t *Table) ID() string {
	if t.WindowLabel == "" {
		return t.Name
	}
	return t.Name + " [" + t.WindowLabel + "]"
}

// readRowCosts reads what a deleted row of t costs beyond a plain one's.
func readRowCosts(ctx context.Context, q Querier, t *Table) error {
	err := q.QueryRow(ctx, `
SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = c.oid AND tgenabled <> 'D' AND (tgtype::int & 8) <> 0)::int,
       c.reltoastrelid <> 0 AND pg_relation_size(c.reltoastrelid) > 0
FROM pg_class c WHERE c.oid = $1`, t.OID).Scan(&t.DeleteTriggers, &t.Toasted)
	if err != nil {
		return fmt.Errorf("table %s: read its triggers: %w", t.Name, err)
	}
	return nil
}

// RowCosts says what makes a deleted row of t cost more than a plain
// one's (triggers, foreign key checks, TOAST), for the batch size's probe
// and the log; "" when nothing does.
func (t *Table) RowCosts() string {
	var cs []string
	if t.DeleteTriggers > 0 {
		cs = append(cs, fmt.Sprintf("%d delete triggers (foreign key checks included)", t.DeleteTriggers))
	}
	if t.Toasted {
		cs = append(cs, "TOAST")
	}
	return strings.Join(cs, ", ")
}
