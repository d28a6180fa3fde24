package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseCompact(t *testing.T) {
	t.Parallel()
	const head = "tables:\n  - table: a.b\n    key: [id]\n    expires_at: x\n"
	p, err := Parse([]byte(head+"    compact: {free_ratio: 0.4, allow_triggers: true}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := (&Compact{FreeRatio: 0.4, AllowTriggers: true}); !reflect.DeepEqual(p.Tables[0].Compact, want) {
		t.Errorf("compact = %+v, want %+v", p.Tables[0].Compact, want)
	}
	if p, err = Parse([]byte(head), "policy.yaml"); err != nil || p.Tables[0].Compact != nil {
		t.Errorf("without the section: %+v, %v; want no compaction", p.Tables[0].Compact, err)
	}

	for _, tt := range []struct{ name, section, want string }{
		{"no ratio", "compact: {allow_triggers: true}", "policy.yaml:5: tables[0] (a.b): compact.free_ratio: required"},
		{"not a number", "compact: {free_ratio: half}", `compact.free_ratio: "half" is not a number`},
		{"one", "compact: {free_ratio: 1}", "compact.free_ratio: must be above 0 and below 1 (a share of the heap), not 1"},
		{"zero", "compact: {free_ratio: 0}", "must be above 0 and below 1"},
		{"unknown field", "compact: {free_ratio: 0.5, allow_trigger: true}", `unknown field "allow_trigger"`},
		{"partitioned", "compact: {free_ratio: 0.5}\n    partitions: {by: month, max_expiry: 30d}",
			"compact: a table managed by partition gives its space back as whole partitions go"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(head+"    "+tt.section+"\n"), "policy.yaml")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
