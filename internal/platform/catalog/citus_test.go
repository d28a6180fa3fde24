package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// On a real Citus coordinator: a hash-distributed table is managed and
// described; a reference table and a local table are managed like any
// table; an append-distributed table, and one distributed on a column
// outside the policy's key, are refused by name.
func TestCitusTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewCitusPool(t)
	for _, sql := range []string{
		`CREATE TABLE public.inbox (consumer text, id text, e timestamptz, PRIMARY KEY (consumer, id)); CREATE INDEX ON public.inbox (e)`,
		`SET citus.shard_count = 4; SELECT create_distributed_table('public.inbox', 'consumer')`,
		`CREATE TABLE public.ref (id int PRIMARY KEY, e timestamptz); CREATE INDEX ON public.ref (e); SELECT create_reference_table('public.ref')`,
		`CREATE TABLE public.local (id int, e timestamptz); CREATE INDEX ON public.local (e)`,
		`CREATE TABLE public.appended (id int, e timestamptz); CREATE INDEX ON public.appended (e); SELECT create_distributed_table('public.appended', 'id', 'append')`,
	} {
		pgtest.Exec(t, pool, sql)
	}
	resolve := func(table, key string) (*catalog.Table, error) {
		p, err := policy.Parse([]byte("tables:\n  - table: "+table+"\n    key: ["+key+"]\n    expires_at: e\n"), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return catalog.Resolve(ctx, pool, p.Tables[0])
	}
	tb, err := resolve("public.inbox", "consumer, id")
	if err != nil {
		t.Fatalf("hash-distributed table: %v", err)
	}
	if !tb.Distributed() || !tb.InCitusMetadata || tb.Citus.Column.Name != "consumer" || tb.Citus.Shards != 4 || len(tb.Citus.Workers) != pgtest.CitusWorkers {
		t.Errorf("distribution = %+v, want consumer, 4 shards on %d workers", tb.Citus, pgtest.CitusWorkers)
	}
	if _, err := resolve("public.inbox", "id"); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), `distributed on "consumer", which is not one of the key columns`) {
		t.Errorf("distribution column outside the key: %v", err)
	}
	for name, inMetadata := range map[string]bool{"public.ref": true, "public.local": false} {
		tb, err := resolve(name, "id")
		if err != nil || tb.Distributed() {
			t.Errorf("%s: distributed=%v, %v; want managed as an ordinary table", name, tb != nil && tb.Distributed(), err)
		} else if tb.InCitusMetadata != inMetadata {
			t.Errorf("%s: in Citus metadata = %v, want %v", name, tb.InCitusMetadata, inMetadata)
		}
	}
	if _, err := resolve("public.appended", "id"); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), "append-distributed") {
		t.Errorf("append-distributed table: %v", err)
	}
}
