package retention

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
)

const day = 24 * time.Hour

// tables is inbox.PlainPolicy, read from the file that package embeds (inbox
// imports this package, so its tests cannot import inbox), and a table with
// neither event time nor first receipt.
var tables = func() string {
	b, err := os.ReadFile("../inbox/schema/plain-policy.yaml")
	if err != nil {
		panic(err)
	}
	return string(b)
}() + `  - table: public.plain
    key: [id]
    expires_at: e
`

// The example of the policy-file documentation: the article's calculation
// plus a migration deadline and an unbounded manual backfill.
var example = tables + `retention:
  - scope: payments
    table: public.consumer_inbox
    producer: billing-service
    consequence: high
    owner: payments-team
    margin: 2d
    margin_reason: clock skew, scheduler delay, delayed cleanup
    after_expiry: a redelivery is applied again; the ledger's unique payout id is the durable guard
    extension:
      owner: payments-oncall
    permanent_key: [consumer, business_key]
    storage_tiers: hot 72h full payload; warm identity + hash + outcome; permanent business key
    paths:
      - name: broker redelivery
        stages: [{ after: 14d, from: event_time }]
      - name: offset rewind
        stages: [{ after: 10d, from: event_time }]
      - name: dead-letter redrive
        stages: [{ after: 30d, from: first_seen }]
      - name: outage catch-up
        stages: [{ after: 3d, from: event_time }]
      - name: restore then backlog
        stages: [{ name: restore, after: 45d, from: event_time }, { name: backlog, after: 3d }]
      - name: migration replay
        stages: [{ deadline: 2027-03-01T00:00:00Z }]
      - name: manual backfill
        unbounded: true
`

func parse(t *testing.T, doc string) ([]Plan, error) {
	t.Helper()
	p, err := policy.Parse([]byte(doc), "p.yaml")
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return Load(p)
}

func mustPlan(t *testing.T, doc string) Plan {
	t.Helper()
	plans, err := parse(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(plans) != 1 {
		t.Fatalf("got %d plans", len(plans))
	}
	return plans[0]
}

func date(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// The article's worked example: the windows are alternatives, so the
// retention is the longest plus the margin (47d), not their sum; once the
// restore is followed by a backlog, those two stages add up (48d), and the
// retention becomes 50d, not max(45, 3) + 2.
func TestWorkedExample(t *testing.T) {
	t.Parallel()
	entry := func(restore string) string {
		return tables + `retention:
  - scope: payments
    consequence: high
    owner: payments-team
    margin: 2d
    margin_reason: clock skew, scheduler delay, delayed cleanup
    after_expiry: applied again
    extension: {owner: payments-oncall}
    paths:
      - {name: broker retention, stages: [{after: 14d, from: event_time}]}
      - {name: offset rewind, stages: [{after: 10d, from: event_time}]}
      - {name: dead-letter redrive, stages: [{after: 30d, from: first_seen}]}
      - {name: outage catch-up, stages: [{after: 3d, from: event_time}]}
      - {name: disaster restore, stages: ` + restore + `}
`
	}
	alt := mustPlan(t, entry("[{after: 45d, from: event_time}]"))
	if alt.Rule.Retention != 47*day || alt.Longest != "disaster restore" {
		t.Errorf("alternatives: retention %v (longest %q), want 47d", alt.Rule.Retention, alt.Longest)
	}
	seq := mustPlan(t, entry("[{name: restore, after: 45d, from: event_time}, {name: backlog, after: 3d}]"))
	if seq.Rule.Retention != 50*day {
		t.Errorf("restore then backlog: retention %v, want 50d", seq.Rule.Retention)
	}
	if s := seq.Scenarios[4]; s.Length != 48*day || !reflect.DeepEqual(s.Terms, []time.Duration{45 * day, 3 * day}) || s.Anchor != AnchorEventTime {
		t.Errorf("restore then backlog scenario = %+v", s)
	}
	want := Rule{Scope: "payments", PostReceipt: 30 * day, Replay: 48 * day, Margin: 2 * day, Retention: 50 * day,
		Extension: Extension{Owner: "payments-oncall"}}
	if !reflect.DeepEqual(seq.Rule, want) {
		t.Errorf("rule = %+v\nwant %+v", seq.Rule, want)
	}
	if got := seq.Rule.String(); got != "remember_until = max(first_seen + 30d, event_time + 48d) + 2d" {
		t.Errorf("formula = %s", got)
	}
	md := seq.Markdown()
	for _, w := range []string{"| disaster restore | event time | 45d + 3d | 48d |",
		"retention = max(14d, 10d, 30d, 3d, 48d) + 2d margin = **50d** (longest: disaster restore)"} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q\n%s", w, md)
		}
	}
}

