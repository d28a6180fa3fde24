package throttle

import (
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
)

// INBOXKEEPER_ACTIVE_HOURS: outside the daily window, in ACTIVE_TZ, no batch
// starts. Read from the clock at every check.
const OutsideHours = "outside_active_hours"

func init() {
	register(kind{name: OutsideHours, verdict: (*Throttler).outsideHours})
}

// outsideHours throttles outside the active hours.
func (t *Throttler) outsideHours(now time.Time) (Reading, bool) {
	ok, window := t.inWindow(now)
	return Reading{Kind: OutsideHours, Detail: "active hours " + window}, !ok
}

// inWindow reports whether now is inside the active hours.
func (t *Throttler) inWindow(now time.Time) (bool, string) {
	l := t.limits()
	if l.ActiveHours == "" {
		return true, ""
	}
	from, to, err := config.ParseWindow(l.ActiveHours)
	if err != nil {
		return false, l.ActiveHours + " (invalid)"
	}
	local := now.In(l.ActiveTZ)
	m := local.Hour()*60 + local.Minute()
	label := l.ActiveHours + " " + l.ActiveTZ.String()
	if from <= to {
		return m >= from && m < to, label
	}
	return m >= from || m < to, label // wraps past midnight
}
