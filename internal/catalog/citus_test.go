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

// No Citus package exists here, so the test gives the database what Resolve
// looks at on a Citus coordinator: pg_catalog.pg_dist_partition listing the
// distributed tables. A distributed table is refused by name; a local table
// on the same coordinator is accepted.
func TestCitusDistributedTableRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{
		"SET allow_system_table_mods = on",
		"CREATE TABLE pg_catalog.pg_dist_partition (logicalrelid regclass NOT NULL, partmethod char NOT NULL)",
		"RESET allow_system_table_mods",
		`CREATE TABLE public.distributed (id int, e timestamptz); CREATE INDEX ON public.distributed (e);
		 CREATE TABLE public.local (id int, e timestamptz); CREATE INDEX ON public.local (e);
		 INSERT INTO pg_catalog.pg_dist_partition VALUES ('public.distributed', 'h')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	resolve := func(table string) error {
		p, err := policy.Parse([]byte("tables:\n  - table: "+table+"\n    key: [id]\n    expires_at: e\n"), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		_, err = catalog.Resolve(ctx, pool, p.Tables[0])
		return err
	}
	if err := resolve("public.distributed"); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), "Citus distributed table") {
		t.Errorf("distributed table: %v", err)
	}
	if err := resolve("public.local"); err != nil {
		t.Errorf("local table on a coordinator: %v", err)
	}
}
