package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// ErrKeyTable marks a permanent key table that is missing and cannot be
// created with the privileges at hand: a configuration problem, fixed by
// running `inboxkeeper migrate` as the owner.
var ErrKeyTable = errors.New("permanent key table")

// Querier is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Querier interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// EnsureKeyTable creates the permanent key table of t when it does not exist
// yet: the key columns, the scope and the hash named and typed as in t, the
// first_seen date, and the primary key on the key columns. It returns
// whether it created the table. Without a permanent key it does nothing.
//
// Existence is checked first, so a role without CREATE on the schema works
// once the owner has created the table (`inboxkeeper migrate` does).
//
// When Citus distributes t, the key table is created distributed on the
// same column and co-located with t, in the same implicit transaction
// (KeyTableDDL): the expiry deleter writes a row's key in the
// statement that deletes the row, and co-location keeps that write on the
// row's node. An existing key table is checked by catalog.Resolve, never
// redistributed.
func EnsureKeyTable(ctx context.Context, db Querier, t *catalog.Table) (bool, error) {
	if KeyOf(t) == nil {
		return false, nil
	}
	k := KeyOf(t)
	exists := func() (bool, error) {
		var ok bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2)`, k.Table.Schema, k.Table.Name).Scan(&ok)
		return ok, err
	}
	ok, err := exists()
	if err != nil {
		return false, fmt.Errorf("table %s: look up the permanent key table %s: %w", t.Name, k.Name, err)
	}
	if ok {
		k.Exists = true
		return false, nil
	}
	// Without arguments pgx sends the text in one simple-protocol round
	// trip: with Citus, the CREATE and the distribution commit together.
	_, err = db.Exec(ctx, KeyTableDDL(t))
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.Code == retry.SQLStateInsufficientPriv || pe.Code == retry.SQLStateInvalidSchemaName {
			return false, fmt.Errorf("%w %s of table %s does not exist and cannot be created (%s); run `inboxkeeper migrate` as the owner of the schema, or create it:\n%s",
				ErrKeyTable, k.Name, t.Name, pe.Message, KeyTableDDL(t))
		}
		// Created meanwhile by another instance: a duplicate, or on
		// Citus create_distributed_table refusing the table that CREATE
		// TABLE IF NOT EXISTS left alone (the transaction rolled back,
		// so a table there now is the other instance's).
		if pe.Code == retry.SQLStateDuplicateTable || pe.Code == retry.SQLStateUniqueViolation || t.Distributed() {
			if ok, _ := exists(); ok {
				k.Exists = true
				return false, nil
			}
		}
	}
	if err != nil {
		return false, fmt.Errorf("table %s: create the permanent key table %s: %w", t.Name, k.Name, err)
	}
	k.Exists = true
	return true, nil
}

// CheckKeyTables checks, for a dry run, what EnsureKeyTables would do
// without creating anything: a missing permanent key table whose schema
// the role may not create in (or that does not exist) is ErrKeyTable, as
// the real run would find.
func CheckKeyTables(ctx context.Context, db Querier, tables []*catalog.Table) error {
	for _, t := range tables {
		if KeyOf(t) == nil {
			continue
		}
		k := KeyOf(t)
		var exists, canCreate bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2),
       coalesce((SELECT has_schema_privilege(n.oid, 'CREATE') FROM pg_namespace n WHERE n.nspname = $1), false)`,
			k.Table.Schema, k.Table.Name).Scan(&exists, &canCreate)
		if err != nil {
			return fmt.Errorf("table %s: look up the permanent key table %s: %w", t.Name, k.Name, err)
		}
		k.Exists = exists
		if !exists && !canCreate {
			return fmt.Errorf("%w %s of table %s does not exist and cannot be created (no CREATE privilege on schema %s); run `inboxkeeper migrate` as the owner of the schema, or create it:\n%s",
				ErrKeyTable, k.Name, t.Name, k.Table.Schema, KeyTableDDL(t))
		}
	}
	return nil
}

// CopyPermanentKeys writes the permanent keys of every row of source (a
// quoted relation with t's columns: t itself, or one of its partitions) in
// one statement of tx, and returns how many keys were new. Partition
// retirement calls it in the transaction that drops a detached partition,
// so the keys and the rows never both go missing. A table without a
// permanent key copies nothing.
func CopyPermanentKeys(ctx context.Context, tx pgx.Tx, t *catalog.Table, source string) (int64, error) {
	if KeyOf(t) == nil {
		return 0, nil
	}
	k := KeyOf(t)
	sql := insertKeys(k, source+" s", func(i int) string { return "s." + k.Columns[i].Quoted }, "s."+k.FirstSeen.Quoted)
	tag, err := tx.Exec(ctx, sql)
	if err != nil {
		return 0, fmt.Errorf("table %s: copy the permanent keys of %s into %s: %w", t.Name, source, k.Name, err)
	}
	return tag.RowsAffected(), nil
}

