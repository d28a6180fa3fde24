// Package strictyaml decodes a YAML configuration file more strictly than
// yaml.v3's KnownFields: unknown fields, fields set twice, merge keys (<<)
// and a second document are errors, and every error names the file, the
// line, the entry and the field. It reports every problem in one go. It is
// daemon internals: the policy file and its retention section use it.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// New starts a decoder for a file; source names it in messages.
func New(source string) *Decoder { return &Decoder{source: source, lines: map[string]int{}} }

// Document parses data as exactly one YAML document and returns its root
// node, or nil when the file is empty.
func (d *Decoder) Document(data []byte) (*yaml.Node, error) { return d.document(data) }

// Decode decodes n into *v strictly (unknown fields, fields set twice and
// merge keys are errors). ctx names the entry in messages, e.g.
// "retention[0] (payments)". It reports whether n decoded cleanly.
func (d *Decoder) Decode(n *yaml.Node, v any, ctx string) bool {
	return d.decode(n, reflect.ValueOf(v).Elem(), ctx, "")
}

// DecodeEntry decodes n, entry i of the list named list, into *v as Decode
// does. It returns the name messages give the entry, ctx: "tables[2]", or
// "tables[2] (public.inbox)" with the text of the entry's key field, which
// is read before decoding so that a bad entry is named too.
func (d *Decoder) DecodeEntry(n *yaml.Node, v any, list string, i int, key string) (ctx string, ok bool) {
	ctx = fmt.Sprintf("%s[%d]", list, i)
	if text := scalarField(n, key); text != "" {
		ctx += " (" + text + ")"
	}
	return ctx, d.Decode(n, v, ctx)
}

// Errorf records an error about field (a path such as "paths[2].stages[0].from")
// of the entry ctx, on the line where that field, or the nearest enclosing
// one, was written; fallback is used when none was.
func (d *Decoder) Errorf(fallback int, ctx, field, format string, args ...any) {
	d.errorf(d.line(ctx, field, fallback), joinWhere(ctx, field), format, args...)
}

// ErrorAt records an error at a known line (0: none) about where.
func (d *Decoder) ErrorAt(line int, where, format string, args ...any) {
	d.errorf(line, where, format, args...)
}

// Reported reports whether an error was recorded about field of the entry
// ctx, or about a field it is part of: checks after decoding skip a field
// whose value did not decode, rather than say the same twice.
func (d *Decoder) Reported(ctx, field string) bool {
	for field != "" {
		if d.reported[joinWhere(ctx, field)] {
			return true
		}
		field = field[:max(0, strings.LastIndexAny(field, ".["))]
	}
	return false
}

// Count is how many errors were recorded so far.
func (d *Decoder) Count() int { return len(d.errs) }

// Err returns every error recorded, in file order, or nil.
func (d *Decoder) Err() error { return d.err() }

// KindName names what a node holds, for messages: "a mapping", "a list" or
// its quoted text.
func KindName(n *yaml.Node) string { return kindName(n) }

// Decoder does the work of yaml's KnownFields but keeps the entry and field
// path for every message, and carries on past a bad entry or field so one
// run shows most mistakes. Errors read "file:line: entry: field: problem"
// and come out all at once, in file order (Err).
type Decoder struct {
	source   string
	errs     []fileError
	lines    map[string]int  // where → line of its key, for checks after decoding
	reported map[string]bool // where an error was recorded
}

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	keySetType      = reflect.TypeFor[KeySet]()
)

// KeySet is a mapping whose keys are known only when the program runs (a
// table of tunables, say), decoded as strictly as a struct's fields: an
// unknown or repeated key is an error naming it. It is a map type from
// string; its Keys method is called on the nil map. A key given null is
// left out; Fields lists every key.
type KeySet interface{ Keys() []string }

