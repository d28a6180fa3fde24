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
// described; a reference table and a Citus local table are managed, known
// as going through Citus (and the reference table as one); a plain local
// table is managed like any table; an append-distributed table, one
// distributed on a column outside the policy's key, and delete_referencing
// on a reference table, are refused by name.
func TestCitusTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewCitusPool(t)
	for _, sql := range []string{
		`CREATE TABLE public.inbox (consumer text, id text, e timestamptz, PRIMARY KEY (consumer, id)); CREATE INDEX ON public.inbox (e)`,
		`SET citus.shard_count = 4; SELECT create_distributed_table('public.inbox', 'consumer')`,
		`CREATE TABLE public.ref (id int PRIMARY KEY, e timestamptz); CREATE INDEX ON public.ref (e); SELECT create_reference_table('public.ref')`,
		`CREATE TABLE public.refkids (id int REFERENCES public.ref (id)); SELECT create_reference_table('public.refkids')`,
		`CREATE TABLE public.local (id int, e timestamptz); CREATE INDEX ON public.local (e)`,
		`CREATE TABLE public.citlocal (id int, e timestamptz); CREATE INDEX ON public.citlocal (e); SELECT citus_add_local_table_to_metadata('public.citlocal')`,
		`CREATE TABLE public.appended (id int, e timestamptz); CREATE INDEX ON public.appended (e); SELECT create_distributed_table('public.appended', 'id', 'append')`,
	} {
		pgtest.Exec(t, pool, sql)
	}
	resolve := func(table, key string, more ...string) (*catalog.Table, error) {
		p, err := policy.Parse([]byte("tables:\n  - table: "+table+"\n    key: ["+key+"]\n    expires_at: e\n"+strings.Join(more, "")), "test.yaml")
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
	for name, want := range map[string][2]bool{"public.ref": {true, true}, "public.citlocal": {true, false}, "public.local": {false, false}} {
		tb, err := resolve(name, "id")
		if err != nil || tb.Distributed() {
			t.Errorf("%s: distributed=%v, %v; want managed, not distributed", name, tb != nil && tb.Distributed(), err)
		} else if tb.InCitusMetadata != want[0] || tb.ThroughCitus() != want[0] || tb.CitusReference != want[1] || tb.Shards() != 1 {
			t.Errorf("%s: in Citus metadata %v, through Citus %v, reference %v, %d shards; want %v, %v, %v, 1", name, tb.InCitusMetadata, tb.ThroughCitus(), tb.CitusReference, tb.Shards(), want[0], want[0], want[1])
		}
	}
	if _, err := resolve("public.ref", "id", "    delete_referencing: [public.refkids]\n"); !errors.Is(err, catalog.ErrInvalid) ||
		!strings.Contains(err.Error(), "delete_referencing") || !strings.Contains(err.Error(), "Citus reference or Citus local table") {
		t.Errorf("delete_referencing on a reference table: %v", err)
	}
	for _, name := range []string{"public.ref", "public.citlocal", "public.inbox"} {
		key := "id"
		if name == "public.inbox" {
			key = "consumer, id"
		}
		if _, err := resolve(name, key, "    compact: {free_ratio: 0.5}\n"); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), "compact") || !strings.Contains(err.Error(), "compact its shards or copies on each node") {
			t.Errorf("compact on %s: %v", name, err)
		}
	}
	if _, err := resolve("public.appended", "id"); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), "append-distributed") {
		t.Errorf("append-distributed table: %v", err)
	}
}
