package compact_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// TestMeasureWithSelectByColumn sizes a table as a role that may read all
// its columns but one (deploy/sql/role.sql's private_columns): the same
// Space as a role that reads whole rows, from the statistics and, with a
// column the statistics do not cover yet, from a sample. Before
// inboxkeeper.row_width, pg_stats hid the private column from such a role,
// and the sample of whole rows failed with "permission denied for table".
func TestMeasureWithSelectByColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 20000, oldest)
	role := fmt.Sprintf("ik_bycolumn_%d", os.Getpid())
	pgtest.Exec(t, e.pool, fmt.Sprintf(`DROP ROLE IF EXISTS %[1]s; CREATE ROLE %[1]s;
GRANT USAGE ON SCHEMA inboxkeeper TO %[1]s;
GRANT SELECT (ctid, consumer, message_id, payload_hash, event_time, first_seen_at, remember_until, business_key) ON public.consumer_inbox TO %[1]s;
GRANT EXECUTE ON FUNCTION inboxkeeper.row_width(regclass, name) TO %[1]s`, role))
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %[1]s; DROP ROLE %[1]s", role))
	})
	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET ROLE "+role); err != nil {
		t.Fatal(err)
	}
	// Whether the role is held to its columns: it is, or the test proves
	// nothing.
	if _, err := conn.Exec(ctx, "SELECT outcome FROM public.consumer_inbox LIMIT 1"); err == nil {
		t.Fatal("the role reads outcome: the grant is not by column")
	}
	for _, basis := range []string{"statistics", "sample"} {
		if basis == "sample" {
			// A column ANALYZE has not seen yet: no statistics for it.
			pgtest.Exec(t, e.pool, "ALTER TABLE public.consumer_inbox ADD COLUMN extra int; GRANT SELECT (extra) ON public.consumer_inbox TO "+role)
		}
		whole, err := compact.Measure(ctx, e.pool, e.table)
		if err != nil {
			t.Fatal(err)
		}
		byColumn, err := compact.Measure(ctx, conn, e.table)
		if err != nil {
			t.Fatalf("%s: measure as a role that may read all but one column: %v", basis, err)
		}
		if whole.Basis != basis || byColumn != whole {
			t.Errorf("%s: by column %+v, whole rows %+v: want the same, from %s", basis, byColumn, whole, basis)
		}
	}
}