func (d *Decoder) errorf(line int, where, format string, args ...any) {
	if d.reported == nil {
		d.reported = map[string]bool{}
	}
	d.reported[where] = true
	loc := d.source
	if line > 0 {
		loc += ":" + strconv.Itoa(line)
	}
	if where != "" {
		loc += ": " + where
	}
	d.errs = append(d.errs, fileError{line, fmt.Errorf("%s: %s", loc, fmt.Sprintf(format, args...))})
}

type fileError struct {
	line int
	err  error
}

// line finds where field was written; a missing field is reported on the
// line of the nearest enclosing one, or of its table.
func (d *Decoder) line(ctx, field string, fallback int) int {
	for field != "" {
		if l, ok := d.lines[joinWhere(ctx, field)]; ok {
			return l
		}
		field = field[:max(0, strings.LastIndexAny(field, ".["))]
	}
	return fallback
}

func (d *Decoder) decode(n *yaml.Node, v reflect.Value, ctx, field string) bool {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	where := joinWhere(ctx, field)
	t := v.Type()
	switch {
	case n.ShortTag() == "!!null":
		return true // leaves the zero value; required fields are checked later
	case t == reflect.TypeFor[yaml.Node]():
		v.Set(reflect.ValueOf(*n))
		return true
	case reflect.PointerTo(t).Implements(unmarshalerType):
		// fall through to the leaf decode below
	case t.Kind() == reflect.Pointer:
		// Set even when part of it failed: the checks after decoding see
		// what did decode (and skip what did not: Reported).
		p := reflect.New(t.Elem())
		ok := d.decode(n, p.Elem(), ctx, field)
		v.Set(p)
		return ok
	case t.Kind() == reflect.Struct:
		return d.decodeStruct(n, v, ctx, field)
	case t.Kind() == reflect.Map && t.Implements(keySetType):
		return d.decodeKeySet(n, v, ctx, field)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n.Line, where, "must be a list, not %s", kindName(n))
			return false
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		ok := true
		for i, e := range n.Content {
			sub := fmt.Sprintf("%s[%d]", field, i)
			d.lines[joinWhere(ctx, sub)] = e.Line
			ok = d.decode(e, s.Index(i), ctx, sub) && ok
		}
		v.Set(s)
		return ok
	case t.Kind() == reflect.String && n.Kind != yaml.ScalarNode:
		d.errorf(n.Line, where, "must be a string, not %s", kindName(n))
		return false
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		d.errorf(n.Line, where, "%s", yamlMessage(err))
		return false
	}
	return true
}

func (d *Decoder) decodeStruct(n *yaml.Node, v reflect.Value, ctx, field string) bool {
	t := v.Type()
	var known []string
	index := map[string]int{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			known = append(known, name)
			index[name] = i
		}
	}
	return d.decodeMapping(n, known, ctx, field, func(key string, val *yaml.Node, sub string) bool {
		return d.decode(val, v.Field(index[key]), ctx, sub)
	})
}

// decodeKeySet decodes a KeySet: each value into a new element, stored
// unless it is null.
func (d *Decoder) decodeKeySet(n *yaml.Node, v reflect.Value, ctx, field string) bool {
	t := v.Type()
	known := reflect.Zero(t).Interface().(KeySet).Keys()
	m := reflect.MakeMap(t)
	ok := d.decodeMapping(n, known, ctx, field, func(key string, val *yaml.Node, sub string) bool {
		e := reflect.New(t.Elem()).Elem()
		ok := d.decode(val, e, ctx, sub)
		if val.ShortTag() != "!!null" {
			m.SetMapIndex(reflect.ValueOf(key).Convert(t.Key()), e)
		}
		return ok
	})
	v.Set(m)
	return ok
}

