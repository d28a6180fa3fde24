package strictyaml

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// days is a leaf type with an unmarshaler of its own, like the policy's
// durations.
type days int

func (d *days) UnmarshalYAML(n *yaml.Node) error {
	*d = days(len(n.Value))
	return nil
}

// A decoder keeps going past errors and reports them in file order, each on
// the line of its field or of the nearest enclosing one.
func TestDecoder(t *testing.T) {
	t.Parallel()
	d := New("r.yaml")
	root, err := d.Document([]byte("a: 1\nb:\n  c: x\n  c: y\n  e: 1d\n"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		A int `yaml:"a"`
		B struct {
			C string `yaml:"c"`
			E days   `yaml:"e"`
		} `yaml:"b"`
	}
	if scalarField(root, "a") != "1" {
		t.Errorf("scalarField = %q", scalarField(root, "a"))
	}
	if d.Decode(root, &v, "entry") {
		t.Error("Decode accepted a field set twice")
	}
	d.Errorf(1, "entry", "b.e", "too %s", "short")
	d.Errorf(1, "entry", "b.nothing", "missing")
	// In file order; b.nothing was not written, so it is reported on b's line.
	want := "r.yaml:2: entry: b.nothing: missing\nr.yaml:4: entry: b.c: set twice (first on line 3)\nr.yaml:5: entry: b.e: too short"
	if err := d.Err(); err == nil || err.Error() != want {
		t.Errorf("Err =\n%v\nwant\n%s", err, want)
	}
	if n, err := New("e.yaml").Document(nil); n != nil || err != nil {
		t.Errorf("empty document = %v, %v", n, err)
	}
	if _, err := New("e.yaml").Document([]byte("a: 1\n---\nb: 2\n")); err == nil || !strings.Contains(err.Error(), "e.yaml:2: only one YAML document") {
		t.Errorf("two documents: %v", err)
	}
}

// A syntax error is reported on the line of the problem, not on the line
// where the construct it is in began (yaml's own line, counted from 0 for
// some errors).
func TestSyntaxErrorLines(t *testing.T) {
	t.Parallel()
	const head = "tables:\n  - table: x\n"
	for doc, want := range map[string]string{
		head + "    key: [a]\n  expires_at: y\n":                       "p.yaml:4: did not find expected '-' indicator",
		head + "   key: [a]\n    expires_at: y\n":                      "p.yaml:3: did not find expected '-' indicator",
		head + "    key: [a, b\n    expires_at: y\n":                   "p.yaml:3: did not find expected ',' or ']'",
		head + "    key: [a]\n    expires_at: y\n - table: z\n":        "p.yaml:5: did not find expected key",
		head + "    key: [a]\n    scope: s\n    expires_at remember\n": "p.yaml:5: could not find expected ':'",
		head + "    key: [a]\n    expires_at: y: z\n":                  "p.yaml:4: mapping values are not allowed in this context",
		head + "    key: [a]\n    expires_at: \"y\n    scope: z\n":     "p.yaml:4: found unexpected end of stream",
		"tables:\n\t- table: x\n":                                      "p.yaml:2: found character that cannot start any token",
	} {
		if _, err := New("p.yaml").Document([]byte(doc)); err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %s", doc, err, want)
		}
	}
}

// knobs is a KeySet: its keys come from a function, as the policy's tuning
// block's come from the tunables' table.
type knobs map[string]string

func (knobs) Keys() []string { return []string{"size", "pause"} }

// A KeySet's keys are held to its Keys as a struct's fields are to their
// tags: unknown and repeated keys are errors naming them, on their lines;
// null leaves a key out, "" sets it; Fields lists the keys.
func TestKeySet(t *testing.T) {
	t.Parallel()
	var v struct {
		K knobs `yaml:"k"`
	}
	d := New("k.yaml")
	root, err := d.Document([]byte("k:\n  size: 5000\n  pause: \"\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Decode(root, &v, "t") || len(v.K) != 2 || v.K["size"] != "5000" || v.K["pause"] != "" {
		t.Errorf("decoded %#v, %v", v.K, d.Err())
	}
	d = New("k.yaml")
	root, _ = d.Document([]byte("k:\n  size: 1\n  sise: 2\n  size: 3\n  pause:\n"))
	v.K = nil
	if d.Decode(root, &v, "t") {
		t.Error("Decode accepted an unknown key and a key set twice")
	}
	want := "k.yaml:3: t: k: unknown field \"sise\" (known: size, pause)\nk.yaml:4: t: k.size: set twice (first on line 2)"
	if err := d.Err(); err == nil || err.Error() != want {
		t.Errorf("Err =\n%v\nwant\n%s", err, want)
	}
	if _, ok := v.K["pause"]; ok || v.K["size"] != "1" {
		t.Errorf("decoded %#v: want size 1 and no pause", v.K)
	}
	d = New("k.yaml")
	root, _ = d.Document([]byte("k: [1]\n"))
	if d.Decode(root, &v, "t") || !strings.Contains(d.Err().Error(), "k.yaml:1: t: k: must be a mapping, not a list") {
		t.Errorf("a list for a KeySet: %v", d.Err())
	}
	if got := strings.Join(Fields(v), " "); got != "k k.size k.pause" {
		t.Errorf("Fields = %q", got)
	}
}
