package main

import (
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// newCitusFixture is newFixture on a Citus coordinator: the usual inbox,
// hash-distributed on consumer over the test cluster's workers.
func newCitusFixture(t *testing.T) *fixture {
	t.Helper()
	return newCitusFixtureAs(t, "SET citus.shard_count = 4; SELECT create_distributed_table('public.consumer_inbox', 'consumer')")
}

// newCitusFixtureAs is newCitusFixture with the inbox made a Citus table by
// sql.
func newCitusFixtureAs(t *testing.T, sql string) *fixture {
	t.Helper()
	pool, url := pgtest.NewCitusPool(t)
	f := &fixture{t: t, pool: pool, url: url, dir: t.TempDir()}
	pgtest.Exec(t, pool, inboxTable)
	pgtest.Exec(t, pool, sql)
	pgtest.Exec(t, pool, inboxRows)
	f.policy = f.writeFile("inboxkeeper.yaml", inboxPolicy)
	return f
}

// The commands on a Citus coordinator: migrate (twice), status naming the
// distribution, a hold, and once deleting exactly what one node would.
func TestCitusCommands(t *testing.T) {
	t.Parallel()
	f := newCitusFixture(t)
	wantExit(t, f.run("migrate"), 0, "migrated to version")
	wantExit(t, f.run("migrate"), 0, "up to date")
	wantExit(t, f.run("status"), 0, "distributed (Citus):      hash on consumer, 4 shards on 2 nodes")
	r := f.run("status", "--json")
	wantExit(t, r, 0)
	st := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	if len(st.Tables) != 1 || st.Tables[0].Citus == nil ||
		st.Tables[0].Citus.DistributionColumn != "consumer" || st.Tables[0].Citus.Shards != 4 || len(st.Tables[0].Citus.Workers) != 2 {
		t.Errorf("status --json: %+v\n%s", st, r.stdout)
	}
	wantExit(t, f.run("hold", "add", "--table", "public.consumer_inbox", "--scope", "billing", "--reason", "audit", "--owner", "dba"), 0)
	wantExit(t, f.run("once"), 0)
	// payments' 20 expired rows go; billing's 10 are held.
	f.wantCount("rows left", allRows-20, "SELECT count(*) FROM public.consumer_inbox")
	f.wantCount("billing rows left", 16, "SELECT count(*) FROM public.consumer_inbox WHERE consumer = 'billing'")
}

// A reference table and a Citus local table: once deletes exactly what one
// node would, in every copy; compact refuses them, as it does a distributed
// table, with exit 2 and the way to compact them, before anything moves;
// status shows no vacuum or space figures read from the coordinator's
// empty copy of the table.
func TestCitusReferenceAndLocalTableCommands(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"create_reference_table", "citus_add_local_table_to_metadata", "create_distributed_table"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			sql := "SELECT " + kind + "('public.consumer_inbox')"
			refusal := "is a Citus reference or Citus local table: Citus refuses the moves' row locks"
			if kind == "create_distributed_table" {
				sql, refusal = "SELECT create_distributed_table('public.consumer_inbox', 'consumer')", "is distributed by Citus: compact its shards on the workers"
			}
			f := newCitusFixtureAs(t, sql)
			wantExit(t, f.run("migrate"), 0)
			wantExit(t, f.run("compact", "--table", "public.consumer_inbox"), 2, refusal)
			wantExit(t, f.run("once"), 0)
			f.wantCount("rows left", allRows-expiredRows, "SELECT count(*) FROM public.consumer_inbox")
			r := f.run("status", "--json")
			wantExit(t, r, 0)
			if st := decodeOutput[render.StatusJSON](t, "status --json", r, nil); len(st.Tables) != 1 || st.Tables[0].Vacuum != nil || st.Tables[0].Space != nil {
				t.Errorf("status --json: vacuum and space of a Citus table, want none\n%s", r.stdout)
			}
			if kind == "create_reference_table" {
				f.wantCount("copies unlike the coordinator's", 0, `SELECT count(*) FROM run_command_on_placements('public.consumer_inbox', 'SELECT count(*) FROM %s') WHERE result <> '12'`)
			}
		})
	}
}

// A distributed table inboxkeeper cannot manage is refused by name with
// exit 2, before anything is deleted: distributed on a column outside the
// policy's key.
func TestCitusRefusedTable(t *testing.T) {
	t.Parallel()
	f := newCitusFixture(t)
	wantExit(t, f.run("migrate"), 0)
	f.policy = f.writeFile("outside-key.yaml", strings.Replace(inboxPolicy, "key: [consumer, message_id]", "key: [message_id]", 1))
	wantExit(t, f.run("once"), 2, `distributed on "consumer", which is not one of the key columns`)
	f.wantCount("rows left", allRows, "SELECT count(*) FROM public.consumer_inbox")
}

// status names the distribution of a time-partitioned distributed table
// too, in text and JSON, and once retires its expired month through the
// coordinator.
func TestCitusPartitionedStatus(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewCitusPool(t)
	f := &fixture{t: t, pool: pool, url: url, dir: t.TempDir()}
	pgtest.Exec(t, pool, partitionedDDL)
	pgtest.Exec(t, pool, "SET citus.shard_count = 4; SELECT create_distributed_table('public.consumer_inbox', 'consumer')")
	f.policy = f.writeFile("inboxkeeper.yaml", partitionedPolicy)
	wantExit(t, f.run("migrate"), 0)
	wantExit(t, f.run("status"), 0, "public.consumer_inbox (managed by partition)\n  distributed (Citus):      hash on consumer, 4 shards on 2 nodes")
	r := f.run("status", "--json")
	wantExit(t, r, 0)
	if st := decodeOutput[render.StatusJSON](t, "status --json", r, nil); len(st.Tables) != 1 || st.Tables[0].Citus == nil || st.Tables[0].Citus.DistributionColumn != "consumer" {
		t.Errorf("status --json: %+v\n%s", st, r.stdout)
	}
	wantExit(t, f.run("once"), 0)
	f.wantCount("rows left", 1, "SELECT count(*) FROM public.consumer_inbox")
}
