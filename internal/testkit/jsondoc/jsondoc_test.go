package jsondoc

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const doc = "# x\n\nFields of `x --json`:\n\n" + `| field | type | meaning |
|---|---|---|
| ` + "`items`" + ` | array of object | the items |
| ` + "`items[].name`" + ` | string | a name |
| ` + "`items[].at`" + ` | time or null | when |
| ` + "`items[].tags`" + ` | array of string | tags |
| ` + "`count`" + ` | number | how many |

After.
`

type item struct {
	Name string     `json:"name"`
	At   *time.Time `json:"at"`
	Tags []string   `json:"tags"`
}

type out struct {
	Items []item `json:"items"`
	Count int    `json:"count"`
}

func TestReadAndCompareType(t *testing.T) {
	fields, err := Read(doc, "x --json")
	if err != nil || len(fields) != 5 || fields[2] != (Field{"items[].at", "time or null"}) {
		t.Fatalf("Read: %v, %v", fields, err)
	}
	if d := CompareType(fields, reflect.TypeFor[out]()); len(d) != 0 {
		t.Errorf("CompareType: %v", d)
	}
	type other struct {
		Items []struct {
			Name int `json:"name"`
		} `json:"items"`
		Extra bool `json:"extra"`
	}
	d := strings.Join(CompareType(fields, reflect.TypeFor[other]()), "\n")
	for _, want := range []string{`items[].name is documented as "string" but is "number"`, "count is documented but is no field", "extra (boolean) is a field of", "items[].at is documented"} {
		if !strings.Contains(d, want) {
			t.Errorf("CompareType lacks %q:\n%s", want, d)
		}
	}
	if _, err := Read(doc, "y --json"); err == nil {
		t.Error("Read found fields of an output the doc does not document")
	}
}

func TestCheck(t *testing.T) {
	fields, _ := Read(doc, "x --json")
	seen := Seen{}
	if d := Check([]byte(`{"items":[{"name":"a","at":null,"tags":[]}],"count":1}`), fields, seen); len(d) != 0 {
		t.Errorf("a good document: %v", d)
	}
	if u := Unseen(fields, seen); len(u) != 0 {
		t.Errorf("Unseen: %v (at may be null)", u)
	}
	for doc, want := range map[string]string{
		`{"items":null,"count":1}`:                     "items: <nil> (<nil>) is not array of object",
		`{"items":[],"count":"1"}`:                     `count: 1 (string) is not number`,
		`{"items":[],"count":1,"more":true}`:           "more is not documented",
		`{"items":[{"name":"a","at":"yesterday"}]}`:    "items[].at: yesterday (string) is not time or null",
		`{"items":[{"name":"a","tags":[1]}]}`:          "items[].tags[]: 1 (json.Number) is not string",
		`{"count":1} {"count":2}`:                      "more than one JSON document",
		`[1]`:                                          "the document: [1] ([]interface {}) is not object",
		`{"items":[{"Name":"a","at":null,"tags":[]}]}`: "items[].Name is not documented",
	} {
		if d := strings.Join(Check([]byte(doc), fields, Seen{}), "\n"); !strings.Contains(d, want) {
			t.Errorf("Check(%s) = %q, want %q", doc, d, want)
		}
	}
	// What must be there is missed only where its object was.
	seen = Seen{}
	Check([]byte(`{"items":[]}`), fields, seen)
	if u := Unseen(fields, seen); !slices.Equal(u, []string{"count"}) {
		t.Errorf("Unseen = %v, want [count] (no item: its fields are not missed)", u)
	}
}