// decodeMapping checks n is a mapping whose keys are among known, each
// once and none a merge key, and hands each value to one.
func (d *Decoder) decodeMapping(n *yaml.Node, known []string, ctx, field string, one func(key string, val *yaml.Node, sub string) bool) bool {
	where := joinWhere(ctx, field)
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, where, "must be a mapping, not %s", kindName(n))
		return false
	}
	ok := true
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			d.errorf(k.Line, where, "merge keys (<<) are not supported; repeat the fields")
			ok = false
			continue
		}
		if k.Kind != yaml.ScalarNode || !slices.Contains(known, k.Value) {
			d.errorf(k.Line, where, "unknown field %q (known: %s)", k.Value, strings.Join(known, ", "))
			ok = false
			continue
		}
		sub := k.Value
		if field != "" {
			sub = field + "." + k.Value
		}
		if first, dup := seen[k.Value]; dup {
			d.errorf(k.Line, joinWhere(ctx, sub), "set twice (first on line %d)", first)
			ok = false
			continue
		}
		seen[k.Value] = k.Line
		d.lines[joinWhere(ctx, sub)] = k.Line
		ok = one(k.Value, val, sub) && ok
	}
	return ok
}

// scalarField returns the text of key in mapping n, so messages about a
// table can name it before the entry has been decoded.
func scalarField(n *yaml.Node, key string) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if v := n.Content[i+1]; n.Content[i].Value == key {
			for v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			if v.Kind == yaml.ScalarNode {
				return v.Value
			}
		}
	}
	return ""
}

func joinWhere(ctx, field string) string {
	if ctx == "" || field == "" {
		return ctx + field
	}
	return ctx + ": " + field
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// yamlError turns a yaml syntax error into the file:line: form used
// everywhere else.
func (d *Decoder) yamlError(data []byte, err error) error {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		msg := yamlLine.ReplaceAllString(err.Error(), "")
		line := m[1]
		if l := problemLine(data, msg); l > 0 {
			line = strconv.Itoa(l)
		}
		return fmt.Errorf("%s:%s: %s", d.source, line, msg)
	}
	return fmt.Errorf("%s: %s", d.source, yamlMessage(err))
}

// problemLine finds the line where the syntax error msg is: yaml reports
// the line where the construct it was in began (a list two lines up for a
// key indented wrong), counted from 0 for some errors. The first lines of
// data that fail to parse with the same message end on the line of the
// problem. 0 when none do.
func problemLine(data []byte, msg string) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	for n := 1; n <= len(lines); n++ {
		var doc yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:n], nil), &doc)
		if err != nil && yamlLine.ReplaceAllString(err.Error(), "") == msg {
			return n
		}
	}
	return 0
}

// yamlMessage drops yaml's own line prefixes; callers add file and line.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, e := range te.Errors {
			msgs[i] = yamlLine.ReplaceAllString(e, "")
		}
		return strings.Join(msgs, "; ")
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

// document reads exactly one YAML document and returns its root, or nil for
// an empty file.
func (d *Decoder) document(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, extra yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, d.yamlError(data, err)
	}
	// A second document would otherwise be ignored without a word.
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, d.yamlError(data, err)
		}
		return nil, fmt.Errorf("%s:%d: only one YAML document is allowed", d.source, extra.Line)
	}
	return doc.Content[0], nil
}

// err joins every error found so far, in file order: top-level fields are
// checked before the entries, and some checks run after decoding.
func (d *Decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b fileError) int { return a.line - b.line })
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e.err
	}
	return errors.Join(errs...)
}

// Fields lists the field paths a value of v's type accepts, as the file
// spells them: "key", "partitions.by", "paths[].stages[].after". A field
// whose type decodes itself (yaml.Unmarshaler, yaml.Node) is a leaf. The
// reference docs' test compares these with what the docs describe.
func Fields(v any) []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			path := prefix + name
			out = append(out, path)
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Slice {
				path += "[]"
				ft = ft.Elem()
			}
			switch {
			case ft.Kind() == reflect.Map && ft.Implements(keySetType):
				for _, k := range reflect.Zero(ft).Interface().(KeySet).Keys() {
					out = append(out, path+"."+k)
				}
			case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[yaml.Node]() && !reflect.PointerTo(ft).Implements(unmarshalerType):
				walk(ft, path+".")
			}
		}
	}
	walk(reflect.TypeOf(v), "")
	return out
}
