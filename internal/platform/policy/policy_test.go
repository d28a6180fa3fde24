package policy

import (
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"go.yaml.in/yaml/v3"
)

const example = `tables:
  - table: public.consumer_inbox      # required, schema-qualified
    key: [consumer, message_id]
    scope: consumer
    event_time: event_time
    expires_at: remember_until
  - table: public."InboxState"
    key: ["Id"]
    expires_after: { column: "Delivered", after: 720h }
`

func TestParseGood(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		want []Table
	}{
		{"example", example, []Table{
			{Name: sqlident.QualifiedName{Schema: "public", Name: "consumer_inbox"}, Key: []string{"consumer", "message_id"},
				Scope: "consumer", EventTime: "event_time", ExpiresAt: "remember_until", Line: 2},
			{Name: sqlident.QualifiedName{Schema: "public", Name: "InboxState"}, Key: []string{"Id"},
				ExpiresAfter: &ExpiresAfter{Column: "Delivered", After: 720 * time.Hour}, Line: 7},
		}},
		{"minimal", "tables: [{table: s.t, key: [id], expires_at: x}]", []Table{
			{Name: sqlident.QualifiedName{Schema: "s", Name: "t"}, Key: []string{"id"}, ExpiresAt: "x", Line: 1},
		}},
		{"hostile names and days", `
tables:
  - table: ' Public . "weird ""name""; drop table x" '
    key: ["a b", "Sé;lect", "1"]
    expires_after:
      column: "it's"
      after: 1d12h
`, []Table{
			{Name: sqlident.QualifiedName{Schema: "public", Name: `weird "name"; drop table x`}, Key: []string{"a b", "Sé;lect", "1"},
				ExpiresAfter: &ExpiresAfter{Column: "it's", After: 36 * time.Hour}, Line: 3},
		}},
		{"aliases", `tables:
  - {table: a.b, key: &k [id], expires_after: &e {column: c, after: 30d}}
  - {table: a.c, key: *k, expires_after: *e}
`, []Table{
			{Name: sqlident.QualifiedName{Schema: "a", Name: "b"}, Key: []string{"id"}, ExpiresAfter: &ExpiresAfter{Column: "c", After: 30 * 24 * time.Hour}, Line: 2},
			{Name: sqlident.QualifiedName{Schema: "a", Name: "c"}, Key: []string{"id"}, ExpiresAfter: &ExpiresAfter{Column: "c", After: 30 * 24 * time.Hour}, Line: 3},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse([]byte(tt.yaml), "policy.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if p.Source != "policy.yaml" || !reflect.DeepEqual(p.Tables, tt.want) {
				t.Errorf("got %s %+v\nwant %+v", p.Source, p.Tables, tt.want)
			}
		})
	}
}

