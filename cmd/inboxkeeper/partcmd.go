package main

import (
	"context"
	"fmt"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
)

// partitionsCmd is `inboxkeeper partitions ensure`: create the missing
// partitions now (before a deploy that writes further ahead, say) without
// retiring anything.
func (a *app) partitionsCmd(ctx context.Context, args []string) error {
	if err := a.group("partitions", args); err != nil {
		return err
	}
	if args[0] != "ensure" {
		return pass.Usagef("partitions: want \"partitions ensure\"")
	}
	fs := a.newFlags("partitions ensure")
	dryRun := fs.Bool("dry-run", false, "list the partitions that would be created; create nothing")
	if err := a.parseOnlyFlags(fs, args[1:]); err != nil {
		return err
	}
	pool, tables, err := a.preparePrimary(ctx)
	if err != nil || pool == nil {
		return err
	}
	if err := a.SessionForPartitions(ctx, tables); err != nil {
		return err
	}
	m := a.Wiring(pool, *dryRun, nil, nil).Partitions(a.Cfg, tables)
	if len(m.Tables()) == 0 {
		fmt.Fprintln(a.stdout, "no table in the policy has a partitions section")
		return nil
	}
	results, err := m.Ensure(ctx)
	failed := render.PrintPartitionResults(a.stdout, results, *dryRun)
	if err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tables failed (see the log)", failed, len(results))
	}
	return nil
}
