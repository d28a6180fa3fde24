package expiry

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// ResultFacts are the facts a deletion pass measured of a table besides
// deleting, which the daemon exports after every pass (Record).
type ResultFacts struct {
	RowsProtected              *daemonmetrics.Fact    // {table, by}
	OldestExpiry, NewestExpiry *daemonmetrics.Fact    // {table}
	BytesPerKey                *daemonmetrics.Fact    // {table, tier}: tier "all"
	PermanentKeys              *prometheus.CounterVec // inboxkeeper_rows_demoted_total{table, tier}; nil: not counted
}

// PermanentTier is the tier label of the permanent keys a deletion wrote
// (tiering.Permanent).
const PermanentTier = "permanent"

// Record exports what a pass measured about one table; a failed table
// keeps what it had.
func (f ResultFacts) Record(r TableResult) {
	if r.Err != nil {
		return
	}
	f.RowsProtected.Set(float64(r.ProtectedByHolds), r.Table, "hold")
	f.RowsProtected.Set(float64(r.ProtectedByReplays), r.Table, "replay")
	f.RowsProtected.Set(float64(r.ProtectedByReferences), r.Table, "reference")
	if r.Oldest != nil {
		f.OldestExpiry.Set(float64(r.Oldest.Unix()), r.Table)
		f.NewestExpiry.Set(float64(r.Newest.Unix()), r.Table)
	} else {
		f.OldestExpiry.Delete(r.Table)
		f.NewestExpiry.Delete(r.Table)
	}
	if r.BytesPerKey > 0 {
		f.BytesPerKey.Set(r.BytesPerKey, r.Table, "all")
	} else {
		f.BytesPerKey.Delete(r.Table, "all") // unknown before the first ANALYZE
	}
	if f.PermanentKeys != nil && r.PermanentKeys > 0 {
		f.PermanentKeys.WithLabelValues(r.Table, PermanentTier).Add(float64(r.PermanentKeys))
	}
}

// RetainedFacts are what a table remembers, as facts: the horizons of the
// retention rules installed for it, the first receipt of the oldest and
// newest identity it retains, the same per scope with a rule, and the
// replays forced past the window.
type RetainedFacts struct {
	ReplayHorizon, PostReceipt, Margin *daemonmetrics.Fact // {table, scope}
	FirstSeen                          *daemonmetrics.Fact // {table, end}
	ScopeExpiry, ScopeFirstSeen        *daemonmetrics.Fact // {table, scope, end}
	ReplaysBeyond                      *daemonmetrics.Fact // {table}
}

// Retained measures RetainedFacts for the tables in force. Ranges are read
// only where an index makes them cheap; which indexes exist is looked up
// once per table resolved.
type Retained struct {
	q     Querier
	facts RetainedFacts
	log   *slog.Logger

	scopeIdx map[*catalog.Table]*ScopeIndexes
	seenIdx  map[*catalog.Table]bool // an index leads with first_seen
	hinted   map[string]string       // table → the indexes the log last asked for
}

// NewRetained measures on q into facts.
func NewRetained(q Querier, facts RetainedFacts, log *slog.Logger) *Retained {
	return &Retained{q: q, facts: facts, log: log, scopeIdx: map[*catalog.Table]*ScopeIndexes{}, seenIdx: map[*catalog.Table]bool{},
		hinted: map[string]string{}}
}

// Querier reads rows too: the installed rules and the replays.
type Querier interface {
	catalog.Querier
	holds.Querier
}

