package tiering

import (
	"context"
	"log/slog"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// Collector measures what a tiered table holds in each tier (Measure): the
// estimated rows per tier and the storage a key costs in each, as facts.
// The daemon updates it after every pass.
type Collector struct {
	q           Querier
	rows        *daemonmetrics.Fact // inboxkeeper_tier_rows{table, tier}
	bytesPerKey *daemonmetrics.Fact // inboxkeeper_bytes_per_key{table, tier}
	log         *slog.Logger
	// Said, when set, takes a failure the caller says itself (the
	// database not answering, said once for the whole daemon) and returns
	// true; the collector then logs nothing of it.
	Said func(error) bool
}

// NewCollector measures on q into m's tier rows and bytesPerKey.
func NewCollector(q Querier, m *Metrics, bytesPerKey *daemonmetrics.Fact, log *slog.Logger) *Collector {
	return &Collector{q: q, rows: m.TierRows, bytesPerKey: bytesPerKey, log: log}
}

// Update measures every tiered table of tables that is not partitioned. A
// table that cannot be measured is logged and keeps what it had; the error
// is ctx's.
func (c *Collector) Update(ctx context.Context, tables []*catalog.Table) error {
	for _, t := range tables {
		if Of(t) == nil || t.Partitioned() {
			continue
		}
		st, err := Measure(ctx, c.q, t)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if c.Said == nil || !c.Said(err) {
				c.log.Warn("tiering: measure the tiers", "table", t.Name, "error", err)
			}
			continue
		}
		for _, tier := range []string{Hot, Warm, Permanent} {
			if v, ok := st.Rows[tier]; ok {
				c.rows.Set(v, t.Name, tier)
			} else {
				c.rows.Delete(t.Name, tier)
			}
			if v, ok := st.BytesPerKey[tier]; ok && v > 0 {
				c.bytesPerKey.Set(v, t.Name, tier)
			} else {
				c.bytesPerKey.Delete(t.Name, tier)
			}
		}
	}
	return ctx.Err()
}
