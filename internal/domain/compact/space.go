package compact

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
)

// Space is how much of a table's heap its live rows need: the heap's pages
// now, and the pages its live rows would fill packed at the table's
// fillfactor (what a fresh copy of the table, pg_repack's or VACUUM
// FULL's, would have). The live side is an estimate: the live rows as the
// planner estimates them, the average row from pg_stats (or, before the
// table was ever analyzed, from its newest rows); alignment within a row
// is not counted, so it errs on the small side by a few bytes a row.
type Space struct {
	Pages     int64   // heap pages (main fork) now
	BlockSize int64   // bytes a page
	LiveRows  int64   // live rows, estimated (spaceSQL)
	RowBytes  float64 // an average row's bytes on a page, its line pointer included
	Fill      int     // the table's fillfactor, percent
	LivePages int64   // pages the live rows fill packed
	// Basis says where the row size comes from: "statistics" (pg_stats),
	// "sample" (the newest rows), or "" when there are no rows to size.
	Basis string
}

// HeapBytes is the heap's size on disk.
func (s Space) HeapBytes() int64 { return s.Pages * s.BlockSize }

// LiveBytes is the heap size the live rows need, packed.
func (s Space) LiveBytes() int64 { return s.LivePages * s.BlockSize }

// Reclaimable is what compaction could give back: the heap beyond what its
// live rows need.
func (s Space) Reclaimable() int64 { return max(0, s.HeapBytes()-s.LiveBytes()) }

// FreeRatio is Reclaimable's share of the heap (0 for an empty heap).
func (s Space) FreeRatio() float64 {
	if s.Pages == 0 {
		return 0
	}
	return float64(s.Reclaimable()) / float64(s.HeapBytes())
}

// pageHeader is a heap page's header; a heap page has no special space.
const pageHeader = 24

// lineBytes is an item's line pointer on its page.
const lineBytes = 4

// spaceSQL reads what Space needs in one statement: the heap's size, the
// live rows, the fillfactor, and the average row width from pg_stats with
// how many of the table's columns it covers. The live rows are the
// planner's estimate: the density the last VACUUM or ANALYZE found
// (reltuples over relpages) times the heap's pages now, so a table that
// grew since counts its new pages. Not the statistics counters
// (n_live_tup): a backend sends them up to seconds late, and inserts sent
// after the VACUUM that followed a purge were counted again (five times
// the rows), deletes after it took them to nearly nothing. Before the
// table was ever vacuumed or analyzed (reltuples -1), the counters are all
// there is.
const spaceSQL = `
SELECT pg_relation_size(c.oid), current_setting('block_size')::int8,
       CASE WHEN c.reltuples < 0 THEN pg_stat_get_live_tuples(c.oid)
            WHEN c.relpages = 0 THEN c.reltuples::int8
            ELSE (c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int8))::int8 END,
       coalesce((SELECT o.option_value::int FROM pg_options_to_table(c.reloptions) o WHERE o.option_name = 'fillfactor'), 100),
       (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       s.cols, coalesce(s.width, 0), has_table_privilege(c.oid, 'SELECT')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
LATERAL (SELECT count(*) AS cols, sum(st.avg_width * (1 - st.null_frac))::float8 AS width FROM pg_stats st
         WHERE st.schemaname = n.nspname AND st.tablename = c.relname AND NOT st.inherited) s
WHERE c.oid = $1`

// sampleSQL is the average row of the table's newest rows, by its expiry
// index (%[2]s is the expiry column): cheap however empty the heap's start,
// for a table that was never analyzed. A TOASTed value counts in full
// here, so a table with large payloads reads bigger than it is until it is
// analyzed.
const sampleSQL = `SELECT coalesce(avg(pg_column_size(r.*)), 0)::float8 FROM (SELECT * FROM %[1]s ORDER BY %[2]s DESC NULLS LAST LIMIT 1000) r`

// Measure reads t's Space.
func Measure(ctx context.Context, q catalog.Querier, t *catalog.Table) (Space, error) {
	var s Space
	var heap, cols, withStats int64
	var width float64
	var wholeRows bool
	if err := q.QueryRow(ctx, spaceSQL, t.OID).Scan(&heap, &s.BlockSize, &s.LiveRows, &s.Fill, &cols, &withStats, &width, &wholeRows); err != nil {
		return s, fmt.Errorf("measure the space of %s: %w", t.Name, err)
	}
	s.Pages = heap / s.BlockSize
	s.LiveRows = max(0, s.LiveRows)
	if s.LiveRows == 0 {
		return s, nil
	}
	if !wholeRows {
		// SELECT by column: pg_stats shows only the columns this role may
		// read, and a sample needs whole rows; the control schema's
		// row_width sizes them with its owner's rights.
		var sample *float64
		if err := q.QueryRow(ctx, `SELECT columns, with_stats, stats_width, sample_width FROM inboxkeeper.row_width($1::oid::regclass, $2)`,
			t.OID, t.Expiry.Name).Scan(&cols, &withStats, &width, &sample); err != nil {
			return s, fmt.Errorf("size the rows of %s (this role may read only some of its columns; inboxkeeper.row_width): %w", t.Name, err)
		}
		if withStats < cols {
			if sample == nil {
				return s, fmt.Errorf("size the rows of %s: inboxkeeper.row_width returned no sample", t.Name)
			}
			s.RowBytes, s.Basis = float64(align(int64(math.Ceil(*sample))))+lineBytes, "sample"
			return s.packed(), nil
		}
	}
	if withStats >= cols && cols > 0 {
		// The tuple header (23 bytes and a null bitmap, aligned) and the
		// data, aligned as a whole.
		header := align(23 + (cols+7)/8)
		s.RowBytes, s.Basis = float64(align(header+int64(math.Ceil(width))))+lineBytes, "statistics"
	} else {
		var sample float64
		if err := q.QueryRow(ctx, fmt.Sprintf(sampleSQL, t.Ident, t.Expiry.Quoted)).Scan(&sample); err != nil {
			return s, fmt.Errorf("sample the rows of %s: %w", t.Name, err)
		}
		s.RowBytes, s.Basis = float64(align(int64(math.Ceil(sample))))+lineBytes, "sample"
	}
	return s.packed(), nil
}

// packed fills in LivePages: the live rows at RowBytes, packed at the
// fillfactor.
func (s Space) packed() Space {
	perPage := float64(s.BlockSize-pageHeader) * float64(s.Fill) / 100
	s.LivePages = int64(math.Ceil(float64(s.LiveRows) * s.RowBytes / perPage))
	return s
}

// align rounds n up to the 8-byte alignment of a row on a page.
func align(n int64) int64 { return (n + 7) &^ 7 }

// liveInTail counts the rows visible now on the pages from page on, and
// those a hold that blocks demotion (a legal hold) keeps in place there:
// a TID range scan of the tail alone.
func liveInTail(ctx context.Context, q pgx.Tx, t *catalog.Table, from int64, hold string, args []any) (rows, held int64, err error) {
	sql := fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE %s) FROM %s u WHERE u.ctid >= %s`, hold, t.Ident, tidAt(from))
	err = q.QueryRow(ctx, sql, args...).Scan(&rows, &held)
	return rows, held, err
}

// tidAt is the tid literal before every row of page p.
func tidAt(p int64) string { return fmt.Sprintf("'(%d,0)'::tid", p) }
