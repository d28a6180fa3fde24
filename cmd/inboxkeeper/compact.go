package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/render"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
)

// compactCmd is `inboxkeeper compact --table T`: give the empty space of
// one ordinary table back to the operating system now (internal/compact),
// under the lease and the throttle, as a pass would.
func (a *app) compactCmd(ctx context.Context, args []string) error {
	fs := a.newFlags("compact")
	table := fs.String("table", "", "the table to compact, as the policy names it (schema.table)")
	dryRun := fs.Bool("dry-run", false, "say how much would come back; move nothing")
	triggers := fs.Bool("allow-triggers", false, "move rows although the table has UPDATE triggers, which fire for every row moved")
	publication := fs.Bool("allow-publication", false, "move rows although the table is in a publication, whose subscribers receive every row moved as an update")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	pool, t, err := a.tableFor(ctx, *table)
	if err != nil {
		return err
	}
	switch {
	case t.Partitioned():
		return usagef("compact: %s is managed by partition: its space comes back as whole partitions are dropped", t.Name)
	case t.Distributed():
		return usagef("compact: %s is distributed by Citus: compact its shards on the workers (VACUUM FULL or pg_repack there)", t.Name)
	}
	if standby, err := dbconn.InRecovery(ctx, pool); err != nil {
		return err
	} else if standby {
		fmt.Fprintln(a.stdout, "the database is a standby (in recovery): nothing to do here; run inboxkeeper against the primary")
		return nil
	}
	if err := a.sessionFor(ctx, compactionSession); err != nil {
		return err
	}
	if err := a.checkThrottleQuery(ctx, pool); err != nil {
		return err
	}
	errs, unread := a.checkReplicas(ctx)
	if len(errs) > 0 {
		return configError{errors.Join(errs...)}
	}
	a.warnUnread(unread, *dryRun)
	tables := []*catalog.Table{t}
	tn, err := settings.Read(ctx, pool, a.cfg, tables)
	if err != nil {
		return pass.SettingsError{Err: err}
	}
	w := a.wiring(pool, *dryRun, nil, nil)
	opts := compact.Options{Force: true, Allow: compact.Allow{Triggers: *triggers, Publication: *publication}, Progress: a.compactProgress()}
	if !*dryRun {
		ls, keep, err := a.takeLease(ctx, pool, "nothing moved")
		if err != nil {
			return err
		}
		defer keep()
		w.Active, w.BatchActive = ls.Check, ls.Check
		if w.Throttle, err = a.startThrottle(ctx, pool, nil, nil); err != nil {
			return err
		}
		defer w.Throttle.Stop()
	}
	results, err := w.Compactor(tn.For(t.Name), tables, opts).RunPass(ctx)
	failed := render.PrintCompactResults(a.stdout, results, *dryRun)
	if err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	if len(results) == 1 && errors.Is(results[0].Err, compact.ErrRefused) {
		return configError{results[0].Err}
	}
	if failed > 0 {
		return errors.New("the compaction failed (see above)")
	}
	return nil
}

// compactProgress logs how far a compaction has come, every 10 s.
func (a *app) compactProgress() func(compact.Progress) {
	var last time.Time
	return func(p compact.Progress) {
		if time.Since(last) < 10*time.Second {
			return
		}
		last = time.Now()
		a.log.Info("compact: moving", "table", p.Table, "moved", p.Moved, "page", p.Cursor, "down_to", p.Target, "truncated_bytes", p.Truncated)
	}
}
