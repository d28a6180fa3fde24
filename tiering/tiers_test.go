package tiering_test

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

// A tiers section is resolved with its table (catalog.Resolve runs the
// section this package registers): each problem names the table and the
// field, as the table's own problems do.
func TestResolveTiers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE SCHEMA inboxkeeper;
CREATE TABLE public.inbox (consumer text NOT NULL, message_id text NOT NULL, h bytea, seen timestamptz, naive timestamp,
  until timestamptz, bk text, payload text, headers jsonb, required text NOT NULL, ev timestamptz, PRIMARY KEY (consumer, message_id));
CREATE INDEX ON public.inbox (until);
CREATE INDEX ON public.inbox (seen) WHERE payload IS NOT NULL OR headers IS NOT NULL;
CREATE INDEX ON public.inbox (naive) WHERE payload IS NOT NULL;
CREATE TABLE public.noidx (consumer text, message_id text, seen timestamptz, payload text);
CREATE INDEX ON public.noidx (message_id, seen);

CREATE TABLE public.side (consumer text, message_id text, seen timestamptz, body text);
CREATE INDEX ON public.side (seen);
CREATE TABLE public.side_nokey (consumer text, seen timestamptz, body text);
CREATE INDEX ON public.side_nokey (seen);
CREATE TABLE public.side_type (consumer text, message_id int, seen timestamptz);
CREATE INDEX ON public.side_type (seen);
CREATE TABLE public.side_noindex (consumer text, message_id text, seen timestamptz);
CREATE TABLE public.side_scope (consumer text, message_id text, seen timestamptz, ev timestamptz);
CREATE INDEX ON public.side_scope (seen);
CREATE TABLE inboxkeeper.keys_good (consumer text NOT NULL, bk text NOT NULL, h bytea, first_seen date, PRIMARY KEY (consumer, bk));
CREATE TABLE inboxkeeper.keys_nopk (consumer text NOT NULL, bk text NOT NULL, h bytea, first_seen date);
CREATE TABLE inboxkeeper.keys_type (consumer text NOT NULL, bk int NOT NULL, h bytea, first_seen date, PRIMARY KEY (consumer, bk));
CREATE TABLE inboxkeeper.keys_nodate (consumer text NOT NULL, bk text NOT NULL, h bytea, PRIMARY KEY (consumer, bk));`)

	head := `tables:
  - table: public.inbox
    key: [consumer, message_id]
    scope: consumer
    event_time: ev
    expires_at: until
    tiers:
      hot_for: 1d
