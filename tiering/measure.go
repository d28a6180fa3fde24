package tiering

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// Stats are a tiered table's tiers as the planner's statistics see them:
// cheap on any size of table (nothing is counted), and as fresh as the last
// ANALYZE. A tier missing from a map is unknown (no statistics yet).
type Stats struct {
	Table string
	// Rows estimates the rows per tier: hot (with payload), warm (without)
	// and permanent (keys in the key table).
	Rows map[string]float64
	// BytesPerKey is the storage one key costs in each tier, indexes and
	// TOAST included:
	//   warm: the table's size per row, less the payload's share (in place:
	//         the payload columns' average width times the rows that have
	//         one);
	//   hot: warm plus the payload of one row (in place: the payload
	//        columns' average width; with a side table: the side table's
	//        size per row);
	//   permanent: the key table's size per key.
	BytesPerKey map[string]float64
}

// relStats is the estimated rows and total bytes of a relation, partitions
// included; ok is false before the first ANALYZE (or VACUUM). A relation
// Citus distributes (the inbox, its side and key tables: all co-located
// when t is distributed) is measured on its shards.
func relStats(ctx context.Context, q Querier, t *catalog.Table, oid uint32) (rows, bytes float64, ok bool, err error) {
	if t.Distributed() {
		return catalog.ShardStats(ctx, q, oid)
	}
	var known *bool
	err = q.QueryRow(ctx, `
SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::float8,
       coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8,
       bool_and(c.reltuples >= 0)
FROM pg_class c
WHERE (c.oid = $1 AND c.relkind = 'r')
   OR c.oid IN (SELECT relid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf)`, oid).Scan(&rows, &bytes, &known)
	return rows, bytes, known != nil && *known, err
}

