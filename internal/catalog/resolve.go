package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/policy"
)

// ResolveAll resolves every table of p. Tables that do not match the
// catalog are reported together (ErrInvalid, each named with the policy
// file); any other error ends it at once.
func ResolveAll(ctx context.Context, q Querier, p *policy.Policy) ([]*Table, error) {
	var out []*Table
	var errs []error
	for _, pt := range p.Tables {
		t, err := Resolve(ctx, q, pt)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				return nil, err
			}
			all := []error{err}
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				all = j.Unwrap()
			}
			for _, e := range all {
				errs = append(errs, fmt.Errorf("%s: %w", p.Source, e))
			}
			continue
		}
		out = append(out, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// WarnLocalTime warns, once per table and column, when a timestamp without
// time zone column is read as UTC (the policy gives no time_zone) while the
// database's TimeZone is not UTC: an application that writes local time
// would see rows go hours early or late.
func WarnLocalTime(ctx context.Context, q Querier, tables []*Table, log *slog.Logger) {
	// Only a timestamp without time zone column the policy gives no zone
	// can be misread: without one, the TimeZone is not read (a round trip
	// of every command's start).
	type local struct {
		table  string
		column Column
	}
	var read []local
	for _, t := range tables {
		if t.Policy.TimeZone != "" {
			continue
		}
		for _, c := range t.TimeColumns() {
			if c.Zone != "" {
				read = append(read, local{t.Name, c})
			}
		}
	}
	if len(read) == 0 {
		return
	}
	var tz string
	if err := q.QueryRow(ctx, "SELECT current_setting('TimeZone')").Scan(&tz); err != nil {
		log.Warn("inboxkeeper: cannot read the database's TimeZone", "error", err)
		return
	}
	if isUTC(tz) {
		return
	}
	for _, l := range read {
		log.Warn("inboxkeeper: a timestamp without time zone column is read as UTC, but the database's TimeZone is not UTC; if the application writes local time, set time_zone in the policy",
			"table", l.table, "column", l.column.Name, "database_time_zone", tz, "policy_time_zone", "UTC (default)")
	}
}

// isUTC reports whether the zone named tz never differs from UTC.
func isUTC(tz string) bool {
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return false
	}
	now := time.Now()
	for _, t := range []time.Time{now, now.AddDate(0, 6, 0)} {
		if _, off := t.In(loc).Zone(); off != 0 {
			return false
		}
	}
	return true
}
