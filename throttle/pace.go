package throttle

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// Pacing treats the WAL a standby has not replayed yet as bytes in flight,
// the way congestion control treats a network: a batch starts only when the
// bytes behind plus the batch's predicted WAL fit in the window, and the
// window is what the standby applies in MAX_REPLICA_LAG, measured, with a
// safety factor. The lag signals measure a backlog only once it exists; the
// window keeps it from being written in the first place.
const (
	// windowFactor leaves room for what adds to the queue's own lag: the
	// standby's steps of apply (a commit waits for the next one), the
	// heartbeat's granularity, and an apply rate that drops between two
	// readings. The queue tops out at about 0.4 x MAX_REPLICA_LAG of apply;
	// with 0.6 the heartbeat lag peaked at 1.3 x behind a standby applying
	// in half-second steps (docs/design/throttle-pacing.md).
	windowFactor = 0.4
	// floorWindow is the window while the apply rate is unknown (slow
	// start): small enough for a slow standby, and grown from the replay
	// progress it lets through.
	floorWindow = 256 << 10
	// busyBytes is the backlog above which a standby counts as busy: its
	// replay progress then measures its apply rate, not the primary's writes.
	busyBytes = 64 << 10
	// rateSpan is the busy time one apply-rate sample spans; the estimate
	// is the mean of the last rateSamples (3 s of busy time): a standby
	// applies in steps (a checkpoint, a governor, a burst after idle), and
	// a shorter span measures the steps, not the rate. The slow start ends
	// after slowStartSamples.
	rateSpan         = 250 * time.Millisecond
	rateSamples      = 12
	slowStartSamples = 5
	// trailSpan is the span of the lower-bound rate: what the standby
	// replayed lately, idle time included. Long enough that a standby that
	// saved up and bursts at the start does not inflate it much.
	trailSpan = 3 * time.Second
	// A cut halves the window's multiplier, once per overshoot; each
	// MAX_REPLICA_LAG without overshoot in which the window held a batch
	// adds growStep back.
	minMultiplier = 1.0 / 8
	growStep      = 0.1
	// firstRowBytes predicts a row's WAL before any batch was measured:
	// generous, since a first batch after a checkpoint writes full pages.
	firstRowBytes = 2048
)

// standby is the pacing state of one walsender.
type standby struct {
	behind   float64 // bytes not replayed, at the last reading
	queued   float64 // of which the standby has received (write_lsn - replay_lsn)
	replayed float64 // replay position, bytes
	at       time.Time
	known    bool // a replay position has been read

	busyBytes float64 // replay progress in busy intervals since the last sample
	busyTime  time.Duration
	samples   []float64 // the last rate samples, bytes/s
	trail     []point   // replay positions over the last trailSpan

	multiplier float64
	ceiling    float64   // slow start: grows by half the bytes replayed
	cutAt      time.Time // last cut
	grewAt     time.Time // last growth step
	recovered  bool      // a reading under MAX_REPLICA_LAG since the last cut
	limited    bool      // the window held a batch since the last growth step
}

type point struct {
	at       time.Time
	replayed float64
}

// sent is WAL the daemon's batches wrote after the last reading began.
type sent struct {
	at    time.Time
	bytes float64
}

// pacer holds every standby's pacing state. It does no I/O and takes the
// time as an argument, so tests drive it with a fake clock.
type pacer struct {
	maxLag   func() time.Duration // MAX_REPLICA_LAG in force (the throttle's limits)
	standbys map[string]*standby
	sent     []sent
	failure  string // the last reading of the standbys failed: hold (fail closed)
}

func newPacer(maxLag func() time.Duration) *pacer {
	return &pacer{maxLag: maxLag, standbys: map[string]*standby{}}
}

// readStarted drops the WAL a reading that began at now will include.
func (p *pacer) readStarted(now time.Time) {
	p.sent = slices.DeleteFunc(p.sent, func(s sent) bool { return s.at.Before(now) })
}

// wrote records a batch's WAL, committed at now.
func (p *pacer) wrote(now time.Time, bytes float64) {
	if bytes > 0 {
		p.sent = append(p.sent, sent{at: now, bytes: bytes})
	}
}

// unsent is the WAL written since the last reading began.
func (p *pacer) unsent() float64 {
	var n float64
	for _, s := range p.sent {
		n += s.bytes
	}
	return n
}

