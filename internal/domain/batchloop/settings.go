package batchloop

import (
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// Settings are the options the row deleter (expiry) and the demoter
// (tiering) share: the service base (logger, clock, throttle, active check,
// dry run, timeouts) and one batch service's sizes, embedded in each one's
// Options. Zero values get the documented defaults (WithDefaults, which
// each service's constructor applies).
type Settings struct {
	service.Base
	BatchSize  int           // rows per batch (the starting size when Sizing is set; per shard on Citus), default config.DefaultBatchSize
	BatchPause time.Duration // sleep between batches
	RunTime    time.Duration // stop a pass after this long; 0 = no limit
	// Sizing, when set, adapts the batch size per table toward a target
	// duration; without it every batch has BatchSize rows.
	Sizing *Sizing
}

// WithDefaults returns s with the environment's defaults for what is unset,
// one set for the deleter and the demoter.
func (s Settings) WithDefaults() Settings {
	s.Base = s.Base.WithDefaults(config.DefaultLockTimeout)
	s.BatchSize = service.Or(s.BatchSize, config.DefaultBatchSize)
	return s
}

// DueCountCap bounds the exact counts of rows due, the deleter's (its
// pass's look, status, inboxkeeper_rows_due) and the demoter's (status):
// past it a count says "more than", so that counting stays cheap on a
// table with a large backlog.
const DueCountCap = 1_000_000
