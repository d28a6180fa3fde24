package pass

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// WaitForSetup runs setup until it succeeds, for a daemon: a database that
// is not up yet, a control schema a migrate job has not created yet, tables
// the application's migration has not created yet or a permanent key table
// not created yet are waited for with backoff (1 s doubling to 30 s)
// instead of crash-looping (a crash-looping native sidecar would take its
// database pod out of service). Errors for which fatal is true end it at
// once. mismatch is 1 while the policy does not match the database. It
// returns ctx's error when ctx ended first.
func WaitForSetup(ctx context.Context, log *slog.Logger, mismatch prometheus.Gauge, fatal func(error) bool, setup func() error) error {
	// One line per change of cause, not one per try: a wrong password or a
	// policy that names a missing table waits for someone to fix it, and a
	// line every 30 s says nothing new. The retries are at DEBUG.
	last := ""
	err := retry.Do(ctx, retry.Policy{MaxRetries: -1, Base: time.Second, Max: 30 * time.Second,
		Retry: func(err error, _ retry.Kind) bool { return errors.Is(err, tiering.ErrKeyTable) || !fatal(err) },
		OnRetry: func(_ retry.Kind, _ int, wait time.Duration, err error) {
			level, msg, attrs := setupWait(err)
			if errors.Is(err, tiering.ErrKeyTable) || errors.Is(err, catalog.ErrInvalid) {
				mismatch.Set(1)
			}
			cause := msg + "\x00" + err.Error()
			var ce *dbconn.ConnectError
			if errors.As(err, &ce) {
				cause = msg + "\x00" + string(ce.Cause) + "\x00" + ce.Detail
			}
			if cause == last {
				log.Debug(msg, append(attrs, "error", err, "retry_in", wait)...)
				return
			}
			last = cause
			if level != slog.LevelError {
				attrs = append(attrs, "retry_in", wait)
			}
			log.Log(ctx, level, msg, append(attrs, "error", err)...)
		}}, func(int) error { return setup() })
	if err == nil {
		mismatch.Set(0)
	} else if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// setupWait is the log line for a setup that is not there yet.
func setupWait(err error) (slog.Level, string, []any) {
	var ce *dbconn.ConnectError
	switch {
	case errors.As(err, &ce) && ce.Config():
		return slog.LevelError, "inboxkeeper: cannot connect; trying again with backoff until the configuration or the database changes", []any{"cause", string(ce.Cause)}
	case errors.As(err, &ce):
		return slog.LevelWarn, "inboxkeeper: waiting for the database", []any{"cause", string(ce.Cause)}
	case errors.Is(err, tiering.ErrKeyTable):
		return slog.LevelError, "inboxkeeper: waiting for a permanent key table; nothing is touched until it exists", nil
	case errors.Is(err, catalog.ErrInvalid):
		return slog.LevelError, "inboxkeeper: the policy does not match the database; nothing is touched until it does", nil
	case errors.Is(err, migrations.ErrNotMigrated):
		return slog.LevelWarn, "inboxkeeper: waiting for the control schema", nil
	}
	return slog.LevelWarn, "inboxkeeper: waiting for the database", nil
}

// NewThrottle builds the throttle for env with the global runtime settings
// in force (max_replica_lag, active_hours...) when they can be read, and
// says so when they do not hold together.
func NewThrottle(ctx context.Context, pool *pgxpool.Pool, env config.Config, log *slog.Logger, m *throttle.Metrics) *throttle.Throttler {
	c, err := settings.InForce(ctx, pool, env)
	if err != nil {
		log.Error("inboxkeeper: the global runtime settings cannot be applied; the environment's values stay", "error", err)
	}
	return throttle.New(pool, c, service.Base{Logger: log}, m)
}
