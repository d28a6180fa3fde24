package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
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
// would see rows go hours early or late. And, whatever the database's zone,
// when such a column's newest rows lie in the future (WarnFutureRows).
func WarnLocalTime(ctx context.Context, q Querier, tables []*Table, log *slog.Logger) {
	WarnFutureRows(ctx, q, tables, log)
	warnZone(ctx, q, tables, log)
}

func warnZone(ctx context.Context, q Querier, tables []*Table, log *slog.Logger) {
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

// LocalClockSlack is how far in the future a table's newest row may lie
// before WarnFutureRows says so: more than a clock's drift or a
// transaction's length, less than any zone's offset.
const LocalClockSlack = 5 * time.Minute

// WarnFutureRows warns when the newest value of a timestamp-without-time-
// zone column that records when something happened (the expires_after
// column, event_time, first_seen, a section's (the tiers anchor); an expires_at column
// lies in the future by design) is more than LocalClockSlack after now,
// read in the table's zone: the application writes its host's wall clock,
// east of that zone, and rows would go early by as much. A column an index
// leads with is read exactly (one index probe); another through a sample
// of the heap of about 200 pages. One read per column, at startup.
func WarnFutureRows(ctx context.Context, q Querier, tables []*Table, log *slog.Logger) {
	for _, t := range tables {
		for _, c := range eventColumns(t) {
			ahead, ok, err := newestAhead(ctx, q, t, c)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("inboxkeeper: cannot read the newest rows of a time column", "table", t.Name, "column", c.Name, "error", err)
				}
				continue
			}
			if ok && ahead > LocalClockSlack {
				log.Warn("inboxkeeper: the newest rows of a timestamp without time zone column lie in the future: the application writes its host's local time, and rows would go that much early; set time_zone in the policy to the host's zone",
					"table", t.Name, "column", c.Name, "ahead", ahead.Round(time.Minute), "policy_time_zone", t.Policy.Zone())
			}
		}
	}
}

// eventColumns are t's timestamp-without-time-zone columns that record
// when something happened, each once.
func eventColumns(t *Table) []Column {
	var cs []Column
	add := func(c *Column) {
		if c != nil && c.Zone != "" && !slices.ContainsFunc(cs, func(d Column) bool { return d.Name == c.Name }) {
			cs = append(cs, *c)
		}
	}
	if t.Policy.ExpiresAfter != nil {
		add(&t.Expiry)
	}
	add(t.EventTime)
	add(t.FirstSeen)
	for _, c := range t.sectionTimeColumns() {
		add(&c)
	}
	return cs
}

// newestAhead is how far the newest value of c lies after now; ok is false
// when the column holds none.
func newestAhead(ctx context.Context, q Querier, t *Table, c Column) (time.Duration, bool, error) {
	indexed, err := IndexLeads(ctx, q, t, c)
	if err != nil {
		return 0, false, err
	}
	var sql string
	if indexed {
		sql = fmt.Sprintf(`SELECT extract(epoch FROM (SELECT %s FROM %s t WHERE t.%s IS NOT NULL ORDER BY t.%s DESC LIMIT 1) - now())::float8`,
			c.AsTimestamptz("t"), t.Ident, c.Quoted, c.Quoted)
	} else {
		var pages float64
		if err := q.QueryRow(ctx, `SELECT greatest(relpages, 1) FROM pg_class WHERE oid = $1`, t.OID).Scan(&pages); err != nil {
			return 0, false, err
		}
		sql = fmt.Sprintf(`SELECT extract(epoch FROM max(%s) - now())::float8 FROM %s t TABLESAMPLE SYSTEM (%g)`,
			c.AsTimestamptz("t"), t.Ident, min(100, 200*100/pages))
	}
	var secs *float64
	if err := q.QueryRow(ctx, sql).Scan(&secs); err != nil || secs == nil {
		return 0, false, err
	}
	return time.Duration(*secs * float64(time.Second)), true, nil
}
