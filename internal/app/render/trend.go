package render

import (
	"fmt"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
)

// Rates keeps, per table, the due counts status --watch saw over the last
// minute (batchloop.RateWindow), and the one before it, so that a trend
// spans the whole minute however far apart the rounds are.
type Rates map[string][]dueSample

type dueSample struct {
	at  time.Time
	due int64
}

// Add records the due count of table at at.
func (r Rates) Add(table string, at time.Time, due int64) {
	s := append(r[table], dueSample{at, due})
	for len(s) > 2 && at.Sub(s[1].at) >= batchloop.RateWindow {
		s = s[1:]
	}
	r[table] = s
}

// trend says how table's due count moved over the last minute, for status
// --watch; "" until two rounds are there to compare.
func (r Rates) trend(table string, due int64) string {
	s := r[table]
	if len(s) < 2 {
		return ""
	}
	if due == 0 {
		return "none due"
	}
	// A daemon on an INTERVAL lets rows fall due between its passes and
	// clears them in each, in well under a round: the count rises, then
	// drops to little. The net change over a minute of that saw-tooth says
	// nothing (it read "falling by 1/s, gone in about 43m" of a backlog the
	// next pass cleared); what it is made of does.
	var rose, rising float64 // rows and seconds of the rounds that rose
	var cleared *dueSample   // the last round a pass cleared: from its peak to a tenth or less
	var peak int64
	for i := 1; i < len(s); i++ {
		prev, cur := s[i-1], s[i]
		switch {
		case cur.due > prev.due:
			rose += float64(cur.due - prev.due)
			rising += cur.at.Sub(prev.at).Seconds()
		case prev.due > 0 && cur.due*10 <= prev.due:
			c := cur
			cleared, peak = &c, prev.due
		}
	}
	last := s[len(s)-1]
	if cleared != nil && rising > 0 {
		return fmt.Sprintf("cleared by each pass (the last %s ago, from %d to %d); rising by %.0f/s between passes",
			humantime.Duration(last.at.Sub(cleared.at)), peak, cleared.due, rose/rising)
	}
	first := s[0]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 {
		return ""
	}
	return backlogTrend(float64(first.due-last.due)/dt, due)
}