func TestRememberUntil(t *testing.T) {
	t.Parallel()
	full := mustPlan(t, example)
	r := full.Rule
	if r.Retention != 50*day || r.PostReceipt != 30*day || r.Replay != 48*day || r.Deadline == nil || !r.Deadline.Equal(date("2027-03-01T00:00:00Z")) {
		t.Fatalf("rule = %+v", r)
	}
	if !reflect.DeepEqual(full.Covered, []string{"manual backfill"}) {
		t.Errorf("covered = %v", full.Covered)
	}
	ts := Rule{PostReceipt: 30 * day, Replay: 48 * day, Margin: 2 * day}
	cases := []struct {
		name             string
		rule             Rule
		firstSeen, event string
		want             string
	}{
		// Received a day after the event: the replay horizon wins.
		{"replay horizon", ts, "2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z", "2026-02-20T00:00:00Z"},
		// First received two months late: the event-time term has long
		// passed, and first receipt plus the retry horizon protects it.
		{"late first delivery", ts, "2026-03-01T00:00:00Z", "2026-01-01T00:00:00Z", "2026-04-02T00:00:00Z"},
		// A migration deadline later than both.
		{"deadline", r, "2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z", "2027-03-03T00:00:00Z"},
		{"only first receipt", Rule{PostReceipt: 7 * day, Margin: time.Hour}, "2026-01-10T00:00:00Z", "2030-01-01T00:00:00Z", "2026-01-17T01:00:00Z"},
		{"only event time", Rule{Replay: 7 * day}, "2030-01-01T00:00:00Z", "2026-01-10T00:00:00Z", "2026-01-17T00:00:00Z"},
		{"no scenario at all", Rule{Margin: day}, "2026-01-10T00:00:00Z", "2020-01-01T00:00:00Z", "2026-01-11T00:00:00Z"},
	}
	for _, c := range cases {
		if got := c.rule.RememberUntil(date(c.firstSeen), date(c.event)); !got.Equal(date(c.want)) {
			t.Errorf("%s: RememberUntil = %s, want %s", c.name, got.Format(time.RFC3339), c.want)
		}
	}
	if got := r.String(); got != "remember_until = max(first_seen + 30d, event_time + 48d, 2027-03-01T00:00:00Z) + 2d" {
		t.Errorf("formula = %s", got)
	}
}

// An unbounded path is bounded by the maximum backfill age when there is
// one: it becomes an event-time scenario of that age.
func TestMaxBackfillAge(t *testing.T) {
	t.Parallel()
	p := mustPlan(t, strings.Replace(example, "    permanent_key: [consumer, business_key]\n", "    max_backfill_age: 60d\n", 1))
	s := p.Scenarios[len(p.Scenarios)-1]
	if s.Path != "manual backfill" || s.Anchor != AnchorEventTime || s.Length != 60*day || s.BoundedBy != "max_backfill_age" {
		t.Errorf("scenario = %+v", s)
	}
	if p.Rule.Retention != 62*day || p.Rule.Replay != 60*day || p.Longest != "manual backfill" || p.Covered != nil {
		t.Errorf("plan = %+v", p)
	}
	if md := p.Markdown(); !strings.Contains(md, "bounded by the maximum backfill age: 60d after event time") {
		t.Errorf("markdown:\n%s", md)
	}
}

