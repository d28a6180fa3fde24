package main

import (
	"context"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/app/setup"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
)

// compactCmd is `inboxkeeper compact --table T`: give the empty space of
// one ordinary table back to the operating system now (internal/domain/compact),
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
	pool, t, err := a.TableFor(ctx, *table)
	if err != nil {
		return err
	}
	if err := setup.CompactTarget(t); err != nil {
		return err
	}
	if standby, err := dbconn.InRecovery(ctx, pool); err != nil || standby {
		if standby {
			a.say(setup.OnStandby)
		}
		return err
	}
	if err := a.SessionFor(ctx, setup.CompactionSession); err != nil {
		return err
	}
	if err := a.Preflight(ctx, pool, *dryRun); err != nil {
		return err
	}
	return a.Compact(ctx, pool, t, *dryRun, compact.Allow{Triggers: *triggers, Publication: *publication},
		func(rs []compact.Result) int { return render.PrintCompactResults(a.stdout, rs, *dryRun) })
}
