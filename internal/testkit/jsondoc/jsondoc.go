// Package jsondoc reads the fields the commands reference documents for
// each JSON output, lists the fields of the Go type an output is encoded
// from, and checks an output against the documented fields: the docs test
// compares the reference with the types, the command tests decode every
// output strictly against the reference.
//
// In docs/reference/commands.md an output's fields are a table under the
// line "Fields of `<output>`:" (say "Fields of `status --json`:"), one row
// per field: its path (`tables[].rows.due`; `[]` for the elements of a
// list, a leading `[]` for a list at the top), its type and its meaning.
// Types are string, number, boolean, time (an RFC 3339 string), object,
// "array of T", or alternatives joined by " or " ("object or null",
// "number or string").
package jsondoc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Field is one documented field: its path and its type.
type Field struct {
	Path, Type string
}

// Read returns the fields doc (the commands reference's text) documents
// for output, in order; an error when it documents none.
func Read(doc, output string) ([]Field, error) {
	marker := "Fields of `" + output + "`:"
	i := strings.Index(doc, marker)
	if i < 0 {
		return nil, fmt.Errorf("the reference has no line %q", marker)
	}
	row := regexp.MustCompile("^\\| `([^`]*)` \\| ([^|]+) \\|")
	var out []Field
	lines := strings.Split(doc[i+len(marker):], "\n")
	for _, l := range lines[1:] {
		l = strings.TrimSpace(l)
		if l == "" && len(out) == 0 {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			break
		}
		if m := row.FindStringSubmatch(l); m != nil {
			out = append(out, Field{Path: m[1], Type: strings.TrimSpace(m[2])})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no field rows under %q", marker)
	}
	return out, nil
}

// OfType lists the fields of t as encoding/json writes it: each struct
// field by its JSON name, lists as "array of T" with their elements'
// fields under path[], pointers as "T or null". An interface field is
// "any": its documented type is not checked against the type.
func OfType(t reflect.Type) []Field {
	var out []Field
	var walk func(path string, t reflect.Type)
	walk = func(path string, t reflect.Type) {
		switch {
		case t == reflect.TypeFor[time.Time]():
		case t.Kind() == reflect.Pointer:
			walk(path, t.Elem())
		case t.Kind() == reflect.Slice:
			walk(path+"[]", t.Elem())
		case t.Kind() == reflect.Struct:
			for i := range t.NumField() {
				f := t.Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" || !f.IsExported() {
					continue
				}
				if name == "" {
					name = f.Name
				}
				p := name
				if path != "" {
					p = path + "." + name
				}
				out = append(out, Field{Path: p, Type: typeName(f.Type)})
				walk(p, f.Type)
			}
		}
	}
	if t.Kind() == reflect.Slice {
		out = append(out, Field{Path: "[]", Type: typeName(t)})
	}
	walk("", t)
	return out
}

func typeName(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Time]():
		return "time"
	case t.Kind() == reflect.Pointer:
		return typeName(t.Elem()) + " or null"
	case t.Kind() == reflect.Slice:
		return "array of " + typeName(t.Elem())
	case t.Kind() == reflect.Struct:
		return "object"
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() == reflect.Interface:
		return "any"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64:
		return "number"
	}
	return t.String()
}

// CompareType returns how the documented fields differ from t's.
func CompareType(doc []Field, t reflect.Type) []string {
	var diffs []string
	have := map[string]string{}
	for _, f := range OfType(t) {
		have[f.Path] = f.Type
	}
	documented := map[string]bool{}
	for _, f := range doc {
		documented[f.Path] = true
		typ, ok := have[f.Path]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s is documented but is no field of %s", f.Path, t))
		case typ != "any" && !sameTypes(typ, f.Type):
			diffs = append(diffs, fmt.Sprintf("%s is documented as %q but is %q in %s", f.Path, f.Type, typ, t))
		}
	}
	for _, f := range OfType(t) {
		if !documented[f.Path] {
			diffs = append(diffs, fmt.Sprintf("%s (%s) is a field of %s but is not documented", f.Path, f.Type, t))
		}
	}
	return diffs
}

// sameTypes compares two types as sets of alternatives.
func sameTypes(a, b string) bool {
	as, bs := strings.Split(a, " or "), strings.Split(b, " or ")
	sort.Strings(as)
	sort.Strings(bs)
	return slices.Equal(as, bs)
}

// Seen collects, over outputs checked with Check, the paths that held a
// value other than null: documented fields an output never shows are found
// with Unseen.
type Seen map[string]bool

// Check decodes data strictly against doc: every field it holds must be
// documented, with a value of the documented type. It returns each
// difference and notes what it saw in seen.
func Check(data []byte, doc []Field, seen Seen) []string {
	types := map[string]string{}
	for _, f := range doc {
		types[f.Path] = f.Type
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{fmt.Sprintf("not JSON: %v", err)}
	}
	if dec.More() {
		return []string{"more than one JSON document"}
	}
	var diffs []string
	var walk func(path string, v any, typ string)
	walk = func(path string, v any, typ string) {
		if v != nil {
			seen[path] = true
		}
		if err := typeOf(v, typ); err != "" {
			diffs = append(diffs, fmt.Sprintf("%s: %s", name(path), err))
			return
		}
		switch x := v.(type) {
		case map[string]any:
			for k, fv := range x {
				p := k
				if path != "" {
					p = path + "." + k
				}
				ft, ok := types[p]
				if !ok {
					diffs = append(diffs, fmt.Sprintf("%s is not documented (value %v)", p, fv))
					continue
				}
				walk(p, fv, ft)
			}
		case []any:
			elem := elemType(typ)
			for _, e := range x {
				walk(path+"[]", e, elem)
			}
		}
	}
	root := "object"
	if t, ok := types["[]"]; ok {
		root = t
	}
	walk("", v, root)
	return diffs
}

// Unseen lists the documented fields no output checked showed although
// they must be there: every field that may not be null, of an object or a
// list element that was there.
func Unseen(doc []Field, seen Seen) []string {
	var out []string
	for _, f := range doc {
		if f.Path == "[]" || seen[f.Path] || slices.Contains(strings.Split(f.Type, " or "), "null") {
			continue // the top-level list is the document itself
		}
		parent := "" // the object the field is in: "a" of "a.b", "a[]" of "a[].b"
		if i := strings.LastIndex(f.Path, "."); i >= 0 {
			parent = f.Path[:i]
		}
		if parent == "" || seen[parent] {
			out = append(out, f.Path)
		}
	}
	return out
}

func name(path string) string {
	if path == "" {
		return "the document"
	}
	return path
}

// elemType is the element type of an "array of T" type.
func elemType(typ string) string {
	for _, alt := range strings.Split(typ, " or ") {
		if t, ok := strings.CutPrefix(alt, "array of "); ok {
			return t
		}
	}
	return "?"
}

// typeOf says why v is not of the documented type typ; "" when it is.
func typeOf(v any, typ string) string {
	for _, alt := range strings.Split(typ, " or ") {
		ok := false
		switch x := v.(type) {
		case nil:
			ok = alt == "null"
		case string:
			if alt == "time" {
				_, err := time.Parse(time.RFC3339Nano, x)
				ok = err == nil
			} else {
				ok = alt == "string"
			}
		case json.Number:
			ok = alt == "number"
		case bool:
			ok = alt == "boolean"
		case map[string]any:
			ok = alt == "object"
		case []any:
			ok = strings.HasPrefix(alt, "array of ")
		}
		if ok {
			return ""
		}
	}
	return fmt.Sprintf("%v (%T) is not %s", v, v, typ)
}
