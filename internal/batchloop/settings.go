package batchloop

import (
	"log/slog"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// Settings are the options the row deleter (expiry) and the demoter
// (tiering) share: one batch service's sizes, timeouts and hooks, embedded
// in each one's Options. Zero values get the documented defaults
// (WithDefaults, which each service's constructor applies).
type Settings struct {
	BatchSize        int           // rows per batch (the starting size when Sizing is set; per shard on Citus), default 5000
	BatchPause       time.Duration // sleep between batches
	LockTimeout      time.Duration // per batch transaction, default 500ms
	StatementTimeout time.Duration // per batch statement, default 30s
	IdleTimeout      time.Duration // idle_in_transaction_session_timeout of every transaction, default 10s
	RunTime          time.Duration // stop a pass after this long; 0 = no limit
	MaxRetries       int           // per batch, on lock timeouts and the like; default 5
	DryRun           bool          // count what a pass would change, change nothing
	// Clock pins "now" for tests; nil: the database's clock, read once per
	// batch.
	Clock dbconn.Clock
	// Throttle, when set, is waited on before every batch and watches each
	// batch's backend for sessions waiting on its locks.
	Throttle *throttle.Throttler
	// Active, when set, is asked before every batch; an error stops the
	// pass (this instance lost the lease).
	Active func() error
	// Sizing, when set, adapts the batch size per table toward a target
	// duration; without it every batch has BatchSize rows.
	Sizing *Sizing
	Logger *slog.Logger // nil: discard
}

// WithDefaults returns s with the documented defaults for what is unset.
func (s Settings) WithDefaults() Settings {
	s.BatchSize = Or(s.BatchSize, DefaultBatchSize)
	s.LockTimeout = Or(s.LockTimeout, DefaultLockTimeout)
	s.StatementTimeout = Or(s.StatementTimeout, DefaultStatementTimeout)
	s.MaxRetries = Or(s.MaxRetries, DefaultMaxRetries)
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return s
}
