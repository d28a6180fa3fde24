// Package render writes what the commands print, from values computed
// elsewhere: a pass's results line by line (and the progress of a long
// one, as a bar on a terminal or a log line), status in text and JSON,
// holds, replays and settings. Nothing here reads the database or decides
// anything. Daemon internals.
package render

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
)

// PrintLines writes one line per item as describe gives it, or the line
// none when there is no item.
func PrintLines[T any](w io.Writer, items []T, none string, describe func(T) string) {
	if len(items) == 0 {
		fmt.Fprintln(w, none)
	}
	for _, it := range items {
		fmt.Fprintln(w, describe(it))
	}
}

// DescribeHold is a hold in one line (hold list, status).
func DescribeHold(h holds.Hold) string {
	var b strings.Builder
	fmt.Fprintf(&b, "hold %d on %s", h.ID, h.Table)
	if h.Scope != nil {
		fmt.Fprintf(&b, " scope=%q", *h.Scope)
	}
	if h.From != nil {
		fmt.Fprintf(&b, " events [%s, %s)", h.From.UTC().Format(time.RFC3339), h.To.UTC().Format(time.RFC3339))
	}
	if h.Blocks == holds.BlocksDelete {
		b.WriteString(" blocks=delete") // deletion only: the payload may be demoted
	}
	fmt.Fprintf(&b, " owner=%q reason=%q since %s", h.Owner, h.Reason, h.CreatedAt.UTC().Format(time.RFC3339))
	if h.ExpiresAt != nil {
		fmt.Fprintf(&b, " expires %s", h.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if h.ReleasedAt != nil {
		fmt.Fprintf(&b, " released %s", h.ReleasedAt.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// DescribeReplay is a replay marker in one line (replay list, status).
func DescribeReplay(r holds.Replay) string {
	s := fmt.Sprintf("replay %d on %s scope=%q events [%s, %s) owner=%q since %s", r.ID, r.Table, r.Scope,
		r.From.UTC().Format(time.RFC3339), r.To.UTC().Format(time.RFC3339), r.Owner, r.StartedAt.UTC().Format(time.RFC3339))
	if r.BeyondWindow {
		s += " BEYOND THE DEDUP WINDOW (forced)"
	}
	if r.FinishedAt != nil {
		s += " finished " + r.FinishedAt.UTC().Format(time.RFC3339)
	}
	return s
}

// DescribeChange is a change of a runtime setting in one line (set,
// settings --history).
func DescribeChange(c settings.Change) string {
	val := func(v *string) string {
		if v == nil {
			return "(not set)"
		}
		return *v
	}
	return fmt.Sprintf("%s %s %s: %s -> %s by %s: %s", c.ChangedAt.UTC().Format(time.RFC3339), settings.ScopeName(c.Table), c.Key,
		val(c.Old), val(c.New), c.ChangedBy, c.Reason)
}

// WriteScopes writes every tunable in force, by scope (`inboxkeeper
// settings`), after whose environment they are read on.
func WriteScopes(w io.Writer, env settings.Env, scopes []settings.Scope) {
	WriteEnvironment(w, env)
	for _, s := range scopes {
		fmt.Fprintln(w, s.Table)
		if s.Error != "" {
			fmt.Fprintf(w, "  ERROR: %s\n", s.Error)
		}
		writeValues(w, s.Settings, "  ")
	}
}

func writeValues(w io.Writer, vals []settings.Value, indent string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range vals {
		fmt.Fprintf(tw, "%s%s\t%s\t(%s)\n", indent, v.Key, v.Value, origin(v))
	}
	tw.Flush()
}

// origin says where a value in force comes from: its source, and when a
// higher layer's value bounded it, what its source gave and what bounded
// it ("environment 500, bounded by batch_size_max from table setting").
// A value of the shell's environment or its default, where no active
// instance published its own, says so: it is not the daemon's.
func origin(v settings.Value) string {
	o := v.Source
	if v.BoundBy != "" {
		o = fmt.Sprintf("%s %s, bounded by %s from %s", v.Source, v.Given, v.BoundBy, v.BoundBySource)
	}
	if shellValue(v) {
		o += ", this shell"
	}
	return o
}

// shellValue: v is the shell's environment's or its default, not an
// active instance's.
func shellValue(v settings.Value) bool {
	return v.Shell && (v.Source == settings.SourceEnvironment || v.Source == settings.SourceDefault)
}

// WriteEnvironment says whose environment the values from the environment
// and the defaults are, and what of it this shell cannot know.
func WriteEnvironment(w io.Writer, env settings.Env) {
	if env.Instance == "" {
		fmt.Fprintf(w, "environment: this shell's, since %s: a value marked \"this shell\" is what a command run here would use, not what a daemon runs with\n", env.Why)
		return
	}
	fmt.Fprintf(w, "environment: the active instance's (%s), as it publishes it with its lease\n", env.Instance)
	if len(env.Unknown) > 0 {
		fmt.Fprintf(w, "  not known here: %s (the instance's connection strings are published without their passwords; set the same ones in this shell to measure them)\n",
			strings.Join(env.Unknown, ", "))
	}
}
