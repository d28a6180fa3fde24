package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

// On a Citus coordinator migrate applies every file once and a second run
// applies nothing, whether the schema is new, already on the workers (a
// distributed permanent key table lives in it), or created while the
// session has schema-based sharding on; the control tables stay plain
// tables on the coordinator, except the heartbeat, a reference table so
// that the workers' standbys see the beats.
func TestMigrateTwiceOnCitus(t *testing.T) {
	t.Parallel()
	for name, before := range map[string]string{
		"new": ``,
		// The schema reaches the workers as a dependency of a
		// distributed table in it.
		"schema on the workers": `CREATE SCHEMA inboxkeeper;
CREATE TABLE inboxkeeper.keys_public_inbox (consumer text NOT NULL, business_key text NOT NULL, first_seen date, PRIMARY KEY (consumer, business_key));
SET citus.shard_count = 4;
SELECT create_distributed_table('inboxkeeper.keys_public_inbox', 'consumer')`,
		"schema-based sharding on": `SET citus.enable_schema_based_sharding TO on`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			conn := pgtest.Connect(t, pgtest.NewCitusDatabase(t))
			if before != "" {
				pgtest.Exec(t, conn, before)
			}
			migrateTwice(t, conn)
			var citusTables []string
			if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(logicalrelid::text ORDER BY 1), '{}') FROM pg_dist_partition
WHERE logicalrelid::text LIKE 'inboxkeeper.%' AND logicalrelid::text NOT IN ('inboxkeeper.keys_public_inbox', 'inboxkeeper.heartbeat')`).Scan(&citusTables); err != nil {
				t.Fatal(err)
			}
			if len(citusTables) != 0 {
				t.Errorf("control tables handed to Citus: %v; they must stay on the coordinator", citusTables)
			}
			var reference bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'inboxkeeper.heartbeat'::regclass AND citus_table_type = 'reference')`).Scan(&reference); err != nil || !reference {
				t.Errorf("inboxkeeper.heartbeat is not a reference table (%v): a worker's standby would never see a beat", err)
			}
			// The claim function runs on the coordinator and reads the
			// rules table there.
			pgtest.Exec(t, conn, `INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, post_receipt, margin) VALUES ('public', 'x', 'c', interval '1 day', interval '1 hour')`)
		})
	}
}

// A control schema that schema-based sharding already distributed is
// refused with the fix, not migrated onto a worker.
func TestMigrateRefusesCitusTenantSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.Connect(t, pgtest.NewCitusDatabase(t))
	pgtest.Exec(t, conn, `SET citus.enable_schema_based_sharding TO on; CREATE SCHEMA inboxkeeper; RESET citus.enable_schema_based_sharding`)
	_, err := migrations.Migrate(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "citus_schema_undistribute('inboxkeeper')") {
		t.Fatalf("migrate into a distributed schema: %v, want a refusal naming citus_schema_undistribute", err)
	}
	pgtest.Exec(t, conn, `SELECT citus_schema_undistribute('inboxkeeper')`)
	if _, err := migrations.Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate after citus_schema_undistribute: %v", err)
	}
}
