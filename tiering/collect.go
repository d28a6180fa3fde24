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
	daemonmetrics.TableCollector
	q           Querier
	rows        *daemonmetrics.Fact // inboxkeeper_tier_rows{table, tier}
	bytesPerKey *daemonmetrics.Fact // inboxkeeper_bytes_per_key{table, tier}
}

// NewCollector measures on q into m's tier rows and bytesPerKey.
func NewCollector(q Querier, m *Metrics, bytesPerKey *daemonmetrics.Fact, log *slog.Logger) *Collector {
	return &Collector{TableCollector: daemonmetrics.TableCollector{What: "tiering: measure the tiers", Log: log},
		q: q, rows: m.TierRows, bytesPerKey: bytesPerKey}
}

// Update measures every tiered table of tables that is not partitioned. A
// table that cannot be measured is logged and keeps what it had; the error
// is ctx's.
func (c *Collector) Update(ctx context.Context, tables []*catalog.Table) error {
	return c.Each(ctx, tables, func(t *catalog.Table) error {
		if Of(t) == nil || t.Partitioned() {
			return nil
		}
		st, err := Measure(ctx, c.q, t)
		if err != nil {
			return err
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
		return nil
	})
}