// observe records a standby's replay position, the bytes it has not
// replayed, and how many of those it has received (queued), read at now.
// Only an interval that starts and ends with a queue on the standby measures
// its apply rate: WAL the primary has not flushed or sent yet cannot be
// applied however fast the standby is. replayed < 0 means the standby has
// not reported a position: it holds the daemon until it does.
func (p *pacer) observe(name string, replayed, behind, queued float64, now time.Time) {
	s := p.standbys[name]
	if s == nil {
		s = &standby{multiplier: 1, ceiling: floorWindow, recovered: true}
		p.standbys[name] = s
	}
	if replayed < 0 {
		s.known = false
		return
	}
	if s.known && now.After(s.at) && replayed >= s.replayed {
		dt := now.Sub(s.at)
		progress := replayed - s.replayed
		s.ceiling += progress / 2
		// Busy all along: what it had received at the start outlasted the
		// interval, so the progress is its apply rate, not the arrival rate.
		if s.queued-progress >= busyBytes/4 && queued >= busyBytes {
			s.busyBytes += progress
			s.busyTime += dt
			if s.busyTime >= rateSpan {
				s.samples = append(s.samples, s.busyBytes/s.busyTime.Seconds())
				if len(s.samples) > rateSamples {
					s.samples = s.samples[1:]
				}
				s.busyBytes, s.busyTime = 0, 0
			}
		}
	} else if s.known && replayed < s.replayed {
		// A new standby under the same name: start over.
		*s = standby{multiplier: 1, ceiling: floorWindow, recovered: true}
	}
	s.trail = append(s.trail, point{at: now, replayed: replayed})
	for len(s.trail) > 2 && now.Sub(s.trail[1].at) >= trailSpan {
		s.trail = s.trail[1:]
	}
	s.replayed, s.behind, s.queued, s.at, s.known = replayed, behind, queued, now, true
	p.adjust(s, now)
}

// adjust cuts the multiplier when the queue overshoots MAX_REPLICA_LAG and
// grows it back while the window limits the daemon and the queue is under
// it.
func (p *pacer) adjust(s *standby, now time.Time) {
	if !s.measured() {
		return // a lower bound of the rate would see overshoots that are not there
	}
	rate := s.rate()
	if s.behind/rate > p.maxLag().Seconds() {
		p.cut(s, now)
		return
	}
	s.recovered = true
	if s.limited && now.Sub(s.grewAt) >= p.maxLag() && now.Sub(s.cutAt) >= p.maxLag() {
		s.multiplier = min(1, s.multiplier+growStep)
		s.grewAt, s.limited = now, false
	}
}

// cut halves the multiplier once per overshoot: the lag measured after a
// cut still shows the queue written before it, so another cut waits until
// a reading was under MAX_REPLICA_LAG again, and at least MAX_REPLICA_LAG.
func (p *pacer) cut(s *standby, now time.Time) {
	if !s.recovered || (!s.cutAt.IsZero() && now.Sub(s.cutAt) < p.maxLag()) {
		return
	}
	s.recovered = false
	s.multiplier = max(minMultiplier, s.multiplier/2)
	s.cutAt, s.grewAt = now, now
}

// lagged records a heartbeat lag read on a listed standby. Heartbeat
// readings cannot be matched to a walsender, so an overshoot cuts every
// standby's window.
func (p *pacer) lagged(seconds float64, now time.Time) {
	for _, s := range p.standbys {
		if seconds <= p.maxLag().Seconds() {
			s.recovered = true
		} else {
			p.cut(s, now)
		}
	}
}

// forget drops the walsenders not in keep.
func (p *pacer) forget(keep map[string]bool) {
	for name := range p.standbys {
		if !keep[name] {
			delete(p.standbys, name)
		}
	}
}

// rate is the apply rate in bytes/s: the mean of the last rateSamples busy
// samples, but never less than the replay progress over the trailing three
// seconds, which the standby has just shown it can do. Without that floor,
// samples taken in a bad moment would shrink the window until the standby
// is never busy again, and no new sample could correct them. Until there
// are slowStartSamples samples (slow start) the trailing progress alone is
// the rate: a few early samples are mostly the burst of a standby that was
// idle. 0 when unknown.
func (s *standby) rate() float64 {
	trail := s.trailRate()
	if !s.measured() {
		return trail
	}
	var sum float64
	for _, v := range s.samples {
		sum += v
	}
	return max(sum/float64(len(s.samples)), trail)
}

