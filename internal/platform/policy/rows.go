package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"go.yaml.in/yaml/v3"
)

// Which rows of a table the policy manages, and how a framework's table
// keeps time (docs/reference/policy.md, "Framework tables"):
//
//	only_when: {column: status, in: [Handled]}   # only these rows are the policy's
//	windows:                                      # or several windows the filter tells apart
//	  - only_when: {column: state, in: [completed]}
//	    expires_after: {column: finalized_at, after: 24h}
//	  - only_when: {column: state, in: [discarded]}
//	    expires_after: {column: finalized_at, after: 7d}
//	epoch_unit: milliseconds                      # integer time columns hold Unix time
//	delete_referencing: [public."OutboxMessage"]  # rows pointing at a due row go with it
//
// A row the filter leaves out is not the policy's: it is never deleted,
// counted or demoted, whatever its expiry says.

// Filter keeps the policy to the rows whose column holds one of the
// values: written as SQL `column IN ('v1', 'v2')`, with the values as
// literals of the column's type (checked against the database by the
// catalog), so that a partial index with the same predicate applies.
type Filter struct {
	Column string
	In     []string
}

// Window is one retention window of a table with several: its rows (the
// filter) and their expiry.
type Window struct {
	OnlyWhen     Filter
	ExpiresAt    string
	ExpiresAfter *ExpiresAfter
}

// ExpiryOffset is added to the window's expiry column before comparing it
// with now.
func (w Window) ExpiryOffset() time.Duration {
	if w.ExpiresAfter != nil {
		return w.ExpiresAfter.After
	}
	return 0
}

// The units of an integer time column (epoch_unit).
const (
	EpochSeconds      = "seconds"
	EpochMilliseconds = "milliseconds"
)

// Scalar is a YAML scalar read as its text, whatever its tag: `in: [true,
// 3, Handled]` are the values "true", "3" and "Handled".
type Scalar string

// UnmarshalYAML reads any scalar; a list or a mapping is an error.
func (s *Scalar) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("must be a value, not a %s", map[yaml.Kind]string{yaml.MappingNode: "mapping", yaml.SequenceNode: "list"}[n.Kind])
	}
	*s = Scalar(n.Value)
	return nil
}

type rawFilter struct {
	Column string   `yaml:"column"`
	In     []Scalar `yaml:"in"`
}

type rawWindow struct {
	OnlyWhen     *rawFilter       `yaml:"only_when"`
	ExpiresAt    string           `yaml:"expires_at"`
	ExpiresAfter *rawExpiresAfter `yaml:"expires_after"`
}

// filter checks an only_when block (field is its path).
func filter(rf *rawFilter, field string, fail func(field, format string, args ...any)) *Filter {
	f := &Filter{Column: rf.Column}
	if rf.Column == "" {
		fail(field+".column", "required: the column whose values say which rows the policy manages")
	} else if err := checkColumn(rf.Column); err != nil {
		fail(field+".column", "%v", err)
	}
	if len(rf.In) == 0 {
		fail(field+".in", "required: the values of %q whose rows the policy manages (a list)", rf.Column)
	}
	for i, v := range rf.In {
		s := string(v)
		switch {
		case strings.IndexByte(s, 0) >= 0:
			fail(fmt.Sprintf("%s.in[%d]", field, i), "must not contain a NUL byte")
		case slices.Contains(f.In, s):
			fail(fmt.Sprintf("%s.in[%d]", field, i), "%q is listed twice", s)
		default:
			f.In = append(f.In, s)
		}
	}
	return f
}

// expiry checks a pair of expires_at and expires_after (prefix is where
// they are: "" for the table's, "windows[i]." for a window's) and fills
// at and after.
func expiry(prefix, expiresAt string, ea *rawExpiresAfter, fail func(field, format string, args ...any), reported func(field string) bool) (string, *ExpiresAfter) {
	switch {
	case expiresAt != "" && ea != nil:
		fail(prefix+"expires_after", "cannot be combined with expires_at; use one")
	case expiresAt == "" && ea == nil && !reported(prefix+"expires_after"):
		fail(strings.TrimSuffix(prefix, "."), "expires_at or expires_after is required")
	case ea == nil:
		if err := checkColumn(expiresAt); err != nil {
			fail(prefix+"expires_at", "%v", err)
		}
		return expiresAt, nil
	default:
		if ea.Column == "" {
			fail(prefix+"expires_after.column", "required")
		} else if err := checkColumn(ea.Column); err != nil {
			fail(prefix+"expires_after.column", "%v", err)
		}
		if ea.After <= 0 {
			fail(prefix+"expires_after.after", "must be positive")
		}
		return "", &ExpiresAfter{Column: ea.Column, After: time.Duration(ea.After)}
	}
	return "", nil
}

