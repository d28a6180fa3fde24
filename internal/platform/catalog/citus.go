package catalog

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// Distribution describes a table Citus hash-distributes over its workers.
// inboxkeeper connects to the coordinator; the statements it sends there
// reach every shard (see docs/guides/citus.md).
type Distribution struct {
	Column  Column   // the distribution column, one of the policy's key columns
	Shards  int      // shard count
	Workers []string // host:port of the nodes holding its shards
}

// String is how status shows the distribution.
func (d *Distribution) String() string {
	return fmt.Sprintf("hash on %s, %d shards on %d nodes", d.Column.Name, d.Shards, len(d.Workers))
}

// Distributed reports whether Citus hash-distributes the table: its batches
// go through the coordinator in a form Citus can push to every shard (no
// ctid, no SKIP LOCKED; see expiry).
func (t *Table) Distributed() bool { return t.Citus != nil }

// ThroughCitus reports whether Citus plans the table's statements: it is in
// Citus's metadata, hash-distributed or a reference or Citus local table.
// Citus refuses there what a batch on one node picks and locks rows with
// (ctid lists, FOR UPDATE SKIP LOCKED in a modification), and runs a
// statement on nodes whose own timeouts apply unless the transaction sends
// its own along (dbconn.TxSettings.Citus): such a table's deletion batches
// are expiry windows (see expiry).
func (t *Table) ThroughCitus() bool { return t.InCitusMetadata }

// Shards is how many shards hold the table's rows: 1 unless Citus
// hash-distributes it (a reference table's copies hold the same rows).
func (t *Table) Shards() int {
	if t.Citus == nil {
		return 1
	}
	return max(1, t.Citus.Shards)
}

// resolveCitus fills t.Citus when the database is a Citus coordinator and
// the table is hash-distributed, and CitusReference for a reference table.
// A reference table and a Citus local table are managed through Citus too
// (ThroughCitus); an append- or range-distributed table, or one
// distributed on a column outside the policy's key, is refused by name.
func resolveCitus(ctx context.Context, q Querier, pt policy.Table, t *Table, cols map[string]string) error {
	var coordinator bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&coordinator); err != nil {
		return fmt.Errorf("table %s: look for Citus: %w", t.Name, err)
	}
	if !coordinator {
		return nil
	}
	var method string
	var column *string
	var replicated bool
	err := q.QueryRow(ctx, `SELECT partmethod::text,
       CASE WHEN partmethod <> 'n' THEN column_to_column_name(logicalrelid, partkey) END,
       repmodel = 't'
FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1::oid::regclass`, t.OID).Scan(&method, &column, &replicated)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // a local table on the coordinator
	}
	if err != nil {
		return fmt.Errorf("table %s: read its Citus distribution: %w", t.Name, err)
	}
	t.InCitusMetadata = true
	switch method {
	case "n":
		// A reference table (a copy on every node, kept in step by Citus:
		// replicated) or a Citus local table (one, on the coordinator).
		t.CitusReference = replicated
		return nil
	case "h":
	case "a":
		return invalid(pt, "table", "is an append-distributed Citus table; its shards have no hash key for the coordinator to route a delete by, so inboxkeeper manages only hash-distributed tables (create_distributed_table(..., 'hash'))")
	case "r":
		return invalid(pt, "table", "is a range-distributed Citus table; inboxkeeper manages hash-distributed tables (create_distributed_table(..., 'hash'))")
	default:
		return invalid(pt, "table", "is a Citus table distributed by method %q, which inboxkeeper does not know", method)
	}
	if column == nil {
		return fmt.Errorf("table %s: Citus names no distribution column", t.Name)
	}
	if !slices.ContainsFunc(t.Key, func(c Column) bool { return c.Name == *column }) {
		return invalid(pt, "key", "the table is distributed on %q, which is not one of the key columns %v: a message's identity must decide its shard, or two shards could each hold one copy of it and the claim path could not see the duplicate; add %q to the key (and to the table's unique key)",
			*column, pt.Key, *column)
	}
	d := &Distribution{Column: Column{Name: *column, Type: cols[*column]}}
	d.Column.Quoted = t.Key[slices.IndexFunc(t.Key, func(c Column) bool { return c.Name == *column })].Quoted
	rows, err := q.Query(ctx, `SELECT count(DISTINCT s.shardid)::int, coalesce(array_agg(DISTINCT n.nodename || ':' || n.nodeport) FILTER (WHERE n.nodename IS NOT NULL), '{}')
FROM pg_catalog.pg_dist_shard s
LEFT JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
LEFT JOIN pg_catalog.pg_dist_node n ON n.groupid = p.groupid
WHERE s.logicalrelid = $1::oid::regclass`, t.OID)
	if err != nil {
		return fmt.Errorf("table %s: read its Citus shards: %w", t.Name, err)
	}
	if _, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (struct{}, error) {
		return struct{}{}, r.Scan(&d.Shards, &d.Workers)
	}); err != nil {
		return fmt.Errorf("table %s: read its Citus shards: %w", t.Name, err)
	}
	t.Citus = d
	return nil
}