// measured reports whether the slow start is over: the rate comes from
// enough busy samples.
func (s *standby) measured() bool { return len(s.samples) >= slowStartSamples }

// trailRate is the replay progress over the trailing second (at least half
// a second of readings), 0 before that.
func (s *standby) trailRate() float64 {
	if len(s.trail) < 2 {
		return 0
	}
	first, last := s.trail[0], s.trail[len(s.trail)-1]
	span := last.at.Sub(first.at)
	if span < trailSpan*3/4 {
		return 0
	}
	return (last.replayed - first.replayed) / span.Seconds()
}

// window is the bytes the standby may have not replayed when a batch ends.
// Until the apply rate is measured (slow start), the window also stays
// under a ceiling that grows by half of what the standby replays: at most
// 1.5x per window applied, so a lower bound inflated by a burst (a standby
// that was idle runs ahead for a moment) does not open it at once.
func (p *pacer) window(s *standby) float64 {
	w := s.multiplier * windowFactor * s.rate() * p.maxLag().Seconds()
	if !s.measured() {
		w = min(w, s.ceiling)
	}
	return max(floorWindow, w)
}

// backlog reports whether a standby has a backlog, or has not reported a
// replay position yet: then the heartbeat is written often, so that its
// walreceiver, which replies when WAL arrives, reports its replay position
// often.
func (p *pacer) backlog() bool {
	for _, s := range p.standbys {
		if s.behind >= busyBytes || !s.known {
			return true
		}
	}
	return false
}

// Admission is the pacer's answer before a batch.
type Admission struct {
	Rows      int     // rows the batch may delete; 0: wait
	Predicted float64 // WAL the batch is expected to write, bytes
	Behind    float64 // bytes not replayed by the tightest standby, the daemon's unread WAL included
	Window    float64 // that standby's window
	Standby   string  // the tightest standby; empty when none streams
	Hold      string  // why the batch waits; empty when admitted
}

// admit sizes the next batch: at most size rows and half a window, at least
// minRows, predicted at perRow bytes a row (0: not measured yet). It waits
// for room for the whole batch. Half a window keeps the standby's queue
// between half the window and the window, never dry, and bounds what one
// wrong prediction can add. A window smaller than one
// minimum batch is widened to it: such a standby is slower than the daemon
// can pace: it gets one minimum batch whenever it has caught up, and the
// lag goes over (documented).
func (p *pacer) admit(size, minRows int, perRow float64) Admission {
	if p.failure != "" {
		return Admission{Hold: p.failure}
	}
	if len(p.standbys) == 0 {
		return Admission{Rows: size}
	}
	if perRow <= 0 {
		perRow = firstRowBytes
		size = minRows // the first batch measures the WAL a row costs
	}
	a := Admission{Window: math.Inf(1)}
	unsent := p.unsent()
	budget := math.Inf(1)
	for _, name := range p.names() {
		s := p.standbys[name]
		if !s.known {
			return Admission{Standby: name, Hold: fmt.Sprintf("standby %s has not reported a replay position", name)}
		}
		// busyBytes of slack: a caught-up standby is a heartbeat behind.
		w := max(p.window(s), float64(minRows)*perRow+busyBytes)
		if b := w - s.behind - unsent; b < budget {
			budget, a.Standby, a.Window, a.Behind = b, name, w, s.behind+unsent
		}
	}
	want := max(minRows, min(size, int(a.Window/2/perRow)))
	if budget < float64(want)*perRow {
		p.standbys[a.Standby].limited = true
		a.Hold = fmt.Sprintf("WAL window: standby %s is %s behind, window %s, next batch ~%s", a.Standby,
			fmtBytes(a.Behind), fmtBytes(a.Window), fmtBytes(float64(want)*perRow))
		return a
	}
	a.Rows = want
	a.Predicted = float64(a.Rows) * perRow
	return a
}

// overrunWindows is how far a standby's queue may grow, in windows, while
// a writer that cannot be split runs (a VACUUM paced by its cost
// settings): past it the writer is stopped. Two windows are 0.8 x
// MAX_REPLICA_LAG of apply at the measured rate; the queue starts within
// half a window, and a standby's step of apply and the time to stop the
// writer come on top, as they do for a batch. Counted in windows, not in
// seconds of the rate, because until the rate is measured it is only a
// lower bound (what the standby replayed lately: little, at the start of
// a VACUUM that reads before it writes), and the window has its floor.
const overrunWindows = 2