// EnsureKeyTables creates the missing permanent key tables of tables
// before anything is deleted: a deletion writes its keys in the same
// statement, so the table must exist first. A role that may not create one
// gets ErrKeyTable, which says how to fix it.
func EnsureKeyTables(ctx context.Context, db Querier, tables []*catalog.Table, log *slog.Logger) error {
	for _, t := range tables {
		created, err := EnsureKeyTable(ctx, db, t)
		if err != nil {
			return err
		}
		if created {
			log.Info("tiering: created the permanent key table", "table", t.Name, "keys", KeyOf(t).Name)
		}
	}
	return nil
}

// DeleteKeys returns the parts of the deleter's batch DELETE (expiry; the
// deleted rows aliased d) that write their permanent keys
// (tiers.permanent_key) in the same statement, so that there is never a
// moment when neither the row nor its key exists: extra RETURNING columns,
// a data-modifying CTE reading them, and the count of keys written.
// Without a permanent key: nothing, and 0.
func DeleteKeys(t *catalog.Table) (returning, cte, count string) {
	if KeyOf(t) == nil {
		return "", "", "0::bigint"
	}
	k := KeyOf(t)
	var b strings.Builder
	for i, c := range k.Columns {
		fmt.Fprintf(&b, ", d.%s AS pk_%d", c.Quoted, i)
	}
	fmt.Fprintf(&b, ", d.%s AS pk_first_seen", k.FirstSeen.Quoted)
	insert := insertKeys(k, "gone g", func(i int) string { return fmt.Sprintf("g.pk_%d", i) }, "g.pk_first_seen")
	return b.String(), ", kept AS (\n  " + insert + "\n)", "(SELECT count(*) FROM kept)"
}

// dateOf returns SQL turning ref, a value of k's FirstSeen column, into
// the UTC date stored in first_seen.
func dateOf(k *PermanentKey, ref string) string {
	if k.FirstSeen.IsTimestamptz() {
		return "(" + ref + " AT TIME ZONE 'UTC')::date"
	}
	return "(" + ref + ")::date"
}

// insertKeys returns an INSERT of permanent keys into k's key table from
// rel (an SQL relation, e.g. a CTE or a quoted table followed by an alias).
// ref(i) is SQL for Columns[i] in rel and firstSeen for the FirstSeen
// column. Rows with a NULL key column have no permanent key and are left
// out; a key already present keeps its first row. It returns one row per
// key written.
func insertKeys(k *PermanentKey, rel string, ref func(i int) string, firstSeen string) string {
	var cols, vals, notNull []string
	for i, c := range k.Columns {
		cols = append(cols, c.Quoted)
		vals = append(vals, ref(i))
		if i < k.NKey {
			notNull = append(notNull, ref(i)+" IS NOT NULL")
		}
	}
	cols = append(cols, sqlident.QuoteIdent(policy.FirstSeenColumn))
	vals = append(vals, dateOf(k, firstSeen))
	return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM %s WHERE %s ON CONFLICT DO NOTHING RETURNING 1",
		k.Ident, strings.Join(cols, ", "), strings.Join(vals, ", "), rel, strings.Join(notNull, " AND "))
}

// CreateKeyTableSQL is the DDL of k's key table: the columns as in the
// source, the first_seen date, and the primary key.
func CreateKeyTableSQL(k *PermanentKey) string {
	var defs, pk []string
	for i, c := range k.Columns {
		def := c.Quoted + " " + c.Type
		if i < k.NKey {
			def += " NOT NULL"
			pk = append(pk, c.Quoted)
		}
		defs = append(defs, def)
	}
	defs = append(defs, sqlident.QuoteIdent(policy.FirstSeenColumn)+" date")
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n    %s,\n    PRIMARY KEY (%s)\n)", k.Ident, strings.Join(defs, ",\n    "), strings.Join(pk, ", "))
}

// KeyTableDDL is what creates the key table of t: CreateKeyTableSQL, and
// when t is distributed by Citus, the statement that distributes the key
// table on the same column, co-located with t, so that a deletion writes
// each key on the node that held its row (one multi-statement text: run it
// as one implicit transaction, so the table never exists undistributed).
func KeyTableDDL(t *catalog.Table) string {
	k := KeyOf(t)
	if !t.Distributed() {
		return CreateKeyTableSQL(k)
	}
	return CreateKeyTableSQL(k) + ";\n" + distributeKeyTable(k, t)
}

// distributeKeyTable distributes k's key table like t (see KeyTableDDL).
// Tables are named by their canonical spelling, which Citus parses like
// SQL text.
func distributeKeyTable(k *PermanentKey, t *catalog.Table) string {
	return fmt.Sprintf("SELECT create_distributed_table(%s, %s, colocate_with => %s)",
		sqlident.QuoteLiteral(k.Name), sqlident.QuoteLiteral(t.Citus.Column.Name), sqlident.QuoteLiteral(t.Name))
}