// The retention section is kept as a node for the retention package, and
// first_seen names the first-receipt column.
func TestRetentionNodeAndFirstSeen(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(`tables:
  - {table: a.b, key: [id], first_seen: seen, expires_at: x}
retention:
  - scope: s
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Tables[0].FirstSeen != "seen" {
		t.Errorf("FirstSeen = %q", p.Tables[0].FirstSeen)
	}
	if r := p.Retention; r == nil || r.Kind != yaml.SequenceNode || r.Line != 4 || len(r.Content) != 1 {
		t.Errorf("Retention = %+v", r)
	}
	for _, doc := range []string{example, example + "retention:\n", example + "retention: ~\n"} {
		if p, err := Parse([]byte(doc), "p.yaml"); err != nil || p.Retention != nil {
			t.Errorf("Retention = %+v, %v; want nil", p.Retention, err)
		}
	}
}

func TestExpiryAccessors(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(example), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, b := p.Tables[0], p.Tables[1]
	if a.ExpiryColumn() != "remember_until" || a.ExpiryOffset() != 0 ||
		b.ExpiryColumn() != "Delivered" || b.ExpiryOffset() != 720*time.Hour {
		t.Errorf("got %q %v %q %v", a.ExpiryColumn(), a.ExpiryOffset(), b.ExpiryColumn(), b.ExpiryOffset())
	}
	if got := b.Name.Sanitize(); got != `"public"."InboxState"` {
		t.Errorf("Sanitize = %s", got)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil || p.Source != path || len(p.Tables) != 2 {
		t.Fatalf("Load = %+v, %v", p, err)
	}
	if _, err := Load(path + ".missing"); err == nil || !strings.Contains(err.Error(), "policy.yaml.missing") {
		t.Errorf("Load(missing) = %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	// tbl builds a one-table file from extra lines, indented under the entry.
	tbl := func(lines ...string) string {
		return "tables:\n  - " + strings.Join(lines, "\n    ") + "\n"
	}
	const ok = "key: [id]\n    expires_at: x"
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error, besides the file name
	}{
		{"empty file", "", []string{"policy.yaml: no tables"}},
		{"comments only", "# nothing\n", []string{"no tables"}},
		{"null document", "~\n", []string{"no tables"}},
		{"empty tables", "tables: []\n", []string{"no tables"}},
		{"tables not a list", "tables: x\n", []string{"policy.yaml:1: tables: must be a list"}},
		{"top level a list", "- a\n", []string{"policy.yaml:1: must be a mapping"}},
		{"invalid yaml", "tables:\n  - table: [a\n", []string{"policy.yaml:", "did not find expected"}},
		{"two documents", example + "---\ntables: []\n", []string{"policy.yaml:10: only one YAML document"}},
		{"unknown top-level field", "retentoin: []\n" + tbl("table: a.b", ok), []string{"policy.yaml:1: ", `unknown field "retentoin"`, "known: tables, retention"}},
		{"retention not a list", "retention: 1d\n" + tbl("table: a.b", ok), []string{"policy.yaml:1: retention: must be a list"}},
		{"NUL in first_seen", tbl("table: a.b", ok, `first_seen: "x\0"`), []string{"policy.yaml:5: tables[0] (a.b): first_seen: ", "NUL"}},
		{"unknown table field", tbl("table: a.b", ok, "expire_at: y"),
			[]string{"policy.yaml:5: tables[0] (a.b): ", `unknown field "expire_at"`, "known: table, key"}},
		{"unknown nested field", tbl("table: a.b", "key: [id]", "expires_after: {column: c, after: 1d, at: x}"),
			[]string{"policy.yaml:4: tables[0] (a.b): expires_after: ", `unknown field "at"`}},
		{"field twice", tbl("table: a.b", ok, "key: [x]"), []string{"policy.yaml:5: tables[0] (a.b): key: set twice (first on line 3)"}},
		{"merge key", "x: &m {key: [id]}\n" + tbl("table: a.b", "<<: *m", "expires_at: x"), []string{"tables[0] (a.b)", "merge keys"}},
		{"missing table", tbl(ok), []string{"policy.yaml:2: tables[0]: table: required"}},
		{"table not a string", tbl("table: [a, b]", ok), []string{"policy.yaml:2: tables[0]: table: must be a string"}},
		{"entry not a mapping", "tables: [a.b]\n", []string{"policy.yaml:1: tables[0]: must be a mapping"}},
		{"no schema", tbl("table: consumer_inbox", ok), []string{"tables[0] (consumer_inbox): table: ", "schema is required", "public.consumer_inbox"}},
		{"unterminated quote", tbl(`table: 'public."abc'`, ok), []string{`tables[0] (public."abc): table:`, "unterminated"}},
		{"three parts", tbl("table: a.b.c", ok), []string{"tables[0] (a.b.c): table:", "3 parts"}},
		{"empty part", tbl("table: a..b", ok), []string{"tables[0] (a..b): table:", "empty name part"}},
		{"trailing dot", tbl("table: a.", ok), []string{"table:", "empty name part"}},
		{"empty quoted", tbl(`table: 'a.""'`, ok), []string{"table:", "empty quoted"}},
		{"trailing garbage", tbl(`table: 'a."b"c'`, ok), []string{"table:", `unexpected "c"`}},
		{"space inside", tbl(`table: a.b c`, ok), []string{"table:", `unexpected "c"`}},
		{"bad character", tbl(`table: a.b-c`, ok), []string{"table:", `unexpected "-c"`}},
		{"starts with digit", tbl(`table: a.1b`, ok), []string{"table:", `unexpected '1'`}},
		{"NUL in name", "tables:\n  - table: \"a.\\\"b\\0\\\"\"\n    " + ok, []string{"table:", "NUL"}},
		{"missing key", tbl("table: a.b", "expires_at: x"), []string{"policy.yaml:2: tables[0] (a.b): key: required"}},
		{"empty key", tbl("table: a.b", "key: []", "expires_at: x"), []string{"policy.yaml:3: tables[0] (a.b): key: required"}},
		{"key is a string", tbl("table: a.b", "key: id", "expires_at: x"), []string{"policy.yaml:3: tables[0] (a.b): key: must be a list"}},
		{"duplicate key column", tbl("table: a.b", "key: [id, x, id]", "expires_at: x"),
			[]string{"policy.yaml:3: tables[0] (a.b): key[2]: ", `"id" is already key[0]`}},
		{"empty key column", tbl("table: a.b", "key: [id, '']", "expires_at: x"), []string{"tables[0] (a.b): key[1]: ", "empty"}},
		{"NUL in column", tbl("table: a.b", "key: [id]", `expires_at: "x\0"`), []string{"tables[0] (a.b): expires_at: ", "NUL"}},
		{"scope not a string", tbl("table: a.b", ok, "scope: {a: b}"), []string{"policy.yaml:5: tables[0] (a.b): scope: must be a string"}},
		{"both expiries", tbl("table: a.b", ok, "expires_after: {column: c, after: 1d}"),
			[]string{"policy.yaml:5: tables[0] (a.b): expires_after: cannot be combined with expires_at"}},
		{"neither expiry", tbl("table: a.b", "key: [id]"), []string{"policy.yaml:2: tables[0] (a.b): expires_at or expires_after is required"}},
		{"expires_after scalar", tbl("table: a.b", "key: [id]", "expires_after: 30d"),
			[]string{"policy.yaml:4: tables[0] (a.b): expires_after: must be a mapping"}},
		{"expires_after no column", tbl("table: a.b", "key: [id]", "expires_after: {after: 1d}"),
			[]string{"policy.yaml:4: tables[0] (a.b): expires_after.column: required"}},
		{"expires_after no after", tbl("table: a.b", "key: [id]", "expires_after: {column: c}"),
			[]string{"policy.yaml:4: tables[0] (a.b): expires_after.after: must be positive"}},
		{"bad duration", tbl("table: a.b", "key: [id]", "expires_after:", "  column: c", "  after: 30 days"),
			[]string{"policy.yaml:6: tables[0] (a.b): expires_after.after: ", `"30 days" is not a duration`}},
		{"duration is a list", tbl("table: a.b", "key: [id]", "expires_after: {column: c, after: [1d]}"),
			[]string{"tables[0] (a.b): expires_after.after: ", "must be a duration"}},
		{"zero duration", tbl("table: a.b", "key: [id]", "expires_after: {column: c, after: 0}"),
			[]string{"tables[0] (a.b): expires_after.after: must be positive"}},
		{"negative duration", tbl("table: a.b", "key: [id]", "expires_after: {column: c, after: -1d}"),
			[]string{"tables[0] (a.b): expires_after.after: must be positive"}},
		{"duplicate table", example + "  - {table: PUBLIC.Consumer_Inbox, key: [id], expires_at: x}\n",
			[]string{"policy.yaml:10: tables[2] (PUBLIC.Consumer_Inbox): table: listed twice (first as tables[0] on line 2)"}},
		{"error in second table", example + "  - {table: a.b, key: [id]}\n", []string{"policy.yaml:10: tables[2] (a.b)", "required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse([]byte(tt.yaml), "policy.yaml")
			if err == nil {
				t.Fatalf("no error; got %+v", p)
			}
			for _, w := range append(tt.want, "policy.yaml") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// Every problem is reported, not just the first.
func TestParseReportsAll(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("tables:\n  - {table: x, key: [id], expires_at: x}\n  - {table: a.b, key: [], expires_at: x, foo: 1}\n"), "p.yaml")
	if err == nil {
		t.Fatal("no error")
	}
	if msg := err.Error(); !strings.Contains(msg, "p.yaml:2: tables[0] (x): table:") || !strings.Contains(msg, `p.yaml:3: tables[1] (a.b): unknown field "foo"`) {
		t.Errorf("got %q", msg)
	}

	// Within one entry too: an unknown field does not hide the others, a
	// value that does not decode is said once, and every tuning value is
	// checked, each on its own line.
	_, err = Parse([]byte(`tables:
  - table: a.b
    key: []
    foo: 1
    expires_after: {column: "", after: 30 days}
    partitions: {by: week, max_expiry: 60d}
    tuning:
      batch_size: lots
      batch_target: soon
      batch_size_min: 500
      batch_size_max: 100
      run_time: 1d12h
      batch_pause: ""
`), "p.yaml")
	want := `p.yaml:3: tables[0] (a.b): key: required: list the columns that identify a row
p.yaml:4: tables[0] (a.b): unknown field "foo" (known: table, key, scope, event_time, first_seen, expires_at, expires_after, partitions, tiers, time_zone, tuning, only_when, windows, epoch_unit, delete_referencing, compact)
p.yaml:5: tables[0] (a.b): expires_after.after: "30 days" is not a duration (like 500ms, 30s, 36h, 90d or 1d12h)
p.yaml:5: tables[0] (a.b): expires_after.column: required
p.yaml:6: tables[0] (a.b): partitions.by: "week" is not supported; use month
p.yaml:8: tables[0] (a.b): tuning.batch_size: "lots" is not an integer
p.yaml:9: tables[0] (a.b): tuning.batch_target: "soon" is not a duration (like 500ms, 30s, 36h, 90d or 1d12h)
p.yaml:11: tables[0] (a.b): tuning.batch_size_max: 100 must be at least batch_size_min (500)
p.yaml:13: tables[0] (a.b): tuning.batch_pause: "" is not a duration (like 500ms, 30s, 36h, 90d or 1d12h)`
	if err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
}

// TestDuration: the policy file reads durations in the one grammar
// (humantime, tested there) and prints them back in it.
func TestDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"30d": 30 * humantime.Day, "1d12h": 36 * time.Hour, "36h": 36 * time.Hour, "1.5d": 36 * time.Hour} {
		p, err := Parse([]byte("tables:\n  - table: a.b\n    key: [id]\n    expires_after: {column: at, after: "+in+"}\n"), "p.yaml")
		if err != nil {
			t.Fatalf("after: %s: %v", in, err)
		}
		if got := p.Tables[0].ExpiresAfter.After; got != want {
			t.Errorf("after: %s = %v, want %v", in, got, want)
		}
		if s := Duration(want).String(); s != humantime.Format(want) {
			t.Errorf("Duration(%v).String() = %q, want the one printer's %q", want, s, humantime.Format(want))
		}
	}
	_, err := Parse([]byte("tables:\n  - table: a.b\n    key: [id]\n    expires_after: {column: at, after: 1w}\n"), "p.yaml")
	if err == nil || !strings.Contains(err.Error(), `p.yaml:4: tables[0] (a.b): expires_after.after: "1w" is not a duration`) {
		t.Errorf("after: 1w: %v", err)
	}
}

// The partitions block's numbers: premake a whole number of months from 1
// to 120 (1.5 was read as 1), max_expiry at most ten years (100000d planned
// 3,287 partitions).
func TestPartitionsBounds(t *testing.T) {
	t.Parallel()
	for block, want := range map[string]string{
		"premake: 1.5":        `partitions.premake: "1.5" is not a whole number of months`,
		"premake: 0":          "partitions.premake: must be between 1 and 120 months, not 0",
		"premake: 121":        "partitions.premake: must be between 1 and 120 months, not 121",
		"max_expiry: 100000d": "partitions.max_expiry: 100000d is more than 3660d (ten years)",
	} {
		mx := "max_expiry: 30d, "
		if strings.HasPrefix(block, "max_expiry") {
			mx = ""
		}
		_, err := Parse([]byte("tables:\n  - table: a.b\n    key: [id]\n    expires_at: e\n    partitions: {by: month, "+mx+block+"}\n"), "p.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", block, err, want)
		}
	}
	p, err := Parse([]byte("tables:\n  - table: a.b\n    key: [id]\n    expires_at: e\n    partitions: {by: month, max_expiry: 3660d, premake: 120}\n"), "p.yaml")
	if err != nil || p.Tables[0].Partitions.Premake != 120 || p.Tables[0].Partitions.MaxExpiry != 3660*24*time.Hour {
		t.Errorf("the bounds themselves: %v", err)
	}
}
