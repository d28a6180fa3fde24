package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/tiering"
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

// The tiers tables of a distributed inbox: a side table and an existing
// permanent key table must be hash-distributed on the inbox's column and
// co-located with it, and the permanent key must include that column; each
// refusal names the statement that fixes it.
func TestCitusTiers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewCitusPool(t)
	pgtest.Exec(t, pool, `CREATE SCHEMA inboxkeeper;
CREATE TABLE public.inbox (consumer text NOT NULL, id text NOT NULL, seen timestamptz, e timestamptz, bk text, PRIMARY KEY (consumer, id));
CREATE INDEX ON public.inbox (e);
CREATE TABLE public.side (consumer text NOT NULL, id text NOT NULL, seen timestamptz, body text, PRIMARY KEY (consumer, id));
CREATE INDEX ON public.side (seen);
CREATE TABLE public.side_local (LIKE public.side INCLUDING ALL);
CREATE TABLE inboxkeeper.keys_good (consumer text NOT NULL, bk text NOT NULL, first_seen date, PRIMARY KEY (consumer, bk));
CREATE TABLE inboxkeeper.keys_local (LIKE inboxkeeper.keys_good INCLUDING ALL);
CREATE TABLE inboxkeeper.keys_apart (LIKE inboxkeeper.keys_good INCLUDING ALL);
SET citus.shard_count = 4;
SELECT create_distributed_table('public.inbox', 'consumer');
SELECT create_distributed_table('public.side', 'consumer', colocate_with => 'public.inbox');
SELECT create_distributed_table('inboxkeeper.keys_good', 'consumer', colocate_with => 'public.inbox');
SET citus.shard_count = 3;
SELECT create_distributed_table('inboxkeeper.keys_apart', 'consumer', colocate_with => 'none');`)
	resolve := func(side, key string) (*catalog.Table, error) {
		p, err := policy.Parse([]byte(`tables:
  - table: public.inbox
    key: [consumer, id]
    expires_at: e
    tiers:
      hot_for: 1d
      anchor: seen
      payload_table: `+side+`
      permanent_key: `+key+`
`), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return catalog.Resolve(ctx, pool, p.Tables[0])
	}
	tb, err := resolve("public.side", "{columns: [consumer, bk], table: inboxkeeper.keys_good}")
	if err != nil || !tb.Distributed() || !tb.Tiers.Key.Exists {
		t.Fatalf("co-located side and key tables: %v", err)
	}
	if tb, err := resolve("public.side", "{columns: [consumer, bk], table: inboxkeeper.keys_new}"); err != nil || tb.Tiers.Key.Exists ||
		!strings.Contains(tiering.KeyTableDDL(tb), "create_distributed_table('inboxkeeper.keys_new', 'consumer', colocate_with => 'public.inbox')") {
		t.Errorf("a key table still to create: %v", err)
	}
	for _, c := range []struct{ side, key, want string }{
		{"public.side_local", "{columns: [consumer, bk], table: inboxkeeper.keys_good}",
			`tiers.payload_table: public.side_local is a local table on the Citus coordinator, but public.inbox is distributed on "consumer": distribute it the same way, co-located, as its owner: SELECT create_distributed_table('public.side_local', 'consumer', colocate_with => 'public.inbox')`},
		{"public.side", "{columns: [consumer, bk], table: inboxkeeper.keys_local}",
			`tiers.permanent_key.table: inboxkeeper.keys_local is a local table on the Citus coordinator`},
		{"public.side", "{columns: [consumer, bk], table: inboxkeeper.keys_apart}",
			`tiers.permanent_key.table: inboxkeeper.keys_apart is distributed on "consumer" but not co-located with public.inbox, so a row and its permanent key could be on different nodes: SELECT update_distributed_table_colocation('inboxkeeper.keys_apart', colocate_with => 'public.inbox')`},
		{"public.side", "{columns: [bk], table: inboxkeeper.keys_bk}",
			`tiers.permanent_key.columns: the table is distributed on "consumer", which is not one of the permanent key's columns`},
	} {
		_, err := resolve(c.side, c.key)
		if !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("side %s, key %s:\n got %v\nwant %s", c.side, c.key, err, c.want)
		}
	}
}
