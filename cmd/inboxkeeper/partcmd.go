package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// partitionManager builds the partition manager of tables; its DDL runs on
// the session pool when there is one (sessionForPartitions).
func (a *app) partitionManager(w wiring, tables []*catalog.Table, m *partitions.Metrics) *partitions.Manager {
	pool := w.pool
	if a.ddl != nil && !w.dryRun {
		pool = a.ddl
	}
	b := service.Base{
		LockTimeout:      a.cfg.DDLLockTimeout,
		StatementTimeout: a.cfg.StatementTimeout,
		IdleTimeout:      a.cfg.IdleTimeout,
		Active:           w.active,
		DryRun:           w.dryRun,
		Logger:           a.log,
	}
	if w.th != nil {
		b.Throttle = w.th
	}
	return partitions.New(pool, tables, partitions.Options{Base: b, Metrics: m, CopyKeys: tiering.CopyPermanentKeys})
}

// sessionForPartitions makes sure, before anything is touched, that the
// partition DDL of tables can have sessions of its own (DETACH ...
// CONCURRENTLY cannot run in a transaction, and its fence is a session
// lock), and opens a pool on INBOXKEEPER_SESSION_DATABASE_URL for it when
// that is set. A dry run does no DDL and needs none.
func (a *app) sessionForPartitions(ctx context.Context, tables []*catalog.Table, dryRun bool) error {
	if dryRun || a.ddl != nil || !slices.ContainsFunc(tables, (*catalog.Table).Partitioned) {
		return nil
	}
	url, err := a.sessionURL("partition DDL (DETACH ... CONCURRENTLY under the hold fence)")
	if err != nil || url != a.cfg.SessionURL {
		return err // DATABASE_URL is direct: the main pool serves
	}
	pc, err := dbconn.Pool(url, 4, dbconn.AppName(a.command))
	if err != nil {
		return configError{fmt.Errorf("INBOXKEEPER_SESSION_DATABASE_URL: %w (%s)", err, config.RedactURL(url))}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return fmt.Errorf("connect to %s (INBOXKEEPER_SESSION_DATABASE_URL): %w", config.RedactURL(url), err)
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
	if err := a.parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("partitions ensure: unexpected argument %q", fs.Arg(0))
	}
	pool, tables, err := a.preparePrimary(ctx)
	if err != nil || pool == nil {
		return err
	}
	if err := a.sessionForPartitions(ctx, tables, *dryRun); err != nil {
		return err
	}
	m := a.partitionManager(wiring{pool: pool, dryRun: *dryRun}, tables, nil)
	if len(m.Tables()) == 0 {
		fmt.Fprintln(a.stdout, "no table in the policy has a partitions section")
		return nil
	}
	results, err := m.Ensure(ctx)
	failed := printPartitionResults(a.stdout, results, *dryRun)
	if err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tables failed (see the log)", failed, len(results))
	}
	return nil
}

// printPartitionResults writes one line per table and returns how many
// failed.
func printPartitionResults(w io.Writer, results []partitions.TableResult, dryRun bool) int {
	created, detached, dropped := "created", "detached", "dropped"
	if dryRun {
		created, detached, dropped = "to create", "to detach", "to drop"
	}
	failed := 0
	for _, r := range results {
		line := fmt.Sprintf("%s: partitions %s %d, %s %d, %s %d, waiting %d, coverage %s, %s",
			r.Table, created, len(r.Created), detached, len(r.Detached), dropped, len(r.Dropped), len(r.Blocked),
			coverage(r), humantime.Duration(r.Duration))
		for _, c := range r.Created {
			line += "\n  " + created + " " + c
		}
		for _, d := range r.Detached {
			line += "\n  " + detached + " " + d
		}
		for _, d := range r.Dropped {
			line += "\n  " + dropped + " " + d
		}
		for _, b := range r.Blocked {
			line += fmt.Sprintf("\n  waits: %s (%s: %s)", b.Partition, b.Reason, b.Detail)
		}
		if r.StoppedEarly.Stopped() {
			line += "\n  stopped early: " + r.StoppedEarly.String()
		}
		if r.Err != nil {
			failed++
			line += "\n  FAILED: " + r.Err.Error()
		}
		fmt.Fprintln(w, line)
	}
	return failed
}

