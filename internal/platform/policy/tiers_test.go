package policy

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// plainPolicy is inbox.PlainPolicy, the recommended table's entry, read from
// the file that package embeds: inbox imports this package, so its tests
// cannot import inbox.
var plainPolicy = func() string {
	b, err := os.ReadFile("../../../inbox/schema/plain-policy.yaml")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// tieredHead is the recommended table's entry up to its tiers section.
var tieredHead = plainPolicy + "    tiers:\n"

func TestParseTiers(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(tieredHead+`      hot_for: 3d
      anchor: first_seen_at
      payload_columns: [payload, "Headers"]
      permanent_key:
        columns: [consumer, business_key]
        hash: payload_hash
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Tiers{HotFor: 72 * time.Hour, Anchor: "first_seen_at", PayloadColumns: []string{"payload", "Headers"},
		PermanentKey: &PermanentKey{Columns: []string{"consumer", "business_key"}, Hash: "payload_hash",
			Table: sqlident.QualifiedName{Schema: "inboxkeeper", Name: "keys_public_consumer_inbox"}}}
	if got := p.Tables[0].Tiers; !reflect.DeepEqual(got, want) {
		t.Errorf("tiers = %+v\nwant %+v", got, want)
	}

	p, err = Parse([]byte(tieredHead+`      hot_for: 72h
      anchor: first_seen_at
      payload_table: 'app."Inbox Payload"'
      permanent_key: {columns: [business_key], table: 'audit."Keys"'}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Tables[0].Tiers
	if tr.PayloadTable == nil || *tr.PayloadTable != (sqlident.QualifiedName{Schema: "app", Name: "Inbox Payload"}) || tr.PayloadColumns != nil {
		t.Errorf("payload table = %v, columns %v", tr.PayloadTable, tr.PayloadColumns)
	}
	if tr.PermanentKey.Table != (sqlident.QualifiedName{Schema: "audit", Name: "Keys"}) || tr.PermanentKey.Hash != "" {
		t.Errorf("permanent key = %+v", tr.PermanentKey)
	}
	if p.Tables[0].Partitions != nil {
		t.Errorf("partitions set without a partitions section")
	}
}

func TestDefaultKeyTable(t *testing.T) {
	t.Parallel()
	if got := DefaultKeyTable(sqlident.QualifiedName{Schema: "Odd Schema", Name: `we"ird`}); got != (sqlident.QualifiedName{Schema: "inboxkeeper", Name: `keys_Odd Schema_we"ird`}) {
		t.Errorf("got %v", got)
	}
	long1 := DefaultKeyTable(sqlident.QualifiedName{Schema: "public", Name: strings.Repeat("a", 60) + "1"})
	long2 := DefaultKeyTable(sqlident.QualifiedName{Schema: "public", Name: strings.Repeat("a", 60) + "2"})
	if len(long1.Name) > 63 || len(long2.Name) > 63 {
		t.Errorf("names longer than 63 bytes: %q, %q", long1.Name, long2.Name)
	}
	if long1 == long2 {
		t.Errorf("two long names map to one key table %v", long1)
	}
	// A multi-byte character is not cut in half.
	u := DefaultKeyTable(sqlident.QualifiedName{Schema: "public", Name: strings.Repeat("é", 40)})
	if !strings.HasPrefix(u.Name, "keys_public_é") || strings.ToValidUTF8(u.Name, "?") != u.Name || len(u.Name) > 63 {
		t.Errorf("utf-8 name cut badly: %q", u.Name)
	}
}

func TestParseTiersErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body string
		want       []string
	}{
		{"missing hot_for", "      anchor: first_seen_at\n      payload_columns: [payload]\n",
			[]string{"p.yaml:8: tables[0] (public.consumer_inbox): tiers.hot_for: required"}},
		{"zero hot_for", "      hot_for: 0\n      anchor: a\n      payload_columns: [payload]\n",
			[]string{"p.yaml:9: tables[0] (public.consumer_inbox): tiers.hot_for: must be positive"}},
		{"negative hot_for", "      hot_for: -1h\n      anchor: a\n      payload_columns: [payload]\n", []string{"p.yaml:9:", "tiers.hot_for: must be positive"}},
		{"bad hot_for", "      hot_for: 3 days\n      anchor: a\n      payload_columns: [payload]\n", []string{"p.yaml:9:", "tiers.hot_for:", `"3 days" is not a duration`}},
		{"missing anchor", "      hot_for: 1d\n      payload_columns: [payload]\n", []string{"p.yaml:8:", "tiers.anchor: required"}},
		{"no payload", "      hot_for: 1d\n      anchor: a\n", []string{"p.yaml:8:", "tiers: payload_columns or payload_table is required"}},
		{"both payloads", "      hot_for: 1d\n      anchor: a\n      payload_columns: [payload]\n      payload_table: public.p\n",
			[]string{"p.yaml:12:", "tiers.payload_table: cannot be combined with payload_columns"}},
		{"empty payload list", "      hot_for: 1d\n      anchor: a\n      payload_columns: []\n", []string{"p.yaml:11:", "tiers.payload_columns: must list at least one"}},
		{"payload is a key column", "      hot_for: 1d\n      anchor: a\n      payload_columns: [payload, message_id]\n",
			[]string{"p.yaml:11:", "tiers.payload_columns[1]: column \"message_id\" is key[1]"}},
		{"payload is the scope", "      hot_for: 1d\n      anchor: a\n      payload_columns: [consumer]\n", []string{"tiers.payload_columns[0]", "is key[0]"}},
		{"payload is the expiry", "      hot_for: 1d\n      anchor: a\n      payload_columns: [remember_until]\n", []string{"tiers.payload_columns[0]", "the expiry column"}},
		{"payload is the anchor", "      hot_for: 1d\n      anchor: a\n      payload_columns: [a]\n", []string{"tiers.payload_columns[0]", "is tiers.anchor"}},
		{"payload is the event time", "      hot_for: 1d\n      anchor: a\n      payload_columns: [event_time]\n", []string{"tiers.payload_columns[0]", "is event_time"}},
		{"payload is the hash", "      hot_for: 1d\n      anchor: a\n      payload_columns: [payload_hash]\n      permanent_key: {columns: [business_key], hash: payload_hash}\n",
			[]string{"p.yaml:11:", "tiers.payload_columns[0]", "never demoted separately from the identity it proves"}},
		{"payload is a permanent key column", "      hot_for: 1d\n      anchor: a\n      payload_columns: [business_key]\n      permanent_key: {columns: [business_key]}\n",
			[]string{"tiers.payload_columns[0]", "tiers.permanent_key.columns[0]"}},
		{"duplicate payload column", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p, q, p]\n", []string{"tiers.payload_columns[2]", "already payload_columns[0]"}},
		{"empty payload column", "      hot_for: 1d\n      anchor: a\n      payload_columns: ['']\n", []string{"tiers.payload_columns[0]", "empty"}},
		{"payload table bad name", "      hot_for: 1d\n      anchor: a\n      payload_table: payload\n", []string{"p.yaml:11:", "tiers.payload_table", "schema is required"}},
		{"payload table is the table", "      hot_for: 1d\n      anchor: a\n      payload_table: PUBLIC.consumer_inbox\n", []string{"tiers.payload_table", "is the table itself"}},
		{"permanent key without columns", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      permanent_key: {hash: h}\n",
			[]string{"p.yaml:12:", "tiers.permanent_key.columns: required"}},
		{"permanent key duplicate column", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      permanent_key: {columns: [k, k]}\n",
			[]string{"tiers.permanent_key.columns[1]", "already columns[0]"}},
		{"permanent key hash is a key column", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      permanent_key: {columns: [k], hash: k}\n",
			[]string{"tiers.permanent_key.hash", "already one of the key columns"}},
		{"permanent key named first_seen", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      permanent_key: {columns: [first_seen]}\n",
			[]string{"tiers.permanent_key.columns[0]", "clashes with the first_seen date column"}},
		{"permanent key table bad", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      permanent_key: {columns: [k], table: keys}\n",
			[]string{"tiers.permanent_key.table", "schema is required"}},
		{"unknown field", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      payload_colums: [q]\n",
			[]string{"p.yaml:12:", `unknown field "payload_colums"`, "known: hot_for, anchor, payload_columns, payload_table, permanent_key"}},
		{"unknown permanent key field", "      hot_for: 1d\n      anchor: a\n      payload_columns: [p]\n      permanent_key: {columns: [k], hsh: h}\n",
			[]string{"p.yaml:12:", `tiers.permanent_key: unknown field "hsh"`}},
		{"tiers not a mapping", "      - hot_for\n", []string{"p.yaml:9:", "tiers: must be a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse([]byte(tieredHead+tt.body), "p.yaml")
			if err == nil {
				t.Fatalf("no error; got %+v", p.Tables[0].Tiers)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// Two inboxes may not share a permanent key table: named so, or by their
// default names, which meet for public.x_y and public_x.y.
func TestPermanentKeyTableShared(t *testing.T) {
	entry := func(table, keyTable string) string {
		s := "  - table: " + table + "\n    key: [consumer, message_id]\n    expires_at: remember_until\n" +
			"    tiers:\n      hot_for: 1d\n      anchor: a\n      payload_columns: [payload]\n      permanent_key: {columns: [business_key]"
		if keyTable != "" {
			s += ", table: " + keyTable
		}
		return s + "}\n"
	}
	for name, c := range map[string]struct{ policy, want string }{
		"default names": {"tables:\n" + entry("public.x_y", "") + entry("public_x.y", ""),
			"p.yaml:17: tables[1] (public_x.y): tiers.permanent_key.table: inboxkeeper.keys_public_x_y is already the permanent key table of public.x_y"},
		"named": {"tables:\n" + entry("public.a", "audit.keys") + entry("public.b", "audit.keys"),
			"p.yaml:17: tables[1] (public.b): tiers.permanent_key.table: audit.keys is already the permanent key table of public.a"},
	} {
		_, err := Parse([]byte(c.policy), "p.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	if _, err := Parse([]byte("tables:\n"+entry("public.a", "")+entry("public.b", "")), "p.yaml"); err != nil {
		t.Errorf("two tables, each its own key table: %v", err)
	}
}
