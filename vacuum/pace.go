package vacuum

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// A VACUUM writes WAL too: pruning and vacuum records for every heap page
// it cleans, and a full-page image of every index page it first changes
// after a checkpoint (after deleting half of a 1M-row inbox, 37 MB). It is
// one statement, so the WAL window cannot split it into batches; it is
// paced instead by the cost-based delay of its own session: it sleeps
// vacuum_cost_delay each time its pages have cost vacuum_cost_limit. The
// limit per delay is set so that its WAL comes at paceShare of what the
// tightest standby applies (service.WriterPace), at walPerUnit bytes of WAL
// per cost unit until a paced VACUUM of the table was measured. The settings
// are fixed once the VACUUM starts; what keeps the line when they are
// wrong is the throttle's Overrun, which stops the VACUUM when the standby
// falls behind anyway (vacuum.go), and the next attempt goes at half the
// pace. docs/design/throttle-pacing.md has the figures.
const (
	// The page costs a paced VACUUM's session sets, whatever the server's:
	// PostgreSQL's defaults from version 14 on.
	costPageHit   = 1
	costPageMiss  = 2
	costPageDirty = 20
	// walPerUnit is the WAL a cost unit is taken to write before a paced
	// VACUUM of the table was measured. Measured with the costs above
	// (PostgreSQL 15, VACUUM VERBOSE's buffer and WAL usage): 182 B a unit
	// after deleting half of a 1M-row inbox, 227 with narrow rows, 281
	// after deleting a tenth (the index pages' full-page images are then
	// most of it), 53 to 110 when a checkpoint fell between the deletions
	// and the VACUUM (the heap pages it dirties then write images of pages
	// it has just emptied). 240 sits between the first three: at a
	// paceShare of 0.8 they write at 0.61 to 0.94 of the standby's apply
	// rate, and the last ones slower. A table that writes more per unit than this overshoots the
	// pace until Overrun stops it; the next attempt goes at half the pace.
	walPerUnit = 240
	// minWALPerUnit bounds what is learned from a VACUUM that wrote
	// little: a learned figure paces the next VACUUM faster.
	minWALPerUnit = 32
	// maxWALPerUnit: a page's full image per cost unit, the most one
	// unit can write (a page dirty already, which costs a hit, and
	// changed after a checkpoint began).
	maxWALPerUnit = 8192
	// paceShare is the share of the standby's rate the VACUUM may write:
	// the queue it starts with (up to half a window) and the application's
	// own WAL take the rest.
	paceShare = 0.8
	// costDelay is the paced VACUUM's vacuum_cost_delay: a sleep often
	// enough that it writes evenly. A limit that would be under one
	// dirtied page's cost stretches it, up to PostgreSQL's maximum.
	costDelay    = 10 * time.Millisecond
	maxCostDelay = 100 * time.Millisecond
	maxCostLimit = 10000
	minCostLimit = costPageDirty + costPageMiss
	// MaxBoost multiplies a standby's rate while it is not measured: then
	// it is only a lower bound (what the standby replayed lately, at the
	// speed the daemon fed it, or the window's floor), and a VACUUM
	// paced by it alone can take many times longer than the standby
	// needs. Overrun stops one that was too fast before its queue is over
	// two windows (which, counted at the lower bound, are at most 0.8 x
	// MAX_REPLICA_LAG of the true rate); the standby was busy meanwhile,
	// which measures its rate, and each new attempt halves the boost.
	MaxBoost = 4
)

// Pace is how a VACUUM is paced for a standby: its session's cost settings.
type Pace struct {
	Standby     string
	StandbyRate float64 // WAL bytes a second the standby applies (service.WriterPace.Rate)
	Rate        float64 // WAL bytes a second the VACUUM may write: paceShare of it
	PerUnit     float64 // WAL a cost unit is taken to write
	Learned     bool    // PerUnit was measured on a paced VACUUM of the table
	Boost       float64 // what StandbyRate is multiplied by (1 when measured; MaxBoost)
	Delay       time.Duration
	Limit       int
}