// coverage spells how far ahead rows can land.
func coverage(r partitions.TableResult) string {
	if r.CoveredUntil == nil {
		return "unbounded (a MAXVALUE partition)"
	}
	return fmt.Sprintf("%s (until %s)", days(r.Coverage), r.CoveredUntil.Format(time.RFC3339))
}

func days(d time.Duration) string { return humantime.Duration(d) }

// writePartitionStatus describes a partitioned table for `status`, from a
// dry-run pass: what exists, what is due and why it waits.
func writePartitionStatus(w io.Writer, r partitions.TableResult) {
	if r.Err != nil {
		fmt.Fprintf(w, "  ERROR: %v\n", r.Err)
	}
	fmt.Fprintf(w, "  coverage:                 %s\n", coverage(r))
	fmt.Fprintf(w, "  cleanup lag:              %s\n", humantime.Duration(r.CleanupLag))
	if len(r.Created) > 0 {
		fmt.Fprintf(w, "  missing (next pass makes): %s\n", strings.Join(r.Created, ", "))
	}
	fmt.Fprintf(w, "  attached partitions:      %d\n", len(r.Partitions))
	for _, p := range r.Partitions {
		state := ""
		switch {
		case p.DetachPending:
			state = " detach pending (the next pass finishes it)"
		case p.Upper != nil && !p.Upper.After(r.Now):
			state = " due"
		}
		fmt.Fprintf(w, "    %s [%s, %s)%s\n", p, bound(p.Lower), bound(p.Upper), state)
	}
	for _, d := range r.Detached {
		fmt.Fprintf(w, "  next pass detaches:       %s\n", d)
	}
	for _, b := range r.Blocked {
		fmt.Fprintf(w, "  waits:                    %s (%s: %s)\n", b.Partition, b.Reason, b.Detail)
	}
	for _, d := range r.Waiting {
		fmt.Fprintf(w, "  detached, dropped after:  %s at %s\n", policyName(d), d.DropAt.Format(time.RFC3339))
	}
	for _, d := range r.Dropped {
		fmt.Fprintf(w, "  next pass drops:          %s\n", d)
	}
}

func policyName(d partitions.Detached) string {
	return partitions.Partition{Schema: d.Schema, Name: d.Name}.String()
}

func bound(x *time.Time) string {
	if x == nil {
		return "unbounded"
	}
	return x.UTC().Format(time.RFC3339)
}

// partitionJSON is one partitioned table in `status --json`.
func partitionJSON(r partitions.TableResult) map[string]any {
	cov := any(r.Coverage.Seconds())
	if r.CoveredUntil == nil {
		cov = nil // unbounded: JSON has no infinity
	}
	attached := []map[string]any{}
	for _, p := range r.Partitions {
		attached = append(attached, map[string]any{"name": p.String(), "from": p.Lower, "to": p.Upper, "detach_pending": p.DetachPending})
	}
	blocked := []map[string]any{}
	for _, b := range r.Blocked {
		blocked = append(blocked, map[string]any{"partition": b.Partition, "reason": b.Reason, "detail": b.Detail, "detached": b.Detached})
	}
	waiting := []map[string]any{}
	for _, d := range r.Waiting {
		waiting = append(waiting, map[string]any{"partition": policyName(d), "detached_at": d.DetachedAt, "drop_at": d.DropAt})
	}
	out := map[string]any{
		"table": r.Table, "now": r.Now, "managed_by": "partition",
		"coverage_seconds": cov, "covered_until": r.CoveredUntil, "cleanup_lag_seconds": r.CleanupLag.Seconds(),
		"partitions": attached, "missing": list(r.Created), "due": list(r.Detached), "blocked": blocked, "detached": waiting,
	}
	if r.Err != nil {
		out["error"] = r.Err.Error()
	}
	return out
}

// list is s, or an empty list: status --json writes [] for none, never null.
func list[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
