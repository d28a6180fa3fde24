// Package sqlargs collects a statement's parameters while its SQL text is
// built, handing out each one's placeholder: values reach SQL only as
// parameters, never spliced into the text. It is daemon internals.
package sqlargs

import "strconv"

// List collects query parameters and hands out their placeholders; its
// zero value is empty and ready to use.
type List struct{ Values []any }

// Add appends v and returns its placeholder ($n).
func (a *List) Add(v any) string {
	a.Values = append(a.Values, v)
	return "$" + strconv.Itoa(len(a.Values))
}