// PaceFor is the pace of a VACUUM for wp at perUnit bytes of WAL a cost
// unit (0: walPerUnit), with the standby's rate multiplied by boost while
// it is not measured (MaxBoost, halved after each stop). ok is false when
// the standby applies too little for even the slowest pace PostgreSQL
// allows (one dirtied page's cost every 100 ms).
func PaceFor(wp service.WriterPace, perUnit, boost float64) (p Pace, ok bool) {
	learned := perUnit > 0
	if !learned {
		perUnit = walPerUnit
	}
	if wp.Measured || boost < 1 {
		boost = 1
	}
	p = Pace{Standby: wp.Standby, StandbyRate: wp.Rate, Rate: paceShare * boost * wp.Rate, PerUnit: perUnit, Learned: learned, Boost: boost}
	units := p.Rate / perUnit // cost units a second
	p.Delay = costDelay
	limit := units * p.Delay.Seconds()
	switch {
	case limit > maxCostLimit:
		// A fast standby: shorter sleeps, down to what a sleep can be.
		p.Delay = max(time.Duration(maxCostLimit/units*float64(time.Second)).Round(10*time.Microsecond), 10*time.Microsecond)
		limit = maxCostLimit
	case limit < minCostLimit:
		p.Delay = min(time.Duration(minCostLimit/units*float64(time.Second)).Round(100*time.Microsecond), maxCostDelay)
		limit = units * p.Delay.Seconds()
	}
	p.Limit = int(math.Floor(limit))
	if p.Limit < 1 {
		return p, false
	}
	return p, true
}

// Plan is how the daemon's VACUUM goes for wp: unpaced (nil, "") where no
// standby streams; paced (PaceFor); or passed over for the standby, and
// why: behind a connection pooler (pooled), where its session's settings
// may reach another server connection than the VACUUM, or for a standby
// too slow for any pace.
func Plan(wp service.WriterPace, pooled bool, perUnit, boost float64) (*Pace, string) {
	if !wp.Paced() {
		return nil, ""
	}
	if pooled {
		return nil, "passed over for the standby: behind a connection pooler its session's vacuum_cost_delay cannot be set, and unpaced it writes its WAL at full speed; autovacuum keeps the table"
	}
	p, ok := PaceFor(wp, perUnit, boost)
	if !ok {
		return nil, fmt.Sprintf("passed over for the standby: standby %s applies %s/s, too little for the slowest pace a VACUUM can be set to; autovacuum keeps the table",
			wp.Standby, throttle.FormatBytes(wp.Rate))
	}
	return &p, ""
}

// UnitsPerSecond is the cost a VACUUM at p may spend a second.
func (p Pace) UnitsPerSecond() float64 { return float64(p.Limit) / p.Delay.Seconds() }

// settings are the session settings of a VACUUM at p, as set_config takes
// them.
func (p Pace) settings() [][2]string {
	return [][2]string{
		{"vacuum_cost_delay", strconv.FormatFloat(float64(p.Delay.Microseconds())/1000, 'f', -1, 64) + "ms"},
		{"vacuum_cost_limit", strconv.Itoa(p.Limit)},
		{"vacuum_cost_page_hit", strconv.Itoa(costPageHit)},
		{"vacuum_cost_page_miss", strconv.Itoa(costPageMiss)},
		{"vacuum_cost_page_dirty", strconv.Itoa(costPageDirty)},
	}
}

// String says how a VACUUM at p is paced, for logs and status.
func (p Pace) String() string {
	applies := fmt.Sprintf("which applies %s/s", throttle.FormatBytes(p.StandbyRate))
	if p.Boost > 1 {
		applies = fmt.Sprintf("which applied at least %s/s lately (not measured: %g x that, stopped if it falls behind)", throttle.FormatBytes(p.StandbyRate), p.Boost)
	}
	return fmt.Sprintf("at most %s/s of WAL for standby %s, %s (vacuum_cost_delay %s, vacuum_cost_limit %d)",
		throttle.FormatBytes(p.Rate), p.Standby, applies, humantime.Format(p.Delay), p.Limit)
}

// learn is the WAL a cost unit wrote in a VACUUM at p that wrote wal
// bytes in took: what it wrote per unit of its budget (a VACUUM that
// worked between its sleeps spent less than its budget, so this is at most
// the true figure), within minWALPerUnit and maxWALPerUnit.
func (p Pace) learn(wal int64, took time.Duration) float64 {
	if took <= 0 {
		return p.PerUnit
	}
	return min(max(float64(wal)/(took.Seconds()*p.UnitsPerSecond()), minWALPerUnit), maxWALPerUnit)
}

// slower is the WAL a cost unit is taken to write, and the boost, after a
// VACUUM at p was stopped because the standby fell behind: half the
// boost while there is one (the standby's rate was the guess), else twice
// the WAL a unit (the rate was measured, so the guess was the WAL), so
// that the next attempt goes at half the pace.
func (p Pace) slower() (perUnit, boost float64) {
	if p.Boost > 1 {
		return p.PerUnit, max(p.Boost/2, 1)
	}
	return min(2*p.PerUnit, maxWALPerUnit), 1
}
