package catalog

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// MaxIdentifierBytes is PostgreSQL's NAMEDATALEN-1: longer names are cut
// silently, so a partition name that long would be looked up wrongly.
const MaxIdentifierBytes = 63

// PartitionName is the name the daemon gives the partition of month
// (YYYYMM) of parent: <parent>_pYYYYMM.
func PartitionName(parent string, yyyymm string) string { return parent + "_p" + yyyymm }

// checkPartitioned checks a parent managed by partition: range-partitioned
// on the expiry column alone, no DEFAULT partition, an index on the key
// columns, and room in the name for the _pYYYYMM suffix.
func checkPartitioned(ctx context.Context, q Querier, t *Table) error {
	pt := t.Policy
	var strategy string
	var natts int
	var keyCol *string
	var hasDefault bool
	var defaultName *string
	err := q.QueryRow(ctx, `
SELECT p.partstrat::text, p.partnatts,
       (SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] AND p.partattrs[0] <> 0),
       p.partdefid <> 0, (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p.partdefid)
FROM pg_partitioned_table p WHERE p.partrelid = $1`, t.OID).Scan(&strategy, &natts, &keyCol, &hasDefault, &defaultName)
	if err != nil {
		return fmt.Errorf("table %s: read the partition key: %w", t.Name, err)
	}
	want := fmt.Sprintf("PARTITION BY RANGE (%s)", t.Expiry.Quoted)
	switch {
	case strategy != "r":
		return invalid(pt, "partitions", "the table is partitioned by %s, not by range; it must be %s", map[string]string{"l": "list", "h": "hash"}[strategy], want)
	case natts != 1 || keyCol == nil:
		return invalid(pt, "partitions", "the partition key must be the expiry column alone (%s)", want)
	case *keyCol != t.Expiry.Name:
		return invalid(pt, "partitions", "the table is partitioned on column %q, not on the expiry column %q; it must be %s", *keyCol, t.Expiry.Name, want)
	case hasDefault:
		name := ""
		if defaultName != nil {
			name = " (" + *defaultName + ")"
		}
		return invalid(pt, "partitions", "the table has a DEFAULT partition%s: it forbids DETACH CONCURRENTLY and makes every new partition scan it; move its rows into monthly partitions and drop it (see docs/guides/partitions.md)", name)
	}
	if n := len(PartitionName(pt.Name.Name, "000000")); n > MaxIdentifierBytes {
		return invalid(pt, "table", "the name is too long for monthly partitions: %q needs %d bytes, PostgreSQL allows %d", PartitionName(pt.Name.Name, "YYYYMM"), n, MaxIdentifierBytes)
	}

	// PostgreSQL cannot keep the identity unique across partitions; the
	// claim path finds an earlier copy through an index on the key.
	rows, err := q.Query(ctx, `
SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE k.ord <= $2 ORDER BY k.ord)
FROM pg_index i WHERE i.indrelid = $1 AND i.indpred IS NULL`, t.OID, len(t.Key))
	if err != nil {
		return fmt.Errorf("table %s: read indexes: %w", t.Name, err)
	}
	defer rows.Close()
	var keys []string
	for _, k := range t.Key {
		keys = append(keys, k.Name)
	}
	slices.Sort(keys)
	found := false
	for rows.Next() {
		var lead []string
		if err := rows.Scan(&lead); err != nil {
			return err
		}
		slices.Sort(lead)
		found = found || slices.Equal(lead, keys)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("table %s: read indexes: %w", t.Name, err)
	}
	if !found {
		var quoted []string
		for _, k := range t.Key {
			quoted = append(quoted, k.Quoted)
		}
		return invalid(pt, "key", "no index on the parent leads with the key columns; every partition needs one for the claim path's look-up, for example: CREATE INDEX ON %s (%s)",
			t.Ident, strings.Join(quoted, ", "))
	}
	return nil
}