// rows checks what says which rows are the policy's and how their time is
// kept (only_when, windows, epoch_unit, delete_referencing), on t whose
// expiry fields (top level) are already checked when there are no windows.
func rows(rt rawTable, t *Table, fail func(field, format string, args ...any), reported func(field string) bool) {
	if rt.OnlyWhen != nil {
		t.OnlyWhen = filter(rt.OnlyWhen, "only_when", fail)
	}
	switch rt.EpochUnit {
	case "", EpochSeconds, EpochMilliseconds:
		t.EpochUnit = rt.EpochUnit
	default:
		fail("epoch_unit", "%q is not a unit: seconds or milliseconds (of Unix time, in an integer or numeric column)", rt.EpochUnit)
	}
	for i, name := range rt.DeleteReferencing {
		field := fmt.Sprintf("delete_referencing[%d]", i)
		q, err := sqlident.ParseQualifiedName(name)
		switch {
		case err != nil:
			fail(field, "%v", err)
		case q == t.Name:
			fail(field, "is the table itself")
		case slices.Contains(t.DeleteReferencing, q):
			fail(field, "%s is listed twice", q)
		default:
			t.DeleteReferencing = append(t.DeleteReferencing, q)
		}
	}
	if rt.Partitions != nil && (rt.OnlyWhen != nil || len(rt.Windows) > 0) {
		fail("partitions", "cannot be combined with only_when or windows: a partition is retired whole, whatever its rows' values; delete rows one by one instead, or point the policy at the partition that holds only the rows to expire (see docs/reference/policy.md)")
	}
	if rt.Windows != nil {
		windows(rt, t, fail, reported)
	}
}

// windows checks a windows list: each window a filter on one column, their
// values disjoint, one expiry column for all. The table then reads as one
// window that covers them all: its filter the union, its expiry column
// theirs, its offset the shortest (what the table remembers at least).
func windows(rt rawTable, t *Table, fail func(field, format string, args ...any), reported func(field string) bool) {
	switch {
	case rt.ExpiresAt != "" || rt.ExpiresAfter != nil:
		fail("windows", "cannot be combined with a top-level expires_at or expires_after: each window says when its rows expire")
		return
	case rt.OnlyWhen != nil:
		fail("windows", "cannot be combined with a top-level only_when: each window has its own")
		return
	case len(rt.Windows) < 2:
		fail("windows", "needs at least two windows; for one, write only_when and the expiry at the top level")
		return
	}
	owner := map[string]int{}
	union := &Filter{}
	for i, rw := range rt.Windows {
		prefix := fmt.Sprintf("windows[%d].", i)
		var w Window
		w.ExpiresAt, w.ExpiresAfter = expiry(prefix, rw.ExpiresAt, rw.ExpiresAfter, fail, reported)
		if rw.OnlyWhen == nil {
			fail(prefix+"only_when", "required: the rows of this window")
			continue
		}
		w.OnlyWhen = *filter(rw.OnlyWhen, prefix+"only_when", fail)
		switch {
		case union.Column == "":
			union.Column = w.OnlyWhen.Column
		case w.OnlyWhen.Column != union.Column:
			fail(prefix+"only_when.column", "%q differs from the first window's %q: windows are told apart by the values of one column", w.OnlyWhen.Column, union.Column)
		}
		for _, v := range w.OnlyWhen.In {
			if j, dup := owner[v]; dup {
				fail(prefix+"only_when.in", "%q is already in windows[%d]: a row belongs to one window", v, j)
				continue
			}
			owner[v] = i
			union.In = append(union.In, v)
		}
		if len(t.Windows) > 0 && w.ExpiryColumn() != t.Windows[0].ExpiryColumn() {
			fail(prefix+"expires_after", "the expiry column %q differs from the first window's %q: the windows of a table share one expiry column (and its index)", w.ExpiryColumn(), t.Windows[0].ExpiryColumn())
		}
		t.Windows = append(t.Windows, w)
	}
	if len(t.Windows) == 0 {
		return
	}
	t.OnlyWhen = union
	shortest := t.Windows[0]
	for _, w := range t.Windows[1:] {
		if w.ExpiryOffset() < shortest.ExpiryOffset() {
			shortest = w
		}
	}
	t.ExpiresAt, t.ExpiresAfter = shortest.ExpiresAt, shortest.ExpiresAfter
}

// ExpiryColumn is the column the window's expiry compares.
func (w Window) ExpiryColumn() string {
	if w.ExpiresAfter != nil {
		return w.ExpiresAfter.Column
	}
	return w.ExpiresAt
}

// Find is the policy's table that name (written as in SQL) names: an
// error names the file, and the table the name most likely meant, in the
// spelling that names it (a name typed without quotes folds to lower case:
// public.InboxState is public.inboxstate, and public."InboxState" is meant).
func (p *Policy) Find(name string) (*Table, error) {
	q, err := sqlident.ParseQualifiedName(name)
	if err != nil {
		return nil, err
	}
	if t := p.Table(q.String()); t != nil {
		return t, nil
	}
	var names []sqlident.QualifiedName
	for _, t := range p.Tables {
		names = append(names, t.Name)
	}
	hint := ""
	if c, ok := sqlident.ClosestTable(q, names); ok {
		hint = fmt.Sprintf("; did you mean %s?", c)
		if strings.EqualFold(c.String(), q.String()) || strings.EqualFold(c.Schema+"."+c.Name, q.Schema+"."+q.Name) {
			hint += " (a name without quotes folds to lower case: quote the parts that have capitals)"
		}
	}
	return nil, fmt.Errorf("%s: not in the policy file %s%s", q, p.Source, hint)
}
