package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// throttleConfig is the throttle's configuration: the environment, with the
// global runtime settings (max_replica_lag, active_hours...) applied when
// they can be read.
func (a *app) throttleConfig(ctx context.Context, pool *pgxpool.Pool) config.Config {
	c := a.cfg
	if pool != nil {
		if stored, err := settings.Load(ctx, pool); err == nil {
			if g, _, err := settings.Resolve(a.cfg, nil, stored, settings.Global); err == nil {
				c = g
			} else {
				a.log.Error("inboxkeeper: the global runtime settings cannot be applied; the environment's values stay", "error", err)
			}
		}
	}
	return c
}

// startThrottle starts the collectors; the caller stops them. A
// THROTTLE_QUERY that fails is a configuration error.
func (a *app) startThrottle(ctx context.Context, pool *pgxpool.Pool, reg prometheus.Registerer) (*throttle.Throttler, error) {
	if a.cfg.ThrottleQuery != "" {
		if err := throttle.CheckQuery(ctx, pool, a.cfg.ThrottleQuery); err != nil && ctx.Err() == nil {
			return nil, configError{err}
		}
	}
	var m *throttle.Metrics
	if reg != nil {
		m = throttle.NewMetrics(reg)
	}
	t := throttle.New(pool, a.throttleConfig(ctx, pool), service.Base{Logger: a.log}, m)
	t.Start(ctx)
	return t, nil
}

func sizing(c config.Config) *expiry.Sizing {
	return &expiry.Sizing{Min: c.BatchSizeMin, Max: c.BatchSizeMax, Target: c.BatchTarget}
}

func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func (a *app) pause(ctx context.Context, args []string) error {
	fs := a.newFlags("pause")
	reason := fs.String("reason", "", "why cleanup must wait (required)")
	forDur := fs.Duration("for", 0, "end the pause by itself after this long (Go duration); 0 = until resume")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("pause: unexpected argument %q", fs.Arg(0))
	}
	if *reason == "" {
		return usagef("pause: --reason is required")
	}
	if *forDur < 0 {
		return usagef("pause: --for must not be negative")
	}
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	p, err := throttle.SetPause(ctx, pool, *reason, whoami(), *forDur)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "every instance on this database is %s\n", p)
	return nil
}

func (a *app) resume(ctx context.Context, args []string) error {
	if err := a.noArgs("resume", args); err != nil {
		return err
	}
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	was, err := throttle.ClearPause(ctx, pool)
	if err != nil {
		return err
	}
	if !was {
		fmt.Fprintln(a.stdout, "no pause was in force")
		return nil
	}
	fmt.Fprintln(a.stdout, "resumed: every instance may delete again")
	return nil
}

// writeThrottle prints the throttle's verdict and every signal against its
// threshold, from one fresh measurement.
func writeThrottle(w io.Writer, t *throttle.Throttler) {
	s := t.Check()
	if s.Throttled {
		fmt.Fprintf(w, "throttle: PAUSED (%s): %s\n", s.Kind, s.Reason)
	} else {
		fmt.Fprintln(w, "throttle: running (no signal over its threshold)")
	}
	for _, r := range t.Readings() {
		mark := "ok  "
		if r.Over {
			mark = "OVER"
		}
		fmt.Fprintf(w, "  %s %s\n", mark, r)
	}
	for _, p := range t.Paces() {
		fmt.Fprintf(w, "  pace %s\n", p)
	}
}
