package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestResolveErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.ok (id int, "Seen" timestamptz, naive timestamp, txt text, ev timestamptz);
CREATE INDEX ON public.ok ("Seen");
CREATE INDEX ON public.ok (naive);
CREATE TABLE public.noindex (id int, e timestamptz);
CREATE TABLE public.partial (id int, e timestamptz);
CREATE INDEX ON public.partial (e) WHERE id > 0;
CREATE TABLE public.second (id int, e timestamptz);
CREATE INDEX ON public.second (id, e);
CREATE TABLE public.parted (id int, e timestamptz) PARTITION BY RANGE (e);
CREATE VIEW public.v AS SELECT * FROM public.ok;`)

	cases := []struct {
		name, yaml string
		want       []string // substrings of the error; nil = resolves
	}{
		{"ok", `table: public.ok
    key: [id]
    scope: txt
    event_time: ev
    first_seen: naive
    expires_at: Seen`, nil},
		{"naive timestamp", `table: public.ok
    key: [id]
    expires_after: {column: naive, after: 1d}`, nil},
		{"missing table", `table: public.nope
    key: [id]
    expires_at: e`, []string{"public.nope", "table", "no such table"}},
		{"missing column", `table: public.ok
    key: [nope]
    expires_at: Seen`, []string{"public.ok", "key[0]", `"nope" does not exist`}},
		{"case slip", `table: public.ok
    key: [id]
    expires_at: seen`, []string{"expires_at", `did you mean "Seen"`}},
		{"wrong type", `table: public.ok
    key: [id]
    expires_at: txt`, []string{"expires_at", "is text", "timestamptz"}},
		{"wrong event_time type", `table: public.ok
    key: [id]
    event_time: txt
    expires_at: Seen`, []string{"event_time", "is text"}},
		{"wrong first_seen type", `table: public.ok
    key: [id]
    first_seen: txt
    expires_at: Seen`, []string{"first_seen", "is text"}},
		{"missing first_seen column", `table: public.ok
    key: [id]
    first_seen: nope
    expires_at: Seen`, []string{"first_seen", `"nope" does not exist`}},
		{"missing scope column", `table: public.ok
    key: [id]
    scope: nope
    expires_at: Seen`, []string{"scope", `"nope" does not exist`}},
		{"no index", `table: public.noindex
    key: [id]
    expires_at: e`, []string{"public.noindex", "no valid btree index leads with column", "CREATE INDEX CONCURRENTLY"}},
		{"partial index only", `table: public.partial
    key: [id]
    expires_at: e`, []string{"no valid btree index"}},
		{"index not leading", `table: public.second
    key: [id]
    expires_after: {column: e, after: 1h}`, []string{"expires_after.column", "no valid btree index"}},
		{"partitioned", `table: public.parted
    key: [id]
    expires_at: e`, []string{"partitioned"}},
		{"view", `table: public.v
    key: [id]
    expires_at: Seen`, []string{"not a table"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := policy.Parse([]byte("tables:\n  - "+c.yaml+"\n"), "p.yaml")
			if err != nil {
				t.Fatal(err)
			}
			_, err = catalog.Resolve(ctx, pool, p.Tables[0])
			if c.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, catalog.ErrInvalid) {
				t.Fatalf("error %v, want ErrInvalid", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
