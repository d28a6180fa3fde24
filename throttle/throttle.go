// Package throttle decides whether the services of a pass may start their
// next batch or DDL statement.
//
// Signals measure on their own tickers (replica lag from a heartbeat,
// pg_stat_replication, logical slots, a custom query, a manual pause) and
// store readings; Check only reads them and returns a reason. They read at
// their cadence only while a pass asks for batches, and only what exists
// between passes (cadence.go). Each signal
// is one file that registers itself (signal.go): what it measures and how
// often, its reason kinds, its metrics and how its readings read in
// status. The services ask Admit before every batch, never inside a
// transaction. A signal that went over its threshold stays "over" until it
// falls to its resume level (half the threshold by default), so the daemon
// does not flap. The WAL window (pace.go) paces batches before any signal
// trips.
//
// Daemon internals: the daemon's pass, `once` and `status` use it; its API
// may change between releases.
package throttle

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

// TestSignals lets tests observe decisions without sleeping.
type TestSignals struct {
	// Admitted is told of every batch the WAL window admitted.
	Admitted func(Admission)
	// Held is told when the WAL window holds a batch back.
	Held func(Admission)
	// WorkersRead is told when the workers' standbys are read (on a Citus
	// coordinator: a run_command_on_workers, a connection and a
	// transaction on every worker).
	WorkersRead func()
}

// Built-in cadences: how often the primary's views are read, and how long
// a detected lock wait keeps new batches out.
const (
	statsInterval    = 50 * time.Millisecond
	lockWaitCooldown = time.Second
)

// unknown is the value of a reading that could not be taken: over every
// threshold, so that it fails closed.
var unknown = math.Inf(1)

// Reading is one measured signal.
type Reading struct {
	Kind      string
	Subject   string  // replica, slot, or empty
	Value     float64 // seconds or bytes; +Inf when unknown and failing closed
	Threshold float64
	Unit      string // "s", "bytes" or ""
	Detail    string // e.g. the pause reason, the connection error
	Over      bool   // with hysteresis
	At        time.Time
}

func (r Reading) key() string { return r.Kind + "\x00" + r.Subject }

// String is the human form used in logs and status.
func (r Reading) String() string {
	var b strings.Builder
	b.WriteString(r.Kind)
	if r.Subject != "" {
		fmt.Fprintf(&b, " %s", r.Subject)
	}
	switch r.Unit {
	case "s":
		fmt.Fprintf(&b, ": %s (threshold %s)", fmtSeconds(r.Value), fmtSeconds(r.Threshold))
	case "bytes":
		fmt.Fprintf(&b, ": %s (threshold %s)", fmtBytes(r.Value), fmtBytes(r.Threshold))
	default:
		if k := kindNamed(r.Kind); k != nil && k.format != nil {
			b.WriteString(k.format(r))
		}
	}
	if r.Detail != "" {
		fmt.Fprintf(&b, " [%s]", r.Detail)
	}
	return b.String()
}

func fmtSeconds(v float64) string {
	if math.IsInf(v, 1) {
		return "unknown"
	}
	return humantime.Format(time.Duration(v * float64(time.Second)).Round(time.Millisecond))
}

// FormatBytes is v bytes for people: KiB, MiB, GiB with one decimal.
func FormatBytes(v float64) string { return fmtBytes(v) }