`
	cases := []struct {
		name, tiers string
		want        []string // nil = resolves
		check       func(t *testing.T, tr *tiering.Tiers)
	}{
		{"in place, partial index on both payload columns", "      anchor: seen\n      payload_columns: [payload, headers]\n", nil, func(t *testing.T, tr *tiering.Tiers) {
			if !tr.PartialIndex || len(tr.Payload) != 2 || tr.Side != nil || tr.Key != nil {
				t.Errorf("tiers %+v", tr)
			}
		}},
		{"in place, partial index not matching the payload", "      anchor: naive\n      payload_columns: [payload, headers]\n",
			[]string{"public.inbox", "tiers.anchor", `no valid btree index leads with column "naive"`, `CREATE INDEX CONCURRENTLY ON "public"."inbox" ("naive") WHERE ("payload" IS NOT NULL OR "headers" IS NOT NULL)`}, nil},
		{"in place, partial index on the one payload column", "      anchor: naive\n      payload_columns: [payload]\n", nil, func(t *testing.T, tr *tiering.Tiers) {
			if !tr.PartialIndex || tr.Anchor.IsTimestamptz() {
				t.Errorf("tiers %+v", tr)
			}
		}},
		{"anchor missing", "      anchor: Seen\n      payload_columns: [payload]\n", []string{"tiers.anchor", `column "Seen" does not exist`, `did you mean "seen"`}, nil},
		{"anchor not a timestamp", "      anchor: bk\n      payload_columns: [payload]\n", []string{"tiers.anchor", `"bk" is text`}, nil},
		{"payload column missing", "      anchor: seen\n      payload_columns: [payload, nope]\n", []string{"tiers.payload_columns[1]", `"nope" does not exist`}, nil},
		{"payload column NOT NULL", "      anchor: seen\n      payload_columns: [required]\n", []string{"tiers.payload_columns[0]", `"required" is NOT NULL`, "DROP NOT NULL", "payload_table"}, nil},
		{"side table", "      anchor: seen\n      payload_table: public.side\n", nil, func(t *testing.T, tr *tiering.Tiers) {
			if tr.Side == nil || tr.Side.Name != "public.side" || tr.Side.Kind != "r" || tr.Side.Scope == nil || tr.Side.EventTime != nil || tr.Payload != nil {
				t.Errorf("side %+v", tr.Side)
			}
		}},
		{"side table with the hold columns", "      anchor: seen\n      payload_table: public.side_scope\n", nil, func(t *testing.T, tr *tiering.Tiers) {
			if tr.Side.Scope == nil || tr.Side.EventTime == nil {
				t.Errorf("side %+v", tr.Side)
			}
		}},
		{"side table missing", "      anchor: seen\n      payload_table: public.nope\n", []string{"tiers.payload_table", "no such table", `name "nope"`}, nil},
		{"side table without a key column", "      anchor: seen\n      payload_table: public.side_nokey\n", []string{"tiers.payload_table", `public.side_nokey has no key column "message_id"`}, nil},
		{"side table key of another type", "      anchor: seen\n      payload_table: public.side_type\n", []string{"tiers.payload_table", `column "message_id" (key[1]) is integer there and text in `}, nil},
		{"side table without an anchor index", "      anchor: seen\n      payload_table: public.side_noindex\n", []string{"tiers.payload_table", "public.side_noindex", `leads with column "seen"`, `CREATE INDEX CONCURRENTLY ON "public"."side_noindex" ("seen")`}, nil},
		{"side table without the anchor", "      anchor: naive\n      payload_table: public.side\n", []string{"tiers.payload_table", `has no anchor column "naive"`}, nil},
		{"permanent key, new table", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [bk], hash: h}\n", nil, func(t *testing.T, tr *tiering.Tiers) {
			k := tr.Key
			if k.Exists || k.Name != "inboxkeeper.keys_public_inbox" || k.NKey != 1 || len(k.Columns) != 3 || k.Columns[1].Name != "consumer" || k.FirstSeen.Name != "seen" {
				t.Errorf("key %+v", k)
			}
			if got := tiering.CreateKeyTableSQL(k); !strings.Contains(got, `"bk" text NOT NULL,`) || !strings.Contains(got, `"consumer" text,`) || !strings.Contains(got, `"first_seen" date,`) || !strings.Contains(got, `PRIMARY KEY ("bk")`) {
				t.Errorf("CreateSQL:\n%s", got)
			}
		}},
		{"permanent key, existing table", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [consumer, bk], hash: h, table: inboxkeeper.keys_good}\n", nil, func(t *testing.T, tr *tiering.Tiers) {
			if !tr.Key.Exists || len(tr.Key.Columns) != 3 {
				t.Errorf("key %+v", tr.Key)
			}
		}},
		{"permanent key column missing", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [consumer, nope]}\n", []string{"tiers.permanent_key.columns[1]", `"nope" does not exist`}, nil},
		{"permanent key hash missing", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [bk], hash: nope}\n", []string{"tiers.permanent_key.hash", `"nope" does not exist`}, nil},
		{"key table without a primary key", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [consumer, bk], hash: h, table: inboxkeeper.keys_nopk}\n",
			[]string{"tiers.permanent_key.table", "inboxkeeper.keys_nopk", "no primary key or unique index"}, nil},
		{"key table column of another type", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [consumer, bk], hash: h, table: inboxkeeper.keys_type}\n",
			[]string{"tiers.permanent_key.table", `column "bk" is integer, but the permanent key needs text`}, nil},
		{"key table without first_seen", "      anchor: seen\n      payload_columns: [payload, headers]\n      permanent_key: {columns: [consumer, bk], hash: h, table: inboxkeeper.keys_nodate}\n",
			[]string{"tiers.permanent_key.table", `has no column "first_seen" (date)`}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse([]byte(head+tc.tiers), "p.yaml")
			if err != nil {
				t.Fatal(err)
			}
			ct, err := catalog.Resolve(ctx, pool, p.Tables[0])
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, tiering.Of(ct))
				return
			}
			pgtest.WantInvalid(t, err, tc.want...)
		})
	}
	// Nothing was created by resolving.
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'keys_public_inbox'").Scan(&n); err != nil || n != 0 {
		t.Errorf("resolving created the key table (%d, %v)", n, err)
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
	if err != nil || !tb.Distributed() || !tiering.KeyOf(tb).Exists {
		t.Fatalf("co-located side and key tables: %v", err)
	}
	if tb, err := resolve("public.side", "{columns: [consumer, bk], table: inboxkeeper.keys_new}"); err != nil || tiering.KeyOf(tb).Exists ||
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
