package partitions

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

// A record of inboxkeeper.partitions is data the daemon checks, not an order
// it follows: any role that can write the control schema can write one, and
// a DROP cannot be taken back. Before a detached partition is dropped, the
// relation itself must bear the record out (vouch): PostgreSQL, not the
// record, says what the relation is.
//
// What is checked, and why it is enough: the record's OID (when it has one)
// is the relation's now; the relation is an ordinary table, attached to
// nothing and parent of nothing; it is no table the policy manages and not in
// the control schema; it has exactly the inbox's columns; and none of its
// rows is unexpired at the database's now. A forged record can then at most
// name a detached copy of the inbox whose every row the deleter could have
// deleted anyway.
type record struct {
	schema, name string
	relid        *uint32 // nil: written before records named relations by OID
}

// vouch returns why the relation rec names may not be dropped, or "" when it
// may. q reads in the transaction that will drop it (or a read-only one for a
// dry run); now is the pass's.
func (m *Manager) vouch(ctx context.Context, q pgx.Tx, t *catalog.Table, rec record, now time.Time) (string, error) {
	part := Partition{Schema: rec.schema, Name: rec.name}
	ident, name := part.Ident(), part.String()
	var oid uint32
	var kind string
	var attachedTo, children, nspname string
	err := q.QueryRow(ctx, `
SELECT c.oid, c.relkind::text, n.nspname::text,
       coalesce((SELECT string_agg(pn.nspname || '.' || pc.relname, ', ') FROM pg_inherits i
                 JOIN pg_class pc ON pc.oid = i.inhparent JOIN pg_namespace pn ON pn.oid = pc.relnamespace WHERE i.inhrelid = c.oid), ''),
       coalesce((SELECT string_agg(cn.nspname || '.' || cc.relname, ', ') FROM pg_inherits i
                 JOIN pg_class cc ON cc.oid = i.inhrelid JOIN pg_namespace cn ON cn.oid = cc.relnamespace WHERE i.inhparent = c.oid), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, rec.schema, rec.name).Scan(&oid, &kind, &nspname, &attachedTo, &children)
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", ident, err)
	}
	switch {
	case rec.relid != nil && *rec.relid != oid:
		return fmt.Sprintf("the record names relation OID %d, but %s is OID %d: it is not the partition that was detached", *rec.relid, name, oid), nil
	case nspname == migrations.Schema:
		return fmt.Sprintf("%s is in the control schema", name), nil
	case m.managed[oid]:
		return fmt.Sprintf("%s is a table the policy manages, not a detached partition", name), nil
	case kind != "r":
		return fmt.Sprintf("%s is not an ordinary table (relkind %q)", name, kind), nil
	case attachedTo != "":
		return fmt.Sprintf("%s is attached to %s, not detached", name, attachedTo), nil
	case children != "":
		return fmt.Sprintf("%s has child tables (%s)", name, children), nil
	}
	// The same columns, by name and type, as the inbox: a detached
	// partition keeps its parent's.
	var diff string
	err = q.QueryRow(ctx, `
WITH p AS (SELECT attname::text AS name, format_type(atttypid, atttypmod) AS type FROM pg_attribute
           WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped),
     r AS (SELECT attname::text AS name, format_type(atttypid, atttypmod) AS type FROM pg_attribute
           WHERE attrelid = $2 AND attnum > 0 AND NOT attisdropped)
SELECT coalesce(string_agg(coalesce(p.name, r.name) || ' ' ||
         CASE WHEN p.name IS NULL THEN '(not in the inbox)' WHEN r.name IS NULL THEN '(missing)' ELSE r.type || ' (the inbox has ' || p.type || ')' END, ', '), '')
FROM p FULL JOIN r ON p.name = r.name
WHERE p.name IS NULL OR r.name IS NULL OR p.type <> r.type`, t.OID, oid).Scan(&diff)
	if err != nil {
		return "", fmt.Errorf("compare the columns of %s with %s: %w", ident, t.Name, err)
	}
	if diff != "" {
		return fmt.Sprintf("the columns of %s are not the inbox's: %s", name, diff), nil
	}
	// No row that has not expired: what the deleter would keep, a DROP
	// must keep too.
	col := "x." + t.Expiry.Quoted
	var unexpired bool
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM ONLY %s x WHERE %s IS NULL OR %s > %s)`,
		ident, col, col, t.Expiry.Instant("($1::timestamptz - $2::int8 * interval '1 microsecond')")),
		now, t.Policy.ExpiryOffset().Microseconds()).Scan(&unexpired)
	if err != nil {
		return "", fmt.Errorf("look for unexpired rows in %s: %w", ident, err)
	}
	if unexpired {
		return fmt.Sprintf("%s holds rows whose %s has not passed", name, t.Expiry.Name), nil
	}
	return "", nil
}

// untrusted reports a record vouch refused: logged once per record and
// process, and kept in the table's result (status, the blocked gauge).
func (m *Manager) untrusted(t *catalog.Table, rec record, why string, res *TableResult) {
	p := Partition{Schema: rec.schema, Name: rec.name}
	key := t.Name + "\x00" + p.String() + "\x00" + why
	m.mu.Lock()
	first := !m.refused[key]
	m.refused[key] = true
	m.mu.Unlock()
	if first {
		m.Logger.Warn("partitions: a record of inboxkeeper.partitions is not borne out by the relation it names; it is not acted on. Check who wrote it, then delete the record",
			"table", t.Name, "partition", p.String(), "why", why)
	}
	res.Blocked = append(res.Blocked, Blocked{Partition: p.String(), Reason: ReasonUntrusted, Detail: why, Detached: true})
}

// managedOIDs are the relations a policy manages.
func managedOIDs(tables []*catalog.Table) map[uint32]bool {
	out := map[uint32]bool{}
	for _, t := range tables {
		out[t.OID] = true
	}
	return out
}
