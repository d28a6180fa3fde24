package render

import (
	"fmt"
	"io"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Stage prints a line per table for one step of a pass (once, the demo),
// clearing the progress bar on stderr first when there is one.
func Stage(stdout, stderr io.Writer, stage string, rs []pass.TableResult, dryRun bool) {
	switch stage {
	case pass.StagePartitions:
		PrintPartitionResults(stdout, pass.Of[partitions.TableResult](rs), dryRun)
	case pass.StageTiering:
		printTierResults(stdout, pass.Of[tiering.Result](rs), dryRun)
	case pass.StageExpiry:
		if t, ok := stderr.(*Terminal); ok {
			t.ClearBar()
		}
		printResults(stdout, pass.Of[expiry.TableResult](rs), dryRun)
	case pass.StageCompaction:
		PrintCompactResults(stdout, pass.Of[compact.Result](rs), dryRun)
	}
}

// printResults writes one line per table and returns how many failed.
func printResults(w io.Writer, results []expiry.TableResult, dryRun bool) int {
	verb := pick(dryRun, "would delete", "deleted")
	return writeResults(w, results, func(r expiry.TableResult) (string, retry.Early, error) {
		refs := ""
		if r.ProtectedByReferences > 0 {
			refs = fmt.Sprintf(", protected by references %d", r.ProtectedByReferences)
		}
		return fmt.Sprintf("%s: %s %d, protected by holds %d, protected by replays %d%s, %s",
			r.Table, verb, r.Deleted, r.ProtectedByHolds, r.ProtectedByReplays, refs, humantime.Duration(r.Duration)), r.StoppedEarly, r.Err
	})
}

// writeResults writes one line per result, with how it stopped early or
// failed, and returns how many failed.
func writeResults[R any](w io.Writer, results []R, line func(R) (string, retry.Early, error)) (failed int) {
	for _, r := range results {
		text, stopped, err := line(r)
		if stopped.Stopped() {
			text += " (stopped early: " + stopped.String() + ")"
		}
		if err != nil {
			failed++
			text += " FAILED: " + err.Error()
		}
		fmt.Fprintln(w, text)
	}
	return failed
}

// pick is the first when cond holds, else the second.
func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

// printTierResults writes one line per tiered table and returns how many
// failed.
func printTierResults(w io.Writer, results []tiering.Result, dryRun bool) int {
	verb := pick(dryRun, "would demote", "demoted")
	return writeResults(w, results, func(r tiering.Result) (string, retry.Early, error) {
		return fmt.Sprintf("%s: %s %d to %s, payload kept by holds %d, %s",
			r.Table, verb, r.Demoted, r.Tier, r.ProtectedByHolds, humantime.Duration(r.Duration)), r.StoppedEarly, r.Err
	})
}

// PrintPartitionResults writes one line per table and returns how many
// failed.
func PrintPartitionResults(w io.Writer, results []partitions.TableResult, dryRun bool) int {
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
