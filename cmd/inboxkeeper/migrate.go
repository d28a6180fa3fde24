package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

func (a *app) migrate(ctx context.Context, args []string) error {
	if err := a.noArgs("migrate", args); err != nil {
		return err
	}
	if _, err := a.connect(ctx); err != nil {
		return err
	}
	// A dedicated connection: the migration lock is a session lock.
	url, err := a.sessionURL("migrate")
	if err != nil {
		return err
	}
	conn, err := a.sessionConn(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	applied, err := migrations.Migrate(ctx, conn)
	if err != nil {
		return err
	}
	a.migrateKeyTables(ctx, conn)
	if len(applied) == 0 {
		fmt.Fprintf(a.stdout, "control schema %s is up to date (version %d)\n", migrations.Schema, migrations.Latest())
		return nil
	}
	fmt.Fprintf(a.stdout, "control schema %s migrated to version %d (applied %v)\n", migrations.Schema, migrations.Latest(), applied)
	return nil
}

// migrateKeyTables is the part of `migrate` that creates the permanent key
// tables the policy names, as the owner, so that the daemon's role needs no
// CREATE privilege. migrate does not need a policy: without a readable
// policy file, or with tables not created yet, it says so and goes on. It
// says so loudly, because a migrate Job without the policy mounted leaves a
// tiered policy's daemon waiting for its key table.
func (a *app) migrateKeyTables(ctx context.Context, conn *pgx.Conn) {
	if _, err := os.Stat(a.cfg.PolicyFile); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(a.stdout, "permanent key tables: none checked, no policy file at %s (INBOXKEEPER_POLICY_FILE); "+
			"with a tiers: section in the policy, mount it and run migrate again\n", a.cfg.PolicyFile)
		return
	}
	p, err := a.loadPolicy()
	if err != nil {
		fmt.Fprintf(a.stdout, "permanent key tables: skipped, the policy file does not load: %v\n", err)
		return
	}
	for _, pt := range p.Tables {
		if pt.Tiers == nil || pt.Tiers.PermanentKey == nil {
			continue
		}
		t, err := catalog.Resolve(ctx, conn, pt)
		if err != nil {
			fmt.Fprintf(a.stdout, "permanent key table of %s: skipped: %v\n", pt.Name, err)
			continue
		}
		created, err := tiering.EnsureKeyTable(ctx, conn, t)
		switch {
		case err != nil:
			fmt.Fprintf(a.stdout, "permanent key table of %s: %v\n", pt.Name, err)
		case created:
			fmt.Fprintf(a.stdout, "permanent key table %s created for %s\n", t.Tiers.Key.Name, t.Name)
		default:
			fmt.Fprintf(a.stdout, "permanent key table %s of %s exists\n", t.Tiers.Key.Name, t.Name)
		}
	}
}
