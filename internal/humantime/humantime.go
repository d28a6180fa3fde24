// Package humantime writes durations for people: the two largest units that
// matter, in days, hours, minutes and seconds ("50d 0h", "2h 5m", "4m 10s",
// "12s"), and milliseconds below a second ("830ms"), never "1199h58m35s".
// Machines get seconds instead (JSON logs, status --json, metrics).
package humantime

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

const day = 24 * time.Hour

// Duration formats d for people. Negative durations get a minus sign.
func Duration(d time.Duration) string {
	if d < 0 {
		return "-" + Duration(-d)
	}
	switch {
	case d >= day:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd %dh", d/day, d%day/time.Hour)
	case d >= time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh %dm", d/time.Hour, d%time.Hour/time.Minute)
	case d >= time.Minute:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm %ds", d/time.Minute, d%time.Minute/time.Second)
	case d >= 10*time.Second:
		return fmt.Sprintf("%ds", d.Round(time.Second)/time.Second)
	case d >= time.Second:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", d.Seconds()), ".0") + "s"
	}
	return fmt.Sprintf("%dms", d.Round(time.Millisecond)/time.Millisecond)
}

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
