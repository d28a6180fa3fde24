package sqlargs

import (
	"slices"
	"testing"
)

func TestAdd(t *testing.T) {
	var a List
	if p := a.Add("x"); p != "$1" {
		t.Errorf("first placeholder %q, want $1", p)
	}
	if p := a.Add(7); p != "$2" {
		t.Errorf("second placeholder %q, want $2", p)
	}
	if p := a.Add("x"); p != "$3" {
		t.Errorf("a value added again gets a placeholder of its own: %q, want $3", p)
	}
	if !slices.Equal(a.Values, []any{"x", 7, "x"}) {
		t.Errorf("values %v, want [x 7 x]", a.Values)
	}
}
