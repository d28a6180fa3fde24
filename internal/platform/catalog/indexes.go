package catalog

import (
	"context"
	"fmt"
	"slices"
)

// IndexLeads reports whether a valid, non-partial btree index on the table
// leads with cols, in that order: then ORDER BY the last of them with the
// others fixed by equality reads one index entry.
func IndexLeads(ctx context.Context, q Querier, t *Table, cols ...Column) (bool, error) {
	rows, err := q.Query(ctx, `
SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE k.ord <= $2 ORDER BY k.ord)
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_am am ON am.oid = ic.relam
WHERE i.indrelid = $1 AND am.amname = 'btree' AND i.indpred IS NULL
  AND (i.indisvalid OR ic.relkind = 'I')`, t.OID, len(cols))
	if err != nil {
		return false, fmt.Errorf("table %s: read indexes: %w", t.Name, err)
	}
	defer rows.Close()
	want := make([]string, len(cols))
	for i, c := range cols {
		want[i] = c.Name
	}
	found := false
	for rows.Next() {
		var lead []string
		if err := rows.Scan(&lead); err != nil {
			return false, err
		}
		found = found || slices.Equal(lead, want)
	}
	return found, rows.Err()
}