// Measure estimates the tiers of t. A table without tiers has no Stats.
func Measure(ctx context.Context, q Querier, t *catalog.Table) (Stats, error) {
	st := Stats{Table: t.Name, Rows: map[string]float64{}, BytesPerKey: map[string]float64{}}
	ti := Of(t)
	if ti == nil {
		return st, nil
	}
	rows, bytes, ok, err := relStats(ctx, q, t, t.OID)
	if err != nil {
		return st, fmt.Errorf("table %s: measure tiers: %w", t.Name, err)
	}
	if ok && rows > 0 {
		if ti.Side != nil {
			srows, sbytes, sok, err := relStats(ctx, q, t, ti.Side.OID)
			if err != nil {
				return st, fmt.Errorf("table %s: measure the side table %s: %w", t.Name, ti.Side.Name, err)
			}
			if sok {
				hot := min(srows, rows)
				st.Rows[Hot], st.Rows[Warm] = hot, rows-hot
				st.BytesPerKey[Warm] = bytes / rows
				if srows > 0 {
					st.BytesPerKey[Hot] = bytes/rows + sbytes/srows
				}
			}
		} else if err := inPlaceStats(ctx, q, t, rows, bytes, &st); err != nil {
			return st, err
		}
	}
	if k := ti.Key; k != nil && k.Exists {
		var oid uint32
		err := q.QueryRow(ctx, `SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
			k.Table.Schema, k.Table.Name).Scan(&oid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return st, fmt.Errorf("table %s: look up %s: %w", t.Name, k.Name, err)
		}
		if err == nil {
			krows, kbytes, kok, err := relStats(ctx, q, t, oid)
			if err != nil {
				return st, fmt.Errorf("table %s: measure %s: %w", t.Name, k.Name, err)
			}
			if kok {
				st.Rows[Permanent] = krows
				if krows > 0 {
					st.BytesPerKey[Permanent] = kbytes / krows
				}
			}
		}
	}
	return st, nil
}

// inPlaceStats splits the table by the payload columns' statistics: a row
// is hot when some payload column is not NULL (estimated from the smallest
// null fraction), and its payload weighs the columns' average widths.
func inPlaceStats(ctx context.Context, q Querier, t *catalog.Table, rows, bytes float64, st *Stats) error {
	var names []string
	for _, c := range Of(t).Payload {
		names = append(names, c.Name)
	}
	var minNull, width, payloadBytes *float64
	var err error
	if t.Distributed() {
		minNull, width, payloadBytes, err = shardPayloadStats(ctx, q, t, names)
	} else {
		err = q.QueryRow(ctx, `
SELECT min(null_frac)::float8, sum(avg_width)::float8, sum(avg_width * (1 - null_frac))::float8, count(*)
FROM pg_stats
WHERE schemaname = $1 AND tablename = $2 AND attname = ANY ($3::text[]) AND inherited = $4`,
			t.Policy.Name.Schema, t.Policy.Name.Name, names, t.Kind == "p").Scan(&minNull, &width, &payloadBytes, new(int64))
	}
	if err != nil {
		return fmt.Errorf("table %s: read the payload columns' statistics: %w", t.Name, err)
	}
	if minNull == nil {
		return nil // not analyzed yet
	}
	hot := rows * (1 - *minNull)
	st.Rows[Hot], st.Rows[Warm] = hot, rows-hot
	warm := max(bytes-*payloadBytes*rows, 0) / rows
	st.BytesPerKey[Warm] = warm
	st.BytesPerKey[Hot] = warm + *width
	return nil
}

// shardPayloadStats is inPlaceStats's reading of the payload columns'
// statistics for a table Citus distributes, whose shards on the workers
// have them (the coordinator's empty copy has none): each shard's, weighted
// by its rows. All nil while a shard with rows has none.
func shardPayloadStats(ctx context.Context, q Querier, t *catalog.Table, names []string) (minNull, width, payloadBytes *float64, err error) {
	// run_command_on_shards has no parameters: the names go in as a
	// literal, its % doubled for the format() that puts in each shard's
	// name (%1$L).
	cmd := fmt.Sprintf(`SELECT c.reltuples || ' ' || coalesce(min(s.null_frac) || ' ' || sum(s.avg_width) || ' ' || sum(s.avg_width * (1 - s.null_frac)), 'none')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = ANY (%s::text[]) AND s.inherited = %t
WHERE c.oid = %%1$L::regclass GROUP BY c.reltuples`,
		strings.ReplaceAll(sqlident.QuoteLiteral(pgTextArray(names)), "%", "%%"), t.Kind == "p")
	rows, err := q.Query(ctx, `SELECT success, result FROM run_command_on_shards($1::oid::regclass, $2)`, t.OID, cmd)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("table %s: read the payload columns' statistics on the shards: %w", t.Name, err)
	}
	defer rows.Close()
	var total, nulls, widths, payload float64
	known := true
	for rows.Next() {
		var ok bool
		var res *string
		if err := rows.Scan(&ok, &res); err != nil {
			return nil, nil, nil, err
		}
		var n, mn, w, p float64
		if !ok || res == nil {
			known = false
			continue
		}
		if _, err := fmt.Sscanf(*res, "%g %g %g %g", &n, &mn, &w, &p); err != nil {
			// No statistics ("none"): unknown, unless the shard is empty.
			known = known && n <= 0
			continue
		}
		if n > 0 {
			total += n
			nulls, widths, payload = nulls+n*mn, widths+n*w, payload+n*p
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}
	if !known || total <= 0 {
		return nil, nil, nil, nil
	}
	mn, w, p := nulls/total, widths/total, payload/total
	return &mn, &w, &p, nil
}

// pgTextArray spells names as a PostgreSQL text[] literal.
func pgTextArray(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(n) + `"`
	}
	return "{" + strings.Join(quoted, ",") + "}"
}

// Status is `inboxkeeper status` for one tiered table.
type Status struct {
	Stats
	Now        time.Time
	HotFor     time.Duration
	Layout     string // "in place" or "side table <name>"
	Due        int64  // rows due for demotion now (held ones included); at most batchloop.DueCountCap, as the deleter's
	DueCapped  bool
	Blocking   int // active holds that block demotion
	KeyTable   string
	KeyMissing bool // the permanent key table does not exist yet
	// Unreadable are the payload columns (in place) this role may not
	// read, SELECT being granted column by column without them
	// (deploy/sql/role.sql's private_columns, as for the operator): the
	// rows due and the rows per tier need them, and are left unknown.
	Unreadable []string
}

// Status reads the tiers of t now, with the Demoter's clock.
func (d *Demoter) Status(ctx context.Context, t *catalog.Table) (Status, error) {
	st := Status{HotFor: Of(t).HotFor, Layout: "in place"}
	if s := Of(t).Side; s != nil {
		st.Layout = "side table " + s.Name
	}
	if k := KeyOf(t); k != nil {
		st.KeyTable = k.Name
		st.KeyMissing = !k.Exists
	}
	err := d.readTx(ctx, t, func(tx pgx.Tx) error {
		var cov holds.Coverage
		var err error
		if st.Now, cov, err = d.coverage(ctx, tx, t); err != nil {
			return err
		}
		if st.Blocking, err = holds.CountBlocking(ctx, tx, t.Name, st.Now); err != nil {
			return err
		}
		if st.Unreadable, err = unreadablePayload(ctx, tx, t); err != nil || len(st.Unreadable) > 0 {
			return err
		}
		var args sqlargs.List
		cond, _ := due(t, "t", &args, cov, st.Now, batchloop.NegInf)
		capArg := args.Add(batchloop.DueCountCap)
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s t WHERE %s LIMIT %s) due`, walked(t), cond, capArg),
			args.Values...).Scan(&st.Due); err != nil {
			return fmt.Errorf("status %s: count rows due for demotion: %w", t.Name, err)
		}
		st.DueCapped = st.Due >= batchloop.DueCountCap
		st.Stats, err = Measure(ctx, tx, t)
		return err
	})
	return st, err
}

// unreadablePayload lists the in-place payload columns of t this role may
// not read.
func unreadablePayload(ctx context.Context, q Querier, t *catalog.Table) ([]string, error) {
	ti := Of(t)
	if ti.Side != nil {
		return nil, nil
	}
	var names []string
	for _, c := range ti.Payload {
		names = append(names, c.Name)
	}
	out, err := catalog.Unreadable(ctx, q, t.OID, names)
	if err != nil {
		return nil, fmt.Errorf("status %s: read which payload columns this role may read: %w", t.Name, err)
	}
	return out, nil
}