// colocated refuses rel (name canonical, ident quoted), which holds the
// rows' what, unless it is hash-distributed on t's distribution column and
// co-located with t. The statements in the messages name tables by their
// canonical spelling, which Citus parses like SQL text.
func colocated(ctx context.Context, q Querier, pt policy.Table, t *Table, field, what, name, ident string) error {
	col := t.Citus.Column.Name
	var method, column string
	var same bool
	err := q.QueryRow(ctx, `SELECT p.partmethod::text,
       coalesce(CASE WHEN p.partmethod <> 'n' THEN column_to_column_name(p.logicalrelid, p.partkey) END, ''),
       p.colocationid = (SELECT colocationid FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $2::oid::regclass)
FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid = $1::text::regclass`, ident, t.OID).Scan(&method, &column, &same)
	fix := fmt.Sprintf("SELECT create_distributed_table(%s, %s, colocate_with => %s)", sqlident.QuoteLiteral(name), sqlident.QuoteLiteral(col), sqlident.QuoteLiteral(t.Name))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return invalid(pt, field, "%s is a local table on the Citus coordinator, but %s is distributed on %q: distribute it the same way, co-located, as its owner: %s", name, t.Name, col, fix)
	case err != nil:
		return fmt.Errorf("table %s: read the Citus distribution of %s: %w", t.Name, name, err)
	case method != "h" || column != col:
		how := fmt.Sprintf("distributed by method %q on %q", method, column)
		if method == "n" {
			how = "a reference or Citus local table"
		}
		return invalid(pt, field, "%s is %s, but %s is hash-distributed on %q: undistribute it (SELECT undistribute_table(%s)) and distribute it the same way, co-located: %s",
			name, how, t.Name, col, sqlident.QuoteLiteral(name), fix)
	case !same:
		return invalid(pt, field, "%s is distributed on %q but not co-located with %s, so a row and its %s could be on different nodes: SELECT update_distributed_table_colocation(%s, colocate_with => %s)",
			name, col, t.Name, what, sqlident.QuoteLiteral(name), sqlident.QuoteLiteral(t.Name))
	}
	return nil
}

// shardStatsCommand is what each shard of a distributed table answers
// (run_command_on_shards puts the shard's name for %1$L): its size with
// indexes and TOAST, and the planner's row estimate there.
const shardStatsCommand = `SELECT pg_total_relation_size(%1$L::regclass) || ' ' || reltuples FROM pg_class WHERE oid = %1$L::regclass`

// ShardStats is the estimated rows and total bytes of a distributed table
// (its partitions' included), read from its shards on the workers: the
// coordinator's own catalog has neither (its copy of the table is empty,
// and never analyzed). ok is false while a shard has no statistics yet
// (before its first ANALYZE, which autovacuum runs on the workers) or did
// not answer.
func ShardStats(ctx context.Context, q Querier, oid uint32) (rows, bytes float64, ok bool, err error) {
	r, err := q.Query(ctx, `
SELECT s.success, s.result
FROM pg_class c, LATERAL run_command_on_shards(c.oid::regclass, $2) s
WHERE (c.oid = $1 AND c.relkind = 'r') OR c.oid IN (SELECT relid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf)`, oid, shardStatsCommand)
	if err != nil {
		return 0, 0, false, err
	}
	defer r.Close()
	ok = true
	shards := 0
	for r.Next() {
		var success bool
		var result string
		if err := r.Scan(&success, &result); err != nil {
			return 0, 0, false, err
		}
		shards++
		var size, tuples float64
		if _, err := fmt.Sscanf(result, "%g %g", &size, &tuples); !success || err != nil || tuples < 0 {
			ok = false
			continue
		}
		rows += tuples
		bytes += size
	}
	if err := r.Err(); err != nil {
		return 0, 0, false, err
	}
	return rows, bytes, ok && shards > 0, nil
}