// Update measures every fact of tables. Only the tables the policy names
// count, as every per-table fact: rules installed for a table this
// instance does not manage are not its own.
func (c *Retained) Update(ctx context.Context, tables []*catalog.Table) error {
	inForce := map[string]*catalog.Table{}
	for _, t := range tables {
		inForce[t.Name] = t
	}
	installed, err := inbox.InstalledRules(ctx, c.q)
	if err != nil {
		return err
	}
	type rule struct {
		inbox.InstalledRule
		table string
	}
	var rules []rule
	for _, r := range installed {
		name := sqlident.QualifiedName{Schema: r.Schema, Name: r.Table}.String()
		if inForce[name] != nil {
			rules = append(rules, rule{r, name})
		}
	}
	c.facts.ReplayHorizon.Reset()
	c.facts.PostReceipt.Reset()
	c.facts.Margin.Reset()
	for _, r := range rules {
		if r.HasPostReceipt {
			c.facts.PostReceipt.Set(r.PostReceipt.Seconds(), r.table, r.Scope)
		}
		if r.HasReplay {
			c.facts.ReplayHorizon.Set(r.Replay.Seconds(), r.table, r.Scope)
		}
		c.facts.Margin.Set(r.Margin.Seconds(), r.table, r.Scope)
	}
	if err := c.firstSeen(ctx, tables); err != nil {
		return err
	}
	c.facts.ScopeExpiry.Reset()
	c.facts.ScopeFirstSeen.Reset()
	for _, r := range rules {
		if err := c.scope(ctx, inForce[r.table], r.Scope); err != nil {
			if ctx.Err() != nil {
				return err
			}
			c.log.Warn("inboxkeeper: per-scope retained range", "table", r.table, "scope", r.Scope, "error", err)
		}
	}
	beyond, err := holds.ReplaysBeyondWindow(ctx, c.q)
	if err != nil {
		return err
	}
	c.facts.ReplaysBeyond.Reset()
	for table, n := range beyond {
		if inForce[table] != nil {
			c.facts.ReplaysBeyond.Set(float64(n), table)
		}
	}
	return nil
}

// firstSeen exports, per table whose first_seen column leads an index, the
// first receipt of the oldest and newest identity retained.
func (c *Retained) firstSeen(ctx context.Context, tables []*catalog.Table) error {
	for _, t := range tables {
		if _, known := c.seenIdx[t]; !known {
			indexed, err := FirstSeenIndexed(ctx, c.q, t)
			if err != nil {
				return err
			}
			c.seenIdx[t] = indexed
		}
	}
	c.facts.FirstSeen.Reset()
	for _, t := range tables {
		if !c.seenIdx[t] {
			continue
		}
		oldest, newest, err := FirstSeenRange(ctx, c.q, t)
		if err != nil {
			return err
		}
		if oldest != nil {
			c.facts.FirstSeen.Set(float64(oldest.Unix()), t.Name, "oldest")
			c.facts.FirstSeen.Set(float64(newest.Unix()), t.Name, "newest")
		}
	}
	return nil
}

// hint says, once per table and process (not again on a reload that
// changes nothing), which index the per-scope ranges of t want and do not
// have, as the statement that creates it. They are left out without it:
// four index probes per scope with it, a scan of the scope without.
func (c *Retained) hint(t *catalog.Table, si ScopeIndexes) {
	var want []string
	if !si.Expiry {
		want = append(want, fmt.Sprintf("CREATE INDEX CONCURRENTLY ON %s (%s, %s);", t.Name, sqlident.QuoteIfNeeded(t.Scope.Name), sqlident.QuoteIfNeeded(t.Expiry.Name)))
	}
	if t.FirstSeen != nil && !si.FirstSeen {
		want = append(want, fmt.Sprintf("CREATE INDEX CONCURRENTLY ON %s (%s, %s);", t.Name, sqlident.QuoteIfNeeded(t.Scope.Name), sqlident.QuoteIfNeeded(t.FirstSeen.Name)))
	}
	stmt := strings.Join(want, " ")
	if stmt == c.hinted[t.Name] {
		return
	}
	c.hinted[t.Name] = stmt
	if stmt != "" {
		c.log.Info("inboxkeeper: per-scope retained ranges (inboxkeeper_scope_*) are left out where an index would make them cheap; to export them, create it",
			"table", t.Name, "index", stmt)
	}
}

// scope exports the retained range of one scope that has a retention
// rule: bounded label values, and four index probes per scope.
func (c *Retained) scope(ctx context.Context, t *catalog.Table, scope string) error {
	if t.Scope == nil {
		return nil
	}
	si := c.scopeIdx[t]
	if si == nil {
		found, err := FindScopeIndexes(ctx, c.q, t)
		if err != nil {
			return err
		}
		si = &found
		c.scopeIdx[t] = si
		c.hint(t, *si)
	}
	r, err := ScopeRanges(ctx, c.q, t, *si, scope)
	if err != nil {
		return err
	}
	set := func(g *daemonmetrics.Fact, end string, v *time.Time) {
		if v != nil {
			g.Set(float64(v.Unix()), t.Name, scope, end)
		}
	}
	set(c.facts.ScopeExpiry, "oldest", r.OldestExpiry)
	set(c.facts.ScopeExpiry, "newest", r.NewestExpiry)
	set(c.facts.ScopeFirstSeen, "oldest", r.OldestFirstSeen)
	set(c.facts.ScopeFirstSeen, "newest", r.NewestFirstSeen)
	return nil
}