// writerPace is the pace of a writer whose WAL cannot be split into
// batches: it may start when every standby's queue, the daemon's unread
// WAL included, is within half its window (as a batch of half a window
// may), and write at what the tightest window lets through per
// windowFactor x MAX_REPLICA_LAG: the standby's apply rate times the
// multiplier (a window cut after an overshoot paces the writer too), or
// the floor window's rate while nothing is known.
func (p *pacer) writerPace() (service.WriterPace, string) {
	if p.failure != "" {
		return service.WriterPace{}, p.failure
	}
	unsent := p.unsent()
	for _, name := range p.names() {
		s := p.standbys[name]
		if !s.known {
			return service.WriterPace{Standby: name}, fmt.Sprintf("standby %s has not reported a replay position", name)
		}
		if w, behind := p.window(s), s.behind+unsent; behind > w/2 {
			s.limited = true
			return service.WriterPace{Standby: name}, fmt.Sprintf("WAL window: standby %s is %s behind, window %s; a writer that cannot be split waits for half of it",
				name, fmtBytes(behind), fmtBytes(w))
		}
	}
	return p.writerRate(), ""
}

// writerRate is the rate of writerPace, whatever the queues: the tightest
// window per windowFactor x MAX_REPLICA_LAG, among the standbys that have
// reported a replay position.
func (p *pacer) writerRate() service.WriterPace {
	out := service.WriterPace{Rate: math.Inf(1), Window: math.Inf(1)}
	per := windowFactor * p.maxLag().Seconds()
	for _, name := range p.names() {
		s := p.standbys[name]
		if !s.known {
			continue
		}
		if w := p.window(s); w/per < out.Rate {
			out = service.WriterPace{Rate: w / per, Window: w, Standby: name, Measured: s.measured()}
		}
	}
	return out
}

// overrun names a standby whose queue, the daemon's unread WAL included,
// is over overrunWindows of its window, or a reading of the standbys that
// failed; empty when none.
func (p *pacer) overrun() string {
	if p.failure != "" {
		return p.failure
	}
	unsent := p.unsent()
	for _, name := range p.names() {
		s := p.standbys[name]
		if !s.known {
			continue
		}
		if w, behind := p.window(s), s.behind+unsent; behind > overrunWindows*w {
			return fmt.Sprintf("WAL window: standby %s is %s behind, over %d windows of %s", name, fmtBytes(behind), overrunWindows, fmtBytes(w))
		}
	}
	return ""
}

// names are the standbys' names, sorted.
func (p *pacer) names() []string {
	names := make([]string, 0, len(p.standbys))
	for name := range p.standbys {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Pace is one standby's pacing state, for status and metrics.
type Pace struct {
	Standby string
	// Reported: the standby has reported a replay position. Until it has
	// (a walsender just connected), Behind is not known and the pacer
	// holds every batch for it.
	Reported  bool
	Behind    float64 // bytes not replayed
	ApplyRate float64 // bytes/s; 0 until measured
	Measured  bool    // ApplyRate comes from a busy standby (not a lower bound)
	Window    float64 // bytes
}

func (p *pacer) paces() []Pace {
	out := make([]Pace, 0, len(p.standbys))
	for name, s := range p.standbys {
		out = append(out, Pace{Standby: name, Reported: s.known, Behind: s.behind, ApplyRate: s.rate(), Measured: s.measured(), Window: p.window(s)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Standby < out[j].Standby })
	return out
}

// String is the human form shown by status.
func (pc Pace) String() string {
	if !pc.Reported {
		return fmt.Sprintf("standby %s: has not reported a replay position yet (every batch waits for it)", pc.Standby)
	}
	rate := "not measured yet (no backlog)"
	switch {
	case pc.Measured:
		rate = fmtBytes(pc.ApplyRate) + "/s"
	case pc.ApplyRate > 0:
		rate = "at least " + fmtBytes(pc.ApplyRate) + "/s (no backlog to measure it)"
	}
	return fmt.Sprintf("standby %s: %s behind, apply rate %s, window %s", pc.Standby, fmtBytes(pc.Behind), rate, fmtBytes(pc.Window))
}
