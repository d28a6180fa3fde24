package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/render"
)

// sessionForPartitions makes sure, before anything is touched, that the
// partition DDL of tables can have sessions of its own (DETACH ...
// CONCURRENTLY cannot run in a transaction, and its fence is a session
// lock), and so can the compaction of a table whose policy asks for one
// (compactionSession), and opens a pool on INBOXKEEPER_SESSION_DATABASE_URL
// for them when that is set. A dry run does no DDL, but checks the same: it
// is how a change is tried before it runs.
func (a *app) sessionForPartitions(ctx context.Context, tables []*catalog.Table) error {
	switch {
	case slices.ContainsFunc(tables, (*catalog.Table).Partitioned):
		return a.sessionFor(ctx, "partition DDL (DETACH ... CONCURRENTLY under the hold fence)")
	case slices.ContainsFunc(tables, func(t *catalog.Table) bool { return t.Policy.Compact != nil && !t.Distributed() }):
		return a.sessionFor(ctx, compactionSession)
	}
	return nil
}

// compactionSession is what the compaction needs a session for: its VACUUM
// cannot run in a transaction, so its settings are the session's.
const compactionSession = "compaction (its VACUUM cannot run in a transaction, so its lock_timeout and cost delay are session settings)"

// sessionFor opens the pool of sessions of their own that what needs, or
// says why there can be none (sessionURL).
func (a *app) sessionFor(ctx context.Context, what string) error {
	if a.ddl != nil {
		return nil
	}
	url, err := a.sessionURL(what)
	if err != nil || url != a.cfg.SessionURL {
		return err // DATABASE_URL is direct: the main pool serves
	}
	pool, err := dbconn.OpenDirect(ctx, url, 4, dbconn.AppName(a.command))
	if err != nil {
		return connectFailed("INBOXKEEPER_SESSION_DATABASE_URL", url, err)
	}
	a.ddl = pool
	return nil
}

// partitionsCmd is `inboxkeeper partitions ensure`: create the missing
// partitions now (before a deploy that writes further ahead, say) without
// retiring anything.
func (a *app) partitionsCmd(ctx context.Context, args []string) error {
	if err := a.group("partitions", args); err != nil {
		return err
	}
	if args[0] != "ensure" {
		return usagef("partitions: want \"partitions ensure\"")
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
	if err := a.sessionForPartitions(ctx, tables); err != nil {
		return err
	}
	m := a.wiring(pool, *dryRun, nil, nil).Partitions(a.cfg, tables)
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