// A zero margin is allowed: margin_reason is required anyway and says why.
func TestZeroMargin(t *testing.T) {
	t.Parallel()
	p := mustPlan(t, strings.Replace(example, "margin: 2d", "margin: 0d", 1))
	if p.Rule.Retention != 48*day || p.Rule.Margin != 0 {
		t.Errorf("rule = %+v", p.Rule)
	}
}

func TestExtension(t *testing.T) {
	t.Parallel()
	p := mustPlan(t, strings.Replace(example, "      owner: payments-oncall\n",
		"      owner: payments-oncall\n      on_duplicate: true\n      by: 7d\n      cap: 90d\n", 1))
	want := Extension{Owner: "payments-oncall", OnDuplicate: true, By: 7 * day, Cap: 90 * day}
	if p.Rule.Extension != want || p.Contract.Extension != want {
		t.Errorf("extension = %+v", p.Rule.Extension)
	}
	if md := p.Markdown(); !strings.Contains(md, "to at least now + 7d, never past first_seen + 90d") {
		t.Errorf("markdown:\n%s", md)
	}
}

// Every element of the retention record is in the Markdown.
func TestMarkdown(t *testing.T) {
	t.Parallel()
	md := mustPlan(t, example).Markdown()
	for _, w := range []string{
		"# Retention record: payments",
		"| consumer scope | payments |", "| producer scope | billing-service |", "| table | public.consumer_inbox |",
		"| consequence class | high |", "| owner | payments-team |",
		"## Duplicate paths",
		"| broker redelivery | 14d after event time |",
		"| dead-letter redrive | 30d after first receipt |",
		"| restore then backlog | restore 45d after event time, then backlog 3d |",
		"| migration replay | until 2027-03-01T00:00:00Z |",
		"| manual backfill | unbounded; the inbox does not cover it: the permanent business key (consumer, business_key) does |",
		"## Scenario arithmetic",
		"| restore then backlog | event time | 45d + 3d | 48d |",
		"| migration replay | deadline | 2027-03-01T00:00:00Z | until 2027-03-01T00:00:00Z |",
		"retention = max(14d, 10d, 30d, 3d, 48d) + 2d margin = **50d** (longest: restore then backlog)",
		"## Rule", "remember_until = max(first_seen + 30d, event_time + 48d, 2027-03-01T00:00:00Z) + 2d",
		"## Safety margin", "2d: clock skew, scheduler delay, delayed cleanup",
		"## Storage tiers", "hot 72h full payload; warm identity + hash + outcome; permanent business key",
		"## Extending replay deadlines", "Who may extend: payments-oncall.", "A duplicate does not extend remember_until.",
		"## After expiry", "the ledger's unique payout id is the durable guard",
		"every identity is kept until at least 2027-03-03T00:00:00Z",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q", w)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
	// Free text cannot break the tables.
	p := mustPlan(t, strings.Replace(example, "name: broker redelivery", "name: 'a | b'", 1))
	if !strings.Contains(p.Markdown(), `| a \| b | 14d after event time |`) {
		t.Errorf("a pipe in a path name is not escaped:\n%s", p.Markdown())
	}
}

func TestJSONRoundTrip(t *testing.T) {
	t.Parallel()
	ext := strings.Replace(example, "      owner: payments-oncall\n",
		"      owner: payments-oncall\n      on_duplicate: true\n      by: 36h\n      cap: 90d\n", 1)
	plans, err := parse(t, ext+strings.Replace(strings.TrimPrefix(example, tables+"retention:\n"), "scope: payments", "scope: shipping", 1))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.MarshalIndent(plans, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var back []Plan
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, plans) {
		t.Errorf("round trip differs:\n%+v\nwant\n%+v", back, plans)
	}
	// The documented shape: durations as text and as seconds.
	var raw []map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	rule := raw[0]["rule"].(map[string]any)
	if r := rule["retention"].(map[string]any); r["text"] != "50d" || r["seconds"] != float64(50*86400) {
		t.Errorf("rule.retention = %v", r)
	}
	if by := raw[0]["extension"].(map[string]any)["by"].(map[string]any); by["text"] != "1d12h" || by["seconds"] != float64(36*3600) {
		t.Errorf("extension.by = %v", by)
	}
	if rule["deadline"] != "2027-03-01T00:00:00Z" || rule["formula"] == "" || raw[0]["scope"] != "payments" {
		t.Errorf("rule = %v", rule)
	}
	// A record that does not parse says which one and where.
	bad := strings.Replace(string(data), `"text": "50d"`, `"text": "50 days"`, 1)
	if err := json.Unmarshal([]byte(bad), &back); err == nil || !strings.Contains(err.Error(), `"payments"`) || !strings.Contains(err.Error(), "rule.retention") {
		t.Errorf("bad record: %v", err)
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	section := strings.TrimPrefix(example, tables)
	path := write("r.yaml", section)
	pol, err := policy.Parse([]byte(tables), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*policy.Policy{pol, nil} {
		plans, err := LoadFile(path, p)
		if err != nil || len(plans) != 1 || plans[0].Rule.Retention != 50*day || plans[0].Rule.Table != "public.consumer_inbox" {
			t.Errorf("LoadFile(policy %v) = %+v, %v", p != nil, plans, err)
		}
	}
	// Without a policy file the table is not checked; with one, it is.
	other := write("other.yaml", strings.Replace(section, "table: public.consumer_inbox", "table: public.elsewhere", 1))
	if _, err := LoadFile(other, nil); err != nil {
		t.Errorf("no policy: %v", err)
	}
	if _, err := LoadFile(other, pol); err == nil || !strings.Contains(err.Error(), other+":3: retention[0] (payments): table: public.elsewhere is not among the tables of the policy file p.yaml") {
		t.Errorf("unknown table: %v", err)
	}
	for name, c := range map[string]struct{ doc, want string }{
		"empty":          {"", "no retention list"},
		"tables":         {tables, `unknown field "tables" (known: retention)`},
		"not a list":     {"retention: {scope: x}\n", ":1: retention: must be a list"},
		"empty list":     {"retention: []\n", ":1: retention: no entries"},
		"two documents":  {section + "---\n", "only one YAML document"},
		"yaml syntax":    {"retention: [\n", "bad.yaml:"},
		"planning error": {strings.Replace(section, "margin: 2d", "margin: -2d", 1), ":7: retention[0] (payments): margin: must not be negative"},
	} {
		p := write("bad.yaml", c.doc)
		if _, err := LoadFile(p, pol); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v, want %q", name, err, c.want)
		}
		_ = os.Remove(p)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml"), nil); err == nil {
		t.Error("missing file: no error")
	}
}

// No retention section: no plans, no error.
func TestLoadNoSection(t *testing.T) {
	t.Parallel()
	if plans, err := parse(t, tables); plans != nil || err != nil {
		t.Errorf("Load = %v, %v", plans, err)
	}
}

func TestPlanErrors(t *testing.T) {
	t.Parallel()
	// Each case edits the example: old is replaced by new (once), or new is
	// appended when old is empty; the error must contain every want.
	const at = "p.yaml:"
	entryText := strings.TrimPrefix(example, tables+"retention:\n")
	pathsBlock := example[strings.Index(example, "    paths:\n"):]
	const afterExpiry = "    after_expiry: a redelivery is applied again; the ledger's unique payout id is the durable guard\n"
	cases := []struct {
		name, old, new string
		want           []string
	}{
		{"no paths", pathsBlock, "", []string{at + "12: retention[0] (payments): paths: required"}},
		{"empty paths", pathsBlock, "    paths: []\n", []string{at + "24: retention[0] (payments): paths: required"}},
		{"unbounded without a bound", "    permanent_key: [consumer, business_key]\n", "",
			[]string{at + "37: retention[0] (payments): paths[6].unbounded: ", `path "manual backfill" lets any history be replayed`,
				"no finite retention", "set max_backfill_age", "permanent business key (permanent_key)"}},
		{"empty path name", "name: broker redelivery", "name: ''", []string{at + "25: retention[0] (payments): paths[0].name: required"}},
		{"missing path name", "- name: broker redelivery\n        stages", "- stages", []string{"paths[0].name: required"}},
		{"duplicate path name", "name: offset rewind", "name: broker redelivery",
			[]string{at + "27: retention[0] (payments): paths[1].name: ", `"broker redelivery" is listed twice (first as paths[0])`}},
		{"no stages", "        stages: [{ after: 14d, from: event_time }]\n", "", []string{"paths[0].stages: required", "unbounded: true"}},
		{"stage without after or deadline", "{ after: 14d, from: event_time }", "{ from: event_time }",
			[]string{at + "26: retention[0] (payments): paths[0].stages[0]: give after (a duration) or deadline"}},
		{"zero duration", "after: 14d", "after: 0", []string{"paths[0].stages[0].after: must be positive"}},
		{"negative duration", "after: 3d }", "after: -3d }", []string{"paths[4].stages[1].after: must be positive"}},
		{"bad duration", "after: 14d", "after: 2 weeks", []string{"paths[0].stages[0].after: ", `"2 weeks" is not a duration`}},
		{"from on a later stage", "{ name: backlog, after: 3d }", "{ name: backlog, after: 3d, from: event_time }",
			[]string{at + "34: retention[0] (payments): paths[4].stages[1].from: only the first stage has an anchor"}},
		{"unknown from", "after: 10d, from: event_time", "after: 10d, from: publish_time",
			[]string{"paths[1].stages[0].from: ", `"publish_time" is not an anchor; use event_time or first_seen`}},
		{"first stage without from", "{ after: 14d, from: event_time }", "{ after: 14d }",
			[]string{"paths[0].stages[0].from: required on the first stage"}},
		{"deadline on a later stage", "{ name: backlog, after: 3d }", "{ name: backlog, deadline: 2027-01-01T00:00:00Z }",
			[]string{"paths[4].stages[1].deadline: only the first stage may be a deadline"}},
		{"deadline with from", "{ deadline: 2027-03-01T00:00:00Z }", "{ deadline: 2027-03-01T00:00:00Z, from: event_time }",
			[]string{"paths[5].stages[0].from: a deadline is an instant of its own"}},
		{"deadline with after", "{ deadline: 2027-03-01T00:00:00Z }", "{ deadline: 2027-03-01T00:00:00Z, after: 1d }",
			[]string{"paths[5].stages[0].deadline: give after or deadline, not both"}},
		{"bad deadline", "deadline: 2027-03-01T00:00:00Z", "deadline: next spring",
			[]string{"paths[5].stages[0].deadline: must be an RFC 3339 time"}},
		{"unbounded with stages", "        unbounded: true\n", "        unbounded: true\n        stages: [{after: 1d, from: event_time}]\n",
			[]string{"paths[6].stages: ", "is unbounded, so it has no stages"}},
		{"duplicate scope", "", entryText, []string{at + "39: retention[1] (payments): scope: ", `"payments" is listed twice (first as retention[0] on line 12)`}},
		{"table not in policy", "table: public.consumer_inbox\n    producer", "table: public.nope\n    producer",
			[]string{at + "13: retention[0] (payments): table: public.nope is not among the tables of the policy file p.yaml"}},
		{"bad table name", "table: public.consumer_inbox\n    producer", "table: consumer_inbox\n    producer", []string{"table: ", "a schema is required"}},
		{"first_seen without the column", "table: public.consumer_inbox\n    producer", "table: public.plain\n    producer",
			[]string{at + "30: retention[0] (payments): paths[2].stages[0].from: ", `path "dead-letter redrive" counts from the first receipt, but table public.plain has no first_seen column`}},
		{"event_time without the column", "table: public.consumer_inbox\n    producer", "table: public.plain\n    producer",
			[]string{at + "26: retention[0] (payments): paths[0].stages[0].from: ", `path "broker redelivery" counts from the event time, but table public.plain has no event_time column`}},
		{"backfill without event_time", "table: public.consumer_inbox\n    producer", "table: public.plain\n    max_backfill_age: 60d\n    producer",
			[]string{"retention[0] (payments): max_backfill_age: counts from the event time, but table public.plain has no event_time column"}},
		{"max_backfill_age not positive", "    permanent_key:", "    max_backfill_age: 0d\n    permanent_key:", []string{"max_backfill_age: must be positive"}},
		{"on_duplicate without cap", "      owner: payments-oncall\n", "      owner: payments-oncall\n      on_duplicate: true\n      by: 7d\n",
			[]string{at + "20: retention[0] (payments): extension.cap: required with on_duplicate"}},
		{"on_duplicate without by", "      owner: payments-oncall\n", "      owner: payments-oncall\n      on_duplicate: true\n      cap: 90d\n",
			[]string{"extension.by: required with on_duplicate"}},
		{"cap shorter than the retention", "      owner: payments-oncall\n", "      owner: payments-oncall\n      on_duplicate: true\n      by: 7d\n      cap: 40d\n",
			[]string{at + "24: retention[0] (payments): extension.cap: 40d is shorter than the retention 50d"}},
		{"by without on_duplicate", "      owner: payments-oncall\n", "      owner: payments-oncall\n      by: 7d\n", []string{"extension.by: only meaningful with on_duplicate: true"}},
		{"cap without on_duplicate", "      owner: payments-oncall\n", "      owner: payments-oncall\n      cap: 90d\n", []string{"extension.cap: only meaningful with on_duplicate: true"}},
		{"no extension", "    extension:\n      owner: payments-oncall\n", "", []string{"retention[0] (payments): extension: required"}},
		{"no extension owner", "      owner: payments-oncall\n", "      on_duplicate: false\n", []string{at + "20: retention[0] (payments): extension.owner: required"}},
		{"no scope", "  - scope: payments\n    table", "  - table", []string{at + "12: retention[0]: scope: required"}},
		{"no consequence", "    consequence: high\n", "", []string{"retention[0] (payments): consequence: required"}},
		{"no owner", "    owner: payments-team\n", "", []string{"retention[0] (payments): owner: required"}},
		{"no margin", "    margin: 2d\n", "", []string{"retention[0] (payments): margin: required", "0d only with a margin_reason"}},
		{"negative margin", "margin: 2d", "margin: -1h", []string{at + "17: retention[0] (payments): margin: must not be negative"}},
		{"no margin reason", "    margin_reason: clock skew, scheduler delay, delayed cleanup\n", "", []string{"margin_reason: required"}},
		{"no after_expiry", afterExpiry, "", []string{"retention[0] (payments): after_expiry: required"}},
		{"empty after_expiry", afterExpiry, "    after_expiry: ''\n", []string{at + "19: retention[0] (payments): after_expiry: required"}},
		{"empty permanent_key", "permanent_key: [consumer, business_key]", "permanent_key: []", []string{"permanent_key: must name at least one column"}},
		{"duplicate permanent_key", "permanent_key: [consumer, business_key]", "permanent_key: [consumer, consumer]", []string{`permanent_key[1]: "consumer" is already permanent_key[0]`}},
		{"unknown field", "    owner: payments-team\n", "    owner: payments-team\n    ttl: 7d\n",
			[]string{at + "17: retention[0] (payments): ", `unknown field "ttl"`, "known: scope, table"}},
		{"unknown stage field", "{ after: 14d, from: event_time }", "{ after: 14d, from: event_time, to: x }",
			[]string{"retention[0] (payments): paths[0].stages[0]: ", `unknown field "to"`}},
		{"field twice", "    owner: payments-team\n", "    owner: payments-team\n    owner: x\n", []string{"retention[0] (payments): owner: set twice"}},
		{"entry not a mapping", "  - scope: payments\n", "  - just text\n  - scope: payments\n", []string{"retention[0]: must be a mapping"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			doc := example + c.new
			if c.old != "" {
				if !strings.Contains(example, c.old) {
					t.Fatalf("the example lacks %q", c.old)
				}
				doc = strings.Replace(example, c.old, c.new, 1)
			}
			plans, err := parse(t, doc)
			if err == nil {
				t.Fatalf("no error; got %+v", plans)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// Every problem is reported at once, in file order.
func TestPlanReportsAll(t *testing.T) {
	t.Parallel()
	doc := strings.Replace(strings.Replace(example, "margin: 2d", "margin: -2d", 1), "after: 10d, from: event_time", "after: 10d", 1)
	_, err := parse(t, doc)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	i, j := strings.Index(msg, "p.yaml:17: retention[0] (payments): margin:"), strings.Index(msg, "p.yaml:28: retention[0] (payments): paths[1].stages[0].from:")
	if i < 0 || j < i {
		t.Errorf("got\n%s", msg)
	}
}

// The installed rule is compared term by term, the extension on duplicates
// too, at the microsecond the control schema keeps.
func TestCheckInstalled(t *testing.T) {
	day := 24 * time.Hour
	deadline := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	policy := Rule{Scope: "payments", PostReceipt: 30 * day, Replay: 48 * day, Deadline: &deadline, Margin: 2 * day,
		Extension: Extension{OnDuplicate: true, By: 7 * day, Cap: 90 * day}}
	later := deadline.Add(time.Second)
	for _, c := range []struct {
		name   string
		change func(r *Rule)
		want   string
	}{
		{"the same", func(*Rule) {}, "OK"},
		{"the same at the microsecond", func(*Rule) {}, "OK"}, // the policy's margin has 400ns more, below
		{"another margin", func(r *Rule) { r.Margin = 5 * day }, "FAIL"},
		{"no replay scenario", func(r *Rule) { r.Replay = 0 }, "FAIL"},
		{"another deadline", func(r *Rule) { r.Deadline = &later }, "FAIL"},
		{"no deadline", func(r *Rule) { r.Deadline = nil }, "FAIL"},
		{"no extension", func(r *Rule) { r.Extension.OnDuplicate = false }, "FAIL"},
		{"another extension cap", func(r *Rule) { r.Extension.Cap = 60 * day }, "FAIL"},
	} {
		installed := policy
		c.change(&installed)
		p := policy
		if c.name == "the same at the microsecond" {
			p.Margin += 400 * time.Nanosecond // the control schema keeps microseconds
		}
		if v := CheckInstalled(p, &installed); v.Result != c.want {
			t.Errorf("%s: %s, want %s", c.name, v, c.want)
		}
	}
	if v := CheckInstalled(policy, nil); v.Result != "SKIP" {
		t.Errorf("none installed: %s, want SKIP", v)
	}
	v := CheckInstalled(policy, &Rule{Scope: "payments", PostReceipt: 30 * day, Margin: 2 * day})
	if want := "installed rule: remember_until = first_seen + 30d + 2d, where the policy says remember_until = max(first_seen + 30d, event_time + 48d, 2026-03-01T00:00:00Z) + 2d (a duplicate extends it to now + 7d, at most first_seen + 90d)"; !strings.HasPrefix(v.Detail, want) {
		t.Errorf("detail %q, want it to begin %q", v.Detail, want)
	}
}
