package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/retention"
)

// plan prints the retention record of every consumer scope or, with
// --check, compares the records with what is deployed.
func (a *app) plan(ctx context.Context, args []string) error {
	fl := a.newFlags("plan")
	asJSON := fl.Bool("json", false, "print the records as a JSON array")
	check := fl.Bool("check", false, "compare the records with the deployed tables; exit 1 when a promise is not kept")
	redisURL := fl.String("redis-url", "", "with --check: also judge this Redis (redis://[user:password@]host[:port]) as a volatile tier")
	apply := fl.Bool("apply", false, "install each record's rule in the control schema, for the claim path (inboxkeeper.claim)")
	files, err := a.parseInterleaved(fl, args) // flags before or after FILE
	if err != nil {
		return err
	}
	switch {
	case len(files) > 1:
		return pass.Usagef("plan: unexpected argument %q (give at most one FILE)", files[1])
	case *redisURL != "" && !*check:
		return pass.Usagef("plan: --redis-url needs --check")
	case *asJSON && *check:
		return pass.Usagef("plan: --json and --check cannot be combined")
	case *apply && (*check || *asJSON):
		return pass.Usagef("plan: --apply cannot be combined with --check or --json")
	}
	plans, p, err := a.LoadPlans(files)
	if err != nil {
		return err
	}
	if *check {
		return a.checkPlans(ctx, plans, p, *redisURL)
	}
	if *apply {
		d, err := a.Deployment(ctx, plans, p, "--apply")
		if err != nil {
			return err
		}
		return retention.Apply(ctx, plans, d, a.say)
	}
	if *asJSON {
		out, err := json.MarshalIndent(plans, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s\n", out)
		return nil
	}
	for i, pl := range plans {
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		fmt.Fprint(a.stdout, pl.Markdown())
	}
	return nil
}

// checkPlans is plan --check: a line per verdict.
func (a *app) checkPlans(ctx context.Context, plans []retention.Plan, p *policy.Policy, redisURL string) error {
	d, err := a.Deployment(ctx, plans, p, "--check")
	if err != nil {
		return err
	}
	d.RedisURL = redisURL
	failed, total := retention.Check(ctx, plans, d, func(v retention.Verdict) { fmt.Fprintln(a.stdout, v) })
	if failed > 0 {
		return fmt.Errorf("plan --check: %d of %d checks failed: the deployment does not keep the promise of the retention record", failed, total)
	}
	return nil
}
