// Package migrations creates and upgrades the control schema "inboxkeeper"
// from numbered SQL files embedded in the binary.
//
// A library API for programs that embed inboxkeeper's control schema (tests,
// an application's own migration step): Migrate and Check are stable.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/*.sql
var files embed.FS

// Schema is the control schema's name. It is fixed: holds written by one
// instance must be seen by every other instance on the same database.
const Schema = "inboxkeeper"

// lockKey serialises concurrent `inboxkeeper migrate` runs (two sidecars
// starting at once). Arbitrary, but fixed forever.
const lockKey int64 = 0x1b0c_6b33_0000_0001

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// All returns the embedded migrations in order.
func All() []Migration {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("migrations: badly named file " + e.Name())
		}
		body, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Latest is the version a fully migrated control schema has.
func Latest() int {
	all := All()
	return all[len(all)-1].Version
}

// Migrate applies every migration not yet applied, each in its own
// transaction, and returns the versions it applied. It holds a session
// advisory lock on conn for the whole run so that two processes migrating at
// once apply each file exactly once; conn must therefore be a dedicated
// connection, not one borrowed from a transaction-mode pooler.
func Migrate(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return nil, fmt.Errorf("migrate: take the migration lock: %w", err)
	}
	defer func() {
		// A failed unlock only matters if the connection lives on; the
		// caller closes it, which releases the lock anyway.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey)
	}()

	// On a Citus coordinator with schema-based sharding on, CREATE SCHEMA
	// would make the control schema a distributed schema, each of its
	// tables a single-shard table on some worker, which the multi-statement
	// migrations cannot be sent to. The control schema is read and written
	// only on the coordinator (docs/guides/citus.md), so it is created as a
	// plain schema there. The current_setting test keeps the statement a
	// no-op without Citus.
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT set_config('citus.enable_schema_based_sharding', 'off', true)
WHERE current_setting('citus.enable_schema_based_sharding', true) IS NOT NULL`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS inboxkeeper;
CREATE TABLE IF NOT EXISTS inboxkeeper.schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("migrate: create schema %s: %w", Schema, err)
	}
	if err := notTenantSchema(ctx, conn); err != nil {
		return nil, err
	}
	current, err := currentVersion(ctx, conn)
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range All() {
		if m.Version <= current {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO inboxkeeper.schema_version (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate: %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	if err := heartbeatToWorkers(ctx, conn); err != nil {
		return applied, err
	}
	return applied, nil
}

// heartbeatToWorkers makes the heartbeat table a Citus reference table on a
// coordinator: a copy on every node, written with each beat. A standby of
// a worker replays only that worker's WAL, so without a copy there it
// would never see a beat, and a worker's standby listed in
// INBOXKEEPER_REPLICA_URLS would read as unknown lag (fail closed) for
// ever. Nothing else in the control schema needs to leave the coordinator
// (docs/guides/citus.md). It runs on every migrate, so a database that
// became a coordinator after its first migrate gets it too; without Citus
// it does nothing.
func heartbeatToWorkers(ctx context.Context, conn *pgx.Conn) error {
	var coordinator, done bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&coordinator); err != nil || !coordinator {
		return err
	}
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = 'inboxkeeper.heartbeat'::regclass)`).Scan(&done)
	if err != nil || done {
		return err
	}
	if _, err := conn.Exec(ctx, `SELECT create_reference_table('inboxkeeper.heartbeat')`); err != nil {
		return fmt.Errorf("migrate: copy inboxkeeper.heartbeat to the Citus workers (create_reference_table), for their standbys' lag: %w", err)
	}
	return nil
}

// notTenantSchema refuses a control schema that Citus schema-based sharding
// distributed (created by an older migrate, or by hand, with
// citus.enable_schema_based_sharding on): its tables live on one worker, and
// the migrations and the claim function expect them on the coordinator.
func notTenantSchema(ctx context.Context, conn *pgx.Conn) error {
	// Two statements: without Citus the catalog table does not exist, and
	// a query naming it would not even parse.
	var citus, tenant bool
	err := conn.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_schema') IS NOT NULL`).Scan(&citus)
	if err == nil && citus {
		err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_schema WHERE schemaid = 'inboxkeeper'::regnamespace)`).Scan(&tenant)
	}
	if err != nil {
		return fmt.Errorf("migrate: look for a Citus distributed schema %s: %w", Schema, err)
	}
	if tenant {
		return fmt.Errorf("migrate: schema %s is a Citus distributed schema (schema-based sharding), so its tables live on a worker; "+
			"the control schema must stay on the coordinator: run SELECT citus_schema_undistribute('%s') on the coordinator, then migrate again", Schema, Schema)
	}
	return nil
}

func currentVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var v int
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM inboxkeeper.schema_version").Scan(&v)
	return v, err
}

// ErrNotMigrated says the control schema is missing or older than this
// binary; the fix is always the same command.
var ErrNotMigrated = errors.New("run `inboxkeeper migrate` first")

// ErrTooNew says the control schema was migrated by a newer inboxkeeper.
var ErrTooNew = errors.New("upgrade inboxkeeper")

// Check verifies that the control schema exists at the version this binary
// expects. The daemon refuses to delete anything otherwise: without the holds
// table it could not honour a hold.
func Check(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('inboxkeeper.schema_version') IS NOT NULL").Scan(&exists); err != nil {
		return fmt.Errorf("check control schema: %w", err)
	}
	if !exists {
		return fmt.Errorf("control schema %q does not exist: %w", Schema, ErrNotMigrated)
	}
	v, err := currentVersion(ctx, q)
	if err != nil {
		return fmt.Errorf("check control schema: %w", err)
	}
	switch latest := Latest(); {
	case v < latest:
		return fmt.Errorf("control schema %q is at version %d, this binary needs %d: %w", Schema, v, latest, ErrNotMigrated)
	case v > latest:
		return fmt.Errorf("control schema %q is at version %d, newer than this binary knows (%d): %w", Schema, v, latest, ErrTooNew)
	}
	return nil
}
