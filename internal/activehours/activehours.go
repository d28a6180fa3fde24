// Package activehours reads INBOXKEEPER_ACTIVE_HOURS: a daily window
// "HH:MM-HH:MM" outside which no batch starts, which may wrap past midnight
// (22:00-06:00). The configuration checks it; the throttle applies it.
package activehours

import (
	"fmt"
	"strings"
	"time"
)

// Parse reads "HH:MM-HH:MM" into minutes after midnight.
func Parse(s string) (from, to int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("%q: want HH:MM-HH:MM", s)
	}
	if from, err = parseClock(a); err != nil {
		return 0, 0, fmt.Errorf("%q: %w", s, err)
	}
	if to, err = parseClock(b); err != nil {
		return 0, 0, fmt.Errorf("%q: %w", s, err)
	}
	if from == to {
		return 0, 0, fmt.Errorf("%q: empty window (leave it empty for always)", s)
	}
	return from, to, nil
}

func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}