func fmtBytes(v float64) string {
	if math.IsInf(v, 1) {
		return "unknown"
	}
	switch {
	case v >= 1<<30:
		return fmt.Sprintf("%.1f GiB", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

// State is the throttle's verdict.
type State struct {
	Throttled bool
	Kind      string // the first signal over its threshold
	Reason    string // human-readable, every signal over its threshold
	Since     time.Time
}

// Throttler collects signals and answers Check, Wait and Admit. It embeds
// the service base for its logger and clock; it is not throttled itself.
type Throttler struct {
	service.Base
	TestSignals TestSignals // set before Start

	cfg     config.Config // the signals' settings (the environment's, with the runtime settings in force when built)
	pool    *pgxpool.Pool // the primary
	metrics *Metrics

	mu       sync.Mutex
	readings map[string]Reading
	state    State
	changed  chan struct{} // closed and replaced when a reading changes
	watched  map[uint32]*watch
	lockWait time.Time // last detected lock wait
	pacer    *pacer
	held     bool      // the last admission waited
	paused   time.Time // when the verdict went from resuming to pausing
	lastBeat time.Time
	beats    []time.Time // the heartbeats written lately, in the primary's clock (replica.go)
	fails    *failLog
	awake    bool          // the signals are read at their working cadence (cadence.go)
	woken    chan struct{} // closed and replaced when awake changes
	cs       []*collector  // what Start polls
	first    chan struct{} // closed when Start's first reading is done (firstReading)
	stopping bool          // Stop was called: what Start has not started yet, it does not

	// workers is the reading of a Citus coordinator's workers' standbys
	// (workers.go), owned by the walsender reading; workerStandbys says
	// whether it found one (under mu).
	workers        workerReads
	workerStandbys bool

	cancel context.CancelFunc
	wg     sync.WaitGroup

	lim atomic.Pointer[config.Limits] // the thresholds runtime settings may change
}

// New returns a Throttler for the settings of cfg (zero values get the
// environment's defaults); Start launches its collectors.
func New(pool *pgxpool.Pool, cfg config.Config, base service.Base, m *Metrics) *Throttler {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = config.DefaultHeartbeatInterval
	}
	if cfg.ThrottleResume <= 0 || cfg.ThrottleResume > 1 {
		cfg.ThrottleResume = config.DefaultThrottleResume
	}
	if base.Logger == nil {
		base.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Throttler{Base: base, cfg: cfg, pool: pool, metrics: m, readings: map[string]Reading{}, changed: make(chan struct{}),
		watched: map[uint32]*watch{}, woken: make(chan struct{})}
	t.pacer = newPacer(func() time.Duration { return t.limits().MaxReplicaLag })
	t.fails = newFailLog(t.Logger, t.Clock)
	t.SetLimits(cfg.Limits())
	return t
}

// limits returns the thresholds in force.
func (t *Throttler) limits() *config.Limits { return t.lim.Load() }

// SetLimits changes the thresholds runtime settings may change
// (MAX_REPLICA_LAG, MAX_REPLICA_LAG_BYTES, ACTIVE_HOURS, ACTIVE_TZ) while
// the throttle runs: the next reading, admission and check use them. Zero
// values get the defaults.
func (t *Throttler) SetLimits(l config.Limits) {
	if l.MaxReplicaLag <= 0 {
		l.MaxReplicaLag = config.DefaultMaxReplicaLag
	}
	if l.MaxReplicaLagBytes <= 0 {
		l.MaxReplicaLagBytes = int64(config.DefaultMaxReplicaLagBytes)
	}
	if l.ActiveTZ == nil {
		l.ActiveTZ = time.UTC
	}
	t.lim.Store(&l)
}

// set stores a reading, applying hysteresis against the previous one.
func (t *Throttler) set(r Reading) {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev, had := t.readings[r.key()]
	resume := r.Threshold * t.cfg.ThrottleResume
	r.Over = r.Value > r.Threshold || (had && prev.Over && r.Value > resume)
	r.At = time.Now()
	t.readings[r.key()] = r
	if t.metrics != nil {
		t.metrics.export(r, false)
	}
	t.notify()
}

// notify wakes whoever waits for a new reading; t.mu is held.
func (t *Throttler) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// drop forgets readings of kind whose subject is not in keep (a slot that was
// dropped, a standby that disconnected).
func (t *Throttler) drop(kind string, keep map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, r := range t.readings {
		if r.Kind == kind && !keep[r.Subject] {
			delete(t.readings, k)
			if t.metrics != nil {
				t.metrics.export(r, true)
			}
		}
	}
}

// forget removes one reading.
func (t *Throttler) forget(kind, subject string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := Reading{Kind: kind, Subject: subject}.key()
	if r, ok := t.readings[k]; ok {
		delete(t.readings, k)
		if t.metrics != nil {
			t.metrics.export(r, true)
		}
	}
}

// Readings returns the current readings, sorted.
func (t *Throttler) Readings() []Reading {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Reading, 0, len(t.readings))
	for _, r := range t.readings {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key() < out[j].key() })
	return out
}

// Check returns the verdict from the stored readings and the clock. It does
// no I/O, so the deleter may call it as often as it likes; after Start, it
// waits for the first reading of every signal.
func (t *Throttler) Check() State {
	if first := t.firstReading(); first != nil {
		<-first
	}
	var over []Reading
	for _, r := range t.Readings() {
		if r.Over {
			over = append(over, r)
		}
	}
	now := t.Clock.Now()
	for _, k := range registry {
		if k.verdict != nil {
			if r, ok := k.verdict(t, now); ok {
				over = append(over, r)
			}
		}
	}
	s := State{Throttled: len(over) > 0}
	if s.Throttled {
		s.Kind = over[0].Kind
		parts := make([]string, len(over))
		for i, r := range over {
			parts[i] = r.String()
		}
		s.Reason = strings.Join(parts, "; ")
	}
	return s
}

// Wait returns as soon as no signal throttles, or with ctx's error. It
// returns the first throttled state it saw (zero when it did not wait), logs
// every change of state or reason, and accounts the time spent throttled.
func (t *Throttler) Wait(ctx context.Context) (State, error) {
	if first := t.firstReading(); first != nil {
		select {
		case <-first:
		case <-ctx.Done():
			return State{}, ctx.Err()
		}
	}
	t.wake(ctx)
	tick := time.NewTicker(100 * time.Millisecond) // the active window moves with the clock
	defer tick.Stop()
	var first State
	for {
		t.mu.Lock()
		changed := t.changed
		t.mu.Unlock()
		s := t.Check()
		t.transition(s)
		if !s.Throttled {
			return first, nil
		}
		if !first.Throttled {
			first = s
		}
		select {
		case <-ctx.Done():
			return first, ctx.Err()
		case <-changed:
		case <-tick.C:
		}
	}
}

// BatchSizer is what pacing asks of a batch sizer (batchloop.Sizer): the
// next batch's size, the smallest batch, and the WAL a row costs (0 until
// measured).
type BatchSizer interface {
	Size() int
	Min() int
	PerRow() float64
}

// Pace waits until no signal throttles and the next batch fits the WAL
// window of every streaming standby, and returns the admission: how many
// rows the batch may have (at most sizer's size). It also returns the first
// throttled state it saw, as Wait does.
func (t *Throttler) Pace(ctx context.Context, sizer BatchSizer) (Admission, State, error) {
	var first State
	for {
		st, err := t.Wait(ctx)
		if st.Throttled && !first.Throttled {
			first = st
		}
		if err != nil {
			return Admission{}, first, err
		}
		t.mu.Lock()
		changed := t.changed
		a := t.pacer.admit(sizer.Size(), sizer.Min(), sizer.PerRow())
		wasHeld := t.held
		t.held = a.Rows == 0
		t.mu.Unlock()
		if t.metrics != nil {
			t.metrics.WALWindow.Set(zeroInf(a.Window))
		}
		if a.Rows > 0 {
			if wasHeld {
				t.Logger.Debug("throttle: WAL window has room again", "standby", a.Standby, "rows", a.Rows)
			}
			if t.TestSignals.Admitted != nil {
				t.TestSignals.Admitted(a)
			}
			return a, first, nil
		}
		if !wasHeld {
			t.Logger.Debug("throttle: holding the batch for the WAL window", "reason", a.Hold)
		}
		if t.TestSignals.Held != nil {
			t.TestSignals.Held(a)
		}
		select {
		case <-ctx.Done():
			return a, first, ctx.Err()
		case <-changed:
		}
	}
}

// Admit is Pace for the services (service.Gate): it waits until no signal
// throttles and, with a sizer, until the next batch fits the WAL window. A
// pause for a backlog shrinks the sizer: the throttle saw the backlog only
// after this much WAL, so the next batches must bring less. When ctx ends
// first, the error is a *service.HeldError with the reason.
func (t *Throttler) Admit(ctx context.Context, sizer service.Sizer) (int, error) {
	if sizer == nil {
		if _, err := t.Wait(ctx); err != nil {
			return 0, &service.HeldError{Reason: t.Check().Reason, Err: err}
		}
		return 0, nil
	}
	a, st, err := t.Pace(ctx, sizer)
	if st.Throttled && Backlog(st.Kind) {
		sizer.Pressure()
		a.Rows = min(a.Rows, sizer.Size())
	}
	if err != nil {
		reason := t.Check().Reason
		if reason == "" {
			reason = a.Hold
		}
		return 0, &service.HeldError{Reason: reason, Err: err}
	}
	return a.Rows, nil
}

// PaceWriter waits until no signal throttles and every streaming
// standby's queue is within half its WAL window, and returns the pace a
// writer that cannot be split into batches may write at (service.WriterGate).
// The writer asks Overrun while it runs. When ctx ends first, the error is
// a *service.HeldError with the reason.
func (t *Throttler) PaceWriter(ctx context.Context) (service.WriterPace, error) {
	held := false
	for {
		if _, err := t.Wait(ctx); err != nil {
			return service.WriterPace{}, &service.HeldError{Reason: t.Check().Reason, Err: err}
		}
		t.mu.Lock()
		changed := t.changed
		p, hold := t.pacer.writerPace()
		t.mu.Unlock()
		if hold == "" {
			if t.metrics != nil && p.Paced() {
				t.metrics.WALWindow.Set(p.Window)
			}
			return p, nil
		}
		if !held {
			t.Logger.Debug("throttle: holding a writer for the WAL window", "reason", hold)
			held = true
		}
		select {
		case <-ctx.Done():
			return service.WriterPace{}, &service.HeldError{Reason: hold, Err: ctx.Err()}
		case <-changed:
		}
	}
}

// WriterRate is the rate PaceWriter would give a writer, without waiting
// for room in the windows: what status shows.
func (t *Throttler) WriterRate() service.WriterPace {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pacer.writerRate()
}

// Overrun says why a writer that PaceWriter let start must stop now: a
// signal over its threshold (what would hold a batch), or a standby whose
// queue is over twice its WAL window (0.8 x MAX_REPLICA_LAG of its apply);
// empty while it may go on. No I/O: it reads the stored readings.
func (t *Throttler) Overrun() string {
	if s := t.Check(); s.Throttled {
		return s.Reason
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pacer.overrun()
}

// Wrote tells the pacer the WAL a batch wrote, so that the next admission
// counts it before a reading of the standbys does.
func (t *Throttler) Wrote(bytes float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pacer.wrote(t.Clock.Now(), bytes)
}

// Paces returns every streaming standby's pacing state.
func (t *Throttler) Paces() []Pace {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pacer.paces()
}

// zeroInf exports "no window" as 0.
func zeroInf(v float64) float64 {
	if math.IsInf(v, 0) {
		return 0
	}
	return v
}

// Backlog reports whether a kind means WAL is piling up somewhere: the
// batch size should shrink, since the throttle measures too late for a big
// batch's WAL.
func Backlog(kind string) bool {
	k := kindNamed(kind)
	return k != nil && k.backlog
}

// transition records a new verdict: a log line when the state or reason
// kind changes, the throttled gauges, and the seconds spent throttled.
func (t *Throttler) transition(s State) {
	var pausedFor time.Duration
	t.mu.Lock()
	prev := t.state
	now := time.Now()
	if prev.Throttled && !prev.Since.IsZero() && t.metrics != nil {
		t.metrics.ThrottledSeconds.WithLabelValues(prev.Kind).Add(now.Sub(prev.Since).Seconds())
	}
	s.Since = now
	t.state = s
	switch {
	case s.Throttled && !prev.Throttled:
		t.paused = now
	case !s.Throttled && prev.Throttled:
		pausedFor = now.Sub(t.paused).Round(time.Millisecond)
	}
	t.mu.Unlock()
	if t.metrics != nil {
		for _, k := range Kinds() {
			v := 0.0
			if s.Throttled && s.Kind == k {
				v = 1
			}
			t.metrics.Throttled.WithLabelValues(k).Set(v)
		}
	}
	switch {
	case s.Throttled && !prev.Throttled:
		t.Logger.Warn("throttle: pausing", "kind", s.Kind, "reason", s.Reason)
	case s.Throttled && prev.Kind != s.Kind:
		// One pause, one WARN: a standby back from an outage is behind
		// for a moment, and that is the same pause going on.
		t.Logger.Info("throttle: still pausing", "kind", s.Kind, "reason", s.Reason, "was", prev.Kind)
	case !s.Throttled && prev.Throttled:
		t.Logger.Info("throttle: resuming", "was", prev.Kind, "paused_for", pausedFor)
	}
}

// State returns the last verdict Wait saw.
func (t *Throttler) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state
}
