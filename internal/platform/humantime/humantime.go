// Package humantime is the one duration grammar of inboxkeeper: one parser
// (Parse) and one printer (Format) for every duration anywhere, the
// environment, the policy file and its tuning blocks, `set`, every flag and
// every output. The grammar is Go's (500ms, 1.5s, 2h45m) plus a "d" unit of
// exactly 24 hours (90d, 1d12h, 1.5d); "0" alone is zero.
//
// People get a duration rounded to its two largest units (Duration: "50d",
// "2h5m", "4m10s", "12s", "830ms"), printed in the same grammar, so whatever
// inboxkeeper prints can be given back to it. Machines get seconds as
// numbers instead (JSON logs, every --json output, metrics).
package humantime

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
)

// Day is the "d" unit: exactly 24 hours (calendar days and DST do not
// matter to expiry).
const Day = 24 * time.Hour

// Example is what an error message offers as the grammar's examples.
const Example = "like 500ms, 30s, 36h, 90d or 1d12h"

// Parse reads a duration: Go's syntax plus "d" for 24 hours. Each part may
// have a fraction (1.5d, 0.5h); a sign may lead.
func Parse(s string) (time.Duration, error) {
	bad := fmt.Errorf("%q is not a duration (%s)", s, Example)
	rest := strings.TrimSpace(s)
	neg := strings.HasPrefix(rest, "-")
	if neg || strings.HasPrefix(rest, "+") {
		rest = rest[1:]
	}
	if rest == "0" {
		return 0, nil
	}
	if rest == "" {
		return 0, bad
	}
	var total time.Duration
	for rest != "" {
		// Each number and unit goes through time.ParseDuration on its own,
		// so that "d" can be read as 24 hours.
		i := strings.IndexFunc(rest, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		if i <= 0 {
			return 0, bad
		}
		j := strings.IndexAny(rest[i:], "0123456789.")
		if j < 0 {
			j = len(rest) - i
		}
		num, unit := rest[:i], rest[i:i+j]
		rest = rest[i+j:]
		mult := time.Duration(1)
		if unit == "d" {
			unit, mult = "h", 24
		}
		v, err := time.ParseDuration(num + unit)
		if err != nil || v > (math.MaxInt64-total)/mult {
			return 0, bad
		}
		total += v * mult
	}
	if neg {
		total = -total
	}
	return total, nil
}

// Format prints d exactly, in the grammar Parse reads: whole days as d,
// then Go's units without trailing zero ones: 90d, 1d12h, 1h30m, 1m30s,
// 1.5s, 200ms, 250us, 0s.
func Format(d time.Duration) string {
	if d < 0 {
		if d == math.MinInt64 {
			return d.String()
		}
		return "-" + Format(-d)
	}
	if d == 0 {
		return "0s"
	}
	var b strings.Builder
	if days := d / Day; days > 0 {
		b.WriteString(strconv.FormatInt(int64(days), 10) + "d")
		d %= Day
		if d == 0 {
			return b.String()
		}
	}
	// 12h0m0s, 1h30m0s, 1m0s, 1.5s, 200ms; us, not µs, which no keyboard has.
	s := strings.Replace(d.String(), "µs", "us", 1)
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	b.WriteString(s)
	return b.String()
}

// Round rounds d to its two largest units (days and hours, hours and
// minutes, minutes and seconds), to tenths of a second between 1 and 10
// seconds, and to milliseconds below.
func Round(d time.Duration) time.Duration {
	if d < 0 {
		return -Round(-d)
	}
	switch {
	case d >= Day:
		return d.Round(time.Hour)
	case d >= time.Hour:
		return d.Round(time.Minute)
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// Duration prints d for people: rounded (Round), in the one grammar
// (Format): "50d", "50d14h", "2h5m", "4m10s", "12s", "1.5s", "830ms".
func Duration(d time.Duration) string { return Format(Round(d)) }

// ForText is a slog ReplaceAttr for the text handler: durations as people
// read them.
func ForText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, Duration(a.Value.Duration()))
	}
	return a
}

// ForJSON is a slog ReplaceAttr for the JSON handler: durations as seconds,
// numbers under a key ending in _seconds.
func ForJSON(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		key := a.Key
		if !strings.HasSuffix(key, "_seconds") {
			key += "_seconds"
		}
		return slog.Float64(key, a.Value.Duration().Seconds())
	}
	return a
}
