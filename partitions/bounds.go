package partitions

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// Partition is one partition of a managed parent, read from the catalog.
// Bounds are instants in UTC (a timestamp-without-time-zone column is read
// as UTC); a nil bound is MINVALUE or MAXVALUE.
type Partition struct {
	OID           uint32
	Schema, Name  string
	Lower, Upper  *time.Time
	Bound         string // pg_get_expr(relpartbound), in UTC
	DetachPending bool   // a DETACH ... CONCURRENTLY was interrupted
}

// Ident is the partition's name quoted for SQL text.
func (p Partition) Ident() string {
	return sqlident.QualifiedName{Schema: p.Schema, Name: p.Name}.Sanitize()
}

// String names the partition for people.
func (p Partition) String() string {
	return sqlident.QualifiedName{Schema: p.Schema, Name: p.Name}.String()
}

// contains reports whether instant x falls in [Lower, Upper).
func (p Partition) contains(x time.Time) bool {
	return (p.Lower == nil || !x.Before(*p.Lower)) && (p.Upper == nil || x.Before(*p.Upper))
}

// readPartitions lists the partitions of t, ordered by lower bound, with
// bounds taken from the catalog (pg_get_expr of relpartbound), never from
// names: partitions made by hand are recognised whatever they are called.
func readPartitions(ctx context.Context, db *pgxpool.Pool, t *catalog.Table, s dbconn.TxSettings) ([]Partition, error) {
	var out []Partition
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := s.Apply(ctx, tx); err != nil {
			return err
		}
		// Bounds print in the session's time zone: pin it.
		if _, err := tx.Exec(ctx, "SET LOCAL TimeZone = 'UTC'"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
SELECT c.oid, n.nspname::text, c.relname::text, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.inhparent = $1`, t.OID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var p Partition
			if err := rows.Scan(&p.OID, &p.Schema, &p.Name, &p.Bound, &p.DetachPending); err != nil {
				return err
			}
			if p.Lower, p.Upper, err = parseBound(p.Bound); err != nil {
				return fmt.Errorf("partition %s of %s: %w", p, t.Name, err)
			}
			out = append(out, p)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s: %w", t.Name, err)
	}
	slices.SortFunc(out, func(a, b Partition) int {
		switch {
		case a.Lower == nil && b.Lower == nil:
			return 0
		case a.Lower == nil:
			return -1
		case b.Lower == nil:
			return 1
		}
		return a.Lower.Compare(*b.Lower)
	})
	return out, nil
}

var boundRE = regexp.MustCompile(`^FOR VALUES FROM \((.+)\) TO \((.+)\)$`)

// parseBound reads "FOR VALUES FROM ('…') TO ('…')" as printed with the
// session time zone set to UTC. A DEFAULT partition is an error: the
// catalog check refuses such tables before any pass runs.
func parseBound(expr string) (lower, upper *time.Time, err error) {
	if expr == "DEFAULT" {
		return nil, nil, fmt.Errorf("is the DEFAULT partition, which inboxkeeper does not support (see docs/guides/partitions.md)")
	}
	m := boundRE.FindStringSubmatch(expr)
	if m == nil {
		return nil, nil, fmt.Errorf("cannot read the bound %q: not a range partition", expr)
	}
	if lower, err = parseValue(m[1]); err == nil {
		upper, err = parseValue(m[2])
	}
	if err != nil {
		return nil, nil, fmt.Errorf("cannot read the bound %q: %w", expr, err)
	}
	return lower, upper, nil
}

var layouts = []string{"2006-01-02 15:04:05.999999999-07", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999"}

func parseValue(v string) (*time.Time, error) {
	switch v {
	case "MINVALUE", "MAXVALUE":
		return nil, nil
	}
	if len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
		return nil, fmt.Errorf("unexpected value %s", v)
	}
	s := strings.ReplaceAll(v[1:len(v)-1], "''", "'")
	switch s {
	case "infinity", "-infinity":
		// Nothing lies beyond them that a month could hold.
		return nil, nil
	}
	for _, l := range layouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			t = t.UTC()
			return &t, nil
		}
	}
	return nil, fmt.Errorf("unexpected timestamp %q", s)
}

// monthStart is the first instant of x's calendar month in UTC.
func monthStart(x time.Time) time.Time {
	x = x.UTC()
	return time.Date(x.Year(), x.Month(), 1, 0, 0, 0, 0, time.UTC)
}

func nextMonth(x time.Time) time.Time { return x.AddDate(0, 1, 0) }

// gaps returns the parts of [from, to) no partition covers, in order.
func gaps(parts []Partition, from, to time.Time) [][2]time.Time {
	var out [][2]time.Time
	cur := from
	for cur.Before(to) {
		covered := false
		for _, p := range parts {
			if p.contains(cur) {
				if p.Upper == nil {
					return out
				}
				cur, covered = *p.Upper, true
				break
			}
		}
		if covered {
			continue
		}
		// Uncovered from cur up to the next partition's lower bound.
		end := to
		for _, p := range parts {
			if p.Lower != nil && p.Lower.After(cur) && p.Lower.Before(end) {
				end = *p.Lower
			}
		}
		out = append(out, [2]time.Time{cur, end})
		cur = end
	}
	return out
}

// coveredUntil is the end of the unbroken run of partitions that starts
// at now: rows whose expiry column is before it have somewhere to go. It
// returns now when no partition holds now, and nil when the run reaches
// MAXVALUE.
func coveredUntil(parts []Partition, now time.Time) *time.Time {
	cur := now
	for {
		next := false
		for _, p := range parts {
			if p.DetachPending || !p.contains(cur) {
				continue
			}
			if p.Upper == nil {
				return nil
			}
			cur, next = *p.Upper, true
			break
		}
		if !next {
			return &cur
		}
	}
}

// literal spells an instant as a partition bound for column c.
func literal(c catalog.Column, x time.Time) string {
	s := x.UTC().Format("2006-01-02 15:04:05.999999")
	if c.IsTimestamptz() {
		s += "+00"
	}
	return "'" + s + "'"
}

// CoveredUntil reads t's partitions and returns the end of the unbroken run
// of them that starts at now (now itself when no partition holds now; nil
// when a MAXVALUE partition ends the run).
func CoveredUntil(ctx context.Context, pool *pgxpool.Pool, t *catalog.Table, now time.Time) (*time.Time, error) {
	parts, err := readPartitions(ctx, pool, t, dbconn.TxSettings{})
	if err != nil {
		return nil, err
	}
	return coveredUntil(parts, now), nil
}
