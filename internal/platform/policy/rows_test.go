package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// The fields that say which rows are the policy's and how a framework
// keeps time, read as written.
func TestRowsFields(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(`tables:
  - table: public.wolverine_incoming_envelopes
    key: [id]
    only_when: {column: status, in: [Handled]}
    expires_at: keep_until
  - table: eventuate.received_messages
    key: [consumer_id, message_id]
    epoch_unit: milliseconds
    expires_after: {column: creation_time, after: 7d}
  - table: public."InboxState"
    key: ["Id"]
    expires_after: {column: "Delivered", after: 30d}
    delete_referencing: ['public."OutboxMessage"']
  - table: public.jobs
    key: [id]
    windows:
      - only_when: {column: state, in: [completed, 3, true]}
        expires_after: {column: finalized_at, after: 7d}
      - only_when: {column: state, in: [discarded]}
        expires_after: {column: finalized_at, after: 24h}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, e, m, j := p.Tables[0], p.Tables[1], p.Tables[2], p.Tables[3]
	if !reflect.DeepEqual(w.OnlyWhen, &Filter{Column: "status", In: []string{"Handled"}}) || w.ExpiresAt != "keep_until" {
		t.Errorf("wolverine: %+v", w)
	}
	if e.EpochUnit != EpochMilliseconds || e.ExpiryColumn() != "creation_time" {
		t.Errorf("eventuate: %+v", e)
	}
	if !reflect.DeepEqual(m.DeleteReferencing, []sqlident.QualifiedName{{Schema: "public", Name: "OutboxMessage"}}) {
		t.Errorf("masstransit: %+v", m.DeleteReferencing)
	}
	// A windowed table reads as one window over them all: the union of
	// the filters, the shared column, the shortest offset.
	if len(j.Windows) != 2 || j.Windows[1].ExpiryOffset() != 24*time.Hour ||
		!reflect.DeepEqual(j.OnlyWhen, &Filter{Column: "state", In: []string{"completed", "3", "true", "discarded"}}) ||
		j.ExpiryColumn() != "finalized_at" || j.ExpiryOffset() != 24*time.Hour {
		t.Errorf("jobs: %+v", j)
	}
}

func TestRowsErrors(t *testing.T) {
	t.Parallel()
	tbl := func(lines ...string) string {
		return "tables:\n  - table: a.b\n    key: [id]\n    " + strings.Join(lines, "\n    ") + "\n"
	}
	for name, tt := range map[string]struct{ yaml, want string }{
		"filter without values":  {tbl("expires_at: x", "only_when: {column: s}"), "p.yaml:5: tables[0] (a.b): only_when.in: required"},
		"filter without column":  {tbl("expires_at: x", "only_when: {in: [a]}"), "only_when.column: required"},
		"filter value a list":    {tbl("expires_at: x", "only_when: {column: s, in: [[a]]}"), "only_when.in[0]: must be a value, not a list"},
		"filter value twice":     {tbl("expires_at: x", "only_when: {column: s, in: [a, a]}"), `only_when.in[1]: "a" is listed twice`},
		"epoch unit":             {tbl("expires_at: x", "epoch_unit: ms"), `epoch_unit: "ms" is not a unit: seconds or milliseconds`},
		"referencing itself":     {tbl("expires_at: x", "delete_referencing: [A.B]"), "delete_referencing[0]: is the table itself"},
		"referencing bad name":   {tbl("expires_at: x", "delete_referencing: [x]"), "delete_referencing[0]: table name \"x\": a schema is required"},
		"filter with partitions": {tbl("expires_at: x", "only_when: {column: s, in: [a]}", "partitions: {by: month, max_expiry: 30d}"), "partitions: cannot be combined with only_when"},
		"one window":             {tbl("windows: [{only_when: {column: s, in: [a]}, expires_at: x}]"), "windows: needs at least two windows"},
		"windows and expiry": {tbl("expires_at: x", "windows: [{only_when: {column: s, in: [a]}, expires_at: x}, {only_when: {column: s, in: [b]}, expires_at: x}]"),
			"windows: cannot be combined with a top-level expires_at"},
		"window without filter": {tbl("windows: [{expires_at: x}, {only_when: {column: s, in: [b]}, expires_at: x}]"), "windows[0].only_when: required"},
		"window without expiry": {tbl("windows: [{only_when: {column: s, in: [a]}}, {only_when: {column: s, in: [b]}, expires_at: x}]"), "windows[0]: expires_at or expires_after is required"},
		"windows two columns":   {tbl("windows: [{only_when: {column: s, in: [a]}, expires_at: x}, {only_when: {column: t, in: [b]}, expires_at: x}]"), `windows[1].only_when.column: "t" differs from the first window's "s"`},
		"windows overlap":       {tbl("windows: [{only_when: {column: s, in: [a]}, expires_at: x}, {only_when: {column: s, in: [b, a]}, expires_at: x}]"), `windows[1].only_when.in: "a" is already in windows[0]`},
		"windows two expiries": {tbl("windows: [{only_when: {column: s, in: [a]}, expires_at: x}, {only_when: {column: s, in: [b]}, expires_after: {column: y, after: 1d}}]"),
			`the expiry column "y" differs from the first window's "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.yaml), "p.yaml")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v\nwant %q", err, tt.want)
			}
		})
	}
}

// --table with a name that folds to lower case finds nothing, and says
// which spelling names the table.
func TestFind(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(example), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p.Find(`public."InboxState"`); err != nil || got.Name.Name != "InboxState" {
		t.Errorf("Find(quoted) = %v, %v", got, err)
	}
	_, err = p.Find("public.InboxState")
	if err == nil || !strings.Contains(err.Error(), `public.inboxstate: not in the policy file policy.yaml; did you mean public."InboxState"? (a name without quotes folds to lower case`) {
		t.Errorf("Find(unquoted) = %v", err)
	}
	_, err = p.Find("public.consumer_inbx")
	if err == nil || !strings.Contains(err.Error(), "did you mean public.consumer_inbox?") || strings.Contains(err.Error(), "folds") {
		t.Errorf("Find(typo) = %v", err)
	}
	if _, err = p.Find("public.payments"); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("Find(unrelated) = %v", err)
	}
}
