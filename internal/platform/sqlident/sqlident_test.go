package sqlident

import (
	"strings"
	"testing"
)

func TestQuoteIdent(t *testing.T) {
	t.Parallel()
	if got := QuoteIdent(`a"b`); got != `"a""b"` {
		t.Errorf("QuoteIdent = %s", got)
	}
	if got := (QualifiedName{"public", "InboxState"}).Sanitize(); got != `"public"."InboxState"` {
		t.Errorf("Sanitize = %s", got)
	}
}

func TestQualifiedName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, str string
		want    QualifiedName
	}{
		{"public.consumer_inbox", "public.consumer_inbox", QualifiedName{"public", "consumer_inbox"}},
		{"Public.Consumer_Inbox", "public.consumer_inbox", QualifiedName{"public", "consumer_inbox"}},
		{` public . "InboxState" `, `public."InboxState"`, QualifiedName{"public", "InboxState"}},
		{`public."weird ""name""; drop table x"`, `public."weird ""name""; drop table x"`, QualifiedName{"public", `weird "name"; drop table x`}},
		{`"a.b"."c d"`, `"a.b"."c d"`, QualifiedName{"a.b", "c d"}},
		{`s.t$1`, `s.t$1`, QualifiedName{"s", "t$1"}},
		{`s."1t"`, `s."1t"`, QualifiedName{"s", "1t"}},
		{`"schéma"."ta""ble"`, `"schéma"."ta""ble"`, QualifiedName{"schéma", `ta"ble`}},
	}
	for _, tt := range tests {
		got, err := ParseQualifiedName(tt.in)
		if err != nil || got != tt.want || got.String() != tt.str {
			t.Errorf("ParseQualifiedName(%q) = %#v (%s), %v; want %#v (%s)", tt.in, got, got, err, tt.want, tt.str)
		}
	}
	for _, bad := range []string{"", "x", `"x"`, "a.b.c", "a..b", ".b", "a.", `a."b`, `a.""`, `a."b"c`, "a.b c", "a.b-c", "a.1b", "a.b;", "a.\x00"} {
		if q, err := ParseQualifiedName(bad); err == nil {
			t.Errorf("ParseQualifiedName(%q) = %#v, want error", bad, q)
		}
	}
	// Longer than PostgreSQL keeps: it would name the table cut to 63
	// bytes, another than the one meant. 63 bytes are fine.
	long := "public." + strings.Repeat("t", 63)
	if _, err := ParseQualifiedName(long); err != nil {
		t.Errorf("a 63-byte name: %v", err)
	}
	if _, err := ParseQualifiedName(long + "x"); err == nil || !strings.Contains(err.Error(), "64 bytes long; PostgreSQL names are at most 63 bytes") {
		t.Errorf("a 64-byte name: %v", err)
	}
	if _, err := ParseQualifiedName(`public."` + strings.Repeat("é", 32) + `"`); err == nil || !strings.Contains(err.Error(), "read it as") {
		t.Errorf("a 64-byte name of two-byte characters: %v", err)
	}
}

func FuzzQualifiedNameRoundTrip(f *testing.F) {
	for _, s := range [][2]string{
		{"public", "consumer_inbox"}, {"Public", "InboxState"}, {"public", `weird "name"; drop table x`},
		{" a ", "b.c"}, {`"`, `""`}, {"1", "$x"}, {"a\nb", "\t"}, {"schéma", "\xff"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, schema, name string) {
		// Any text that parses must print back to the same name.
		if q, err := ParseQualifiedName(schema + "." + name); err == nil {
			if r, err := ParseQualifiedName(q.String()); err != nil || r != q {
				t.Errorf("%#v printed as %s parsed back as %#v, %v", q, q, r, err)
			}
		}
		if schema == "" || name == "" || strings.ContainsRune(schema+name, 0) || len(schema) > MaxIdentBytes || len(name) > MaxIdentBytes {
			return
		}
		q := QualifiedName{schema, name}
		if r, err := ParseQualifiedName(q.String()); err != nil || r != q {
			t.Errorf("%#v printed as %s parsed back as %#v, %v", q, q, r, err)
		}
	})
}

// A name typed without quotes folds to lower case: the suggestion is the
// quoted spelling of the table that differs only in case; else a near
// miss; nothing when none is near.
func TestClosest(t *testing.T) {
	t.Parallel()
	cols := []string{"Delivered", "MessageId", "ConsumerId", "keep_until", "status"}
	for name, want := range map[string]string{
		"delivered": "Delivered", "messageid": "MessageId", "keep_untill": "keep_until", "Status": "status", "stauts": "status",
	} {
		if got, ok := Closest(name, cols); !ok || got != want {
			t.Errorf("Closest(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
	for _, far := range []string{"payload", "x", "DeliveredAtUtcTimestamp"} {
		if got, ok := Closest(far, cols); ok {
			t.Errorf("Closest(%q) = %q; want none", far, got)
		}
	}
	tables := []QualifiedName{{"public", "InboxState"}, {"public", "OutboxMessage"}, {"cap", "received"}}
	typed, _ := ParseQualifiedName("public.InboxState")
	if got, ok := ClosestTable(typed, tables); !ok || got.String() != `public."InboxState"` {
		t.Errorf("ClosestTable(%s) = %s, %v", typed, got, ok)
	}
	if got, ok := ClosestTable(QualifiedName{"cap", "recieved"}, tables); !ok || got.String() != "cap.received" {
		t.Errorf("ClosestTable(cap.recieved) = %s, %v", got, ok)
	}
	if got, ok := ClosestTable(QualifiedName{"public", "jobs"}, tables); ok {
		t.Errorf("ClosestTable(public.jobs) = %s", got)
	}
}
