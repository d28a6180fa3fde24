package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/app/setup"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
)

// records are the subcommands of a group that keeps one kind of record,
// `hold` or `replay`: one starts a record (begin parses its flags and
// writes it), list lists them, and one ends a record by its ID.
type records[T any] struct {
	group, start, end, expected string // "hold", "add", "release", "add, list or release"
	begin                       func(ctx context.Context, fs *flag.FlagSet, args []string) error
	all, none                   string // list's --all help, and what it prints when there are none
	list                        func(context.Context, holds.Querier, bool) ([]T, error)
	describe                    func(T) string
	ended                       string // "released": what end says of the record
	finish                      func(context.Context, holds.Beginner, int64) error
}

func runRecords[T any](ctx context.Context, a *app, args []string, r records[T]) error {
	if err := a.group(r.group, args); err != nil {
		return err
	}
	fs := a.newFlags(r.group + " " + args[0])
	switch args[0] {
	case r.start:
		return r.begin(ctx, fs, args[1:])
	case "list":
		all := fs.Bool("all", false, r.all)
		return listRecords(ctx, a, fs, args[1:], all, r.none, r.list, r.describe)
	case r.end:
		return a.endRecord(ctx, fs, args[1:], r.group, r.ended, r.finish)
	}
	return pass.Usagef("%s: unknown subcommand %q (expected %s)", r.group, args[0], r.expected)
}

func (a *app) hold(ctx context.Context, args []string) error {
	return runRecords(ctx, a, args, records[holds.Hold]{group: "hold", start: "add", end: "release", expected: "add, list or release",
		begin: a.holdAdd, all: "include released and expired holds", none: "no holds", list: holds.ListHolds, describe: render.DescribeHold,
		ended: "released", finish: holds.ReleaseHold})
}

func (a *app) replay(ctx context.Context, args []string) error {
	return runRecords(ctx, a, args, records[holds.Replay]{group: "replay", start: "start", end: "finish", expected: "start, finish or list",
		begin: a.replayStart, all: "include finished replays", none: "no replays", list: holds.ListReplays, describe: render.DescribeReplay,
		ended: "finished", finish: holds.FinishReplay})
}

func (a *app) holdAdd(ctx context.Context, fs *flag.FlagSet, args []string) error {
	table := fs.String("table", "", "schema-qualified table from the policy")
	reason := fs.String("reason", "", "why the rows must stay (required)")
	owner := fs.String("owner", "", "who is responsible for the hold (required)")
	var scope stringFlag
	var from, to, expires timeFlag
	lasts := durationFlag{min: time.Second}
	fs.Var(&scope, "scope", "only rows whose scope column has this value")
	fs.Var(&from, "from", "only rows whose event time is at or after this (RFC 3339, or a date: 00:00 UTC)")
	fs.Var(&to, "to", "only rows whose event time is before this (RFC 3339, or a date: 00:00 UTC)")
	fs.Var(&expires, "expires", "the hold ends by itself at this time, which must lie in the future (RFC 3339, or a date: 00:00 UTC)")
	fs.Var(&lasts, "for", "the hold ends by itself this long from now (90d, 36h); instead of --expires")
	blocks := fs.String("blocks", holds.BlocksAll, "what the hold blocks: all (demotion of the payload and deletion: a legal hold) or delete (deletion only)")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if *blocks != holds.BlocksAll && *blocks != holds.BlocksDelete {
		return pass.Usagef("hold add: --blocks %q: want delete or all", *blocks)
	}
	if fs.NArg() > 0 {
		return pass.Usagef("hold add: unexpected argument %q", fs.Arg(0))
	}
	if *reason == "" || *owner == "" {
		return pass.Usagef("hold add: --reason and --owner are required")
	}
	if expires.t != nil && lasts.d != 0 {
		return pass.Usagef("hold add: give --expires or --for, not both")
	}
	if scope.v != nil && *scope.v == "" {
		// Most often a shell variable that was not set: a hold that
		// matches no row, where one for every scope was meant.
		return pass.Usagef("hold add: --scope is empty; give the scope value, or leave --scope out to hold every scope")
	}
	return a.startRecord(ctx, *table, func(pool *pgxpool.Pool, t *catalog.Table) (int64, error) {
		return holds.AddHold(ctx, pool, t, holds.HoldSpec{Scope: scope.v, From: from.t, To: to.t, Reason: *reason, Owner: *owner,
			Expires: expires.t, ExpiresIn: lasts.d, Blocks: *blocks, Fence: a.Fence()})
	})
}

func (a *app) replayStart(ctx context.Context, fs *flag.FlagSet, args []string) error {
	table := fs.String("table", "", "schema-qualified table from the policy")
	scope := fs.String("scope", "", "the scope value being replayed (required)")
	owner := fs.String("owner", "", "who runs the replay (required)")
	force := fs.Bool("force", false, "start even if the range reaches past what is still remembered (recorded and counted)")
	var from, to timeFlag
	fs.Var(&from, "from", "event-time range start, inclusive (RFC 3339, or a date: 00:00 UTC; required)")
	fs.Var(&to, "to", "event-time range end, exclusive (RFC 3339, or a date: 00:00 UTC; required)")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	if *scope == "" || *owner == "" || from.t == nil || to.t == nil {
		return pass.Usagef("replay start: --table, --scope, --from, --to and --owner are required")
	}
	return a.startRecord(ctx, *table, func(pool *pgxpool.Pool, t *catalog.Table) (int64, error) {
		rec, err := a.RetentionRecord(t.Name, *scope)
		if err != nil {
			return 0, err
		}
		return holds.StartReplay(ctx, pool, t, holds.ReplaySpec{Scope: *scope, From: *from.t, To: *to.t, Owner: *owner, Force: *force, Fence: a.Fence(),
			Record: rec})
	})
}

// startRecord runs `hold add` or `replay start` on the policy's table
// named table: start writes the record, and its ID is the output.
func (a *app) startRecord(ctx context.Context, table string, start func(*pgxpool.Pool, *catalog.Table) (int64, error)) error {
	pool, t, err := a.TableFor(ctx, table)
	if err != nil {
		return err
	}
	id, err := start(pool, t)
	if err != nil {
		return setup.HoldErr(err)
	}
	fmt.Fprintln(a.stdout, id)
	return nil
}

// listRecords runs `hold list` or `replay list`: the records list gives,
// one line each as describe writes it, or none when there are none.
func listRecords[T any](ctx context.Context, a *app, fs *flag.FlagSet, args []string, all *bool, none string,
	list func(context.Context, holds.Querier, bool) ([]T, error), describe func(T) string) error {
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	pool, err := a.ControlPool(ctx)
	if err != nil {
		return err
	}
	rs, err := list(ctx, pool, *all)
	if err != nil {
		return err
	}
	render.PrintLines(a.stdout, rs, none, describe)
	return nil
}

// endRecord runs `hold release ID` or `replay finish ID`: end ends the
// record, and "<what> ID <ended>" says so.
func (a *app) endRecord(ctx context.Context, fs *flag.FlagSet, args []string, what, ended string,
	end func(context.Context, holds.Beginner, int64) error) error {
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	id, err := parseID(fs, what)
	if err != nil {
		return err
	}
	pool, err := a.ControlPool(ctx)
	if err != nil {
		return err
	}
	if err := end(ctx, pool, id); err != nil {
		return setup.HoldErr(err)
	}
	fmt.Fprintf(a.stdout, "%s %d %s\n", what, id, ended)
	return nil
}
