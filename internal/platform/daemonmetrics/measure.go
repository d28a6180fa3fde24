package daemonmetrics

import (
	"context"
	"log/slog"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
)

// TableCollector is what every collector of per-table facts does with a
// table it cannot measure: the table keeps what it had, and the failure is
// logged, unless the caller says it itself (Said).
type TableCollector struct {
	What string // the warning a failed measurement logs, with the table
	Log  *slog.Logger
	// Said, when set, takes a failure the caller says itself (the
	// database not answering, said once for the whole daemon) and returns
	// true; the collector then logs nothing of it.
	Said func(error) bool
}

// Each measures every table in turn (measure returns nil for a table it
// passes over). The error is ctx's: a failure on one table does not stop
// the others.
func (c *TableCollector) Each(ctx context.Context, tables []*catalog.Table, measure func(*catalog.Table) error) error {
	for _, t := range tables {
		if err := measure(t); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if c.Said == nil || !c.Said(err) {
				c.Log.Warn(c.What, "table", t.Name, "error", err)
			}
		}
	}
	return ctx.Err()
}
