package render

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
)

// Progress shows a long pass is alive: on a terminal (stderr a Terminal), a
// progress bar redrawn in place; otherwise a log line every few seconds
// once a table's pass has run that long (a short pass says nothing: its
// table's done line says what it did). The rate is the pass's own while
// it deletes (passRate): what the rows left take at that pace, not the
// throughput across passes and the waits between them.
func Progress(stderr io.Writer, log *slog.Logger) func(expiry.Progress) {
	if t, ok := stderr.(*Terminal); ok {
		return progressBar(t)
	}
	return everyAtMost(time.Now, progressEvery, progressEvery, func(p expiry.Progress, rate float64) {
		args := []any{"table", p.Table, "deleted", p.Deleted, "batches", p.Batches, "rows_per_second", int64(rate)}
		if left := p.Estimate - p.Deleted; p.Estimate > 0 && left > 0 && rate > 0 {
			args = append(args, "rows_left", left, "time_left", time.Duration(float64(left)/rate*float64(time.Second)))
		}
		log.Info("expiry: progress", args...)
	})
}

// progressEvery is how often a long pass logs its progress.
const progressEvery = 3 * time.Second

// progressBar draws "table [#####.....] 50% 5000/10000 rows 2500 rows/s ~2s left".
func progressBar(t *Terminal) func(expiry.Progress) {
	return everyAtMost(time.Now, 200*time.Millisecond, 0, func(p expiry.Progress, rate float64) {
		const width = 30
		line := fmt.Sprintf("%s %d rows, %.0f rows/s", p.Table, p.Deleted, rate)
		if p.Estimate > 0 {
			frac := min(float64(p.Deleted)/float64(p.Estimate), 1)
			done := int(frac * width)
			left := max(p.Estimate-p.Deleted, 0)
			line = fmt.Sprintf("%s [%s%s] %3.0f%% %d/%d rows, %.0f rows/s, ~%s left", p.Table,
				strings.Repeat("#", done), strings.Repeat(".", width-done), frac*100, p.Deleted, p.Estimate, rate,
				humantime.Duration(time.Duration(float64(left)/max(rate, 1e-9))*time.Second))
		}
		t.Bar(line)
	})
}

// everyAtMost is a progress callback that keeps the rate of every report
// (passRate, per table) and shows one by show at most every period, once a
// table's pass has run for after; now is the clock.
func everyAtMost(now func() time.Time, period, after time.Duration, show func(p expiry.Progress, rate float64)) func(expiry.Progress) {
	var last time.Time
	rates := map[string]*passRate{}
	return func(p expiry.Progress) {
		at := now()
		r := rates[p.Table]
		if r == nil {
			r = &passRate{}
			rates[p.Table] = r
		}
		rate := r.add(at, p)
		if p.Elapsed < after || at.Sub(last) < period {
			return
		}
		last = at
		show(p, rate)
	}
}

// heldAfter is the longest wait between two batches that counts as the
// pass's pace (BATCH_PAUSE, the next batch's bound): a longer one is the
// pass held back (a pause, the throttle), and is left out of its rate.
const heldAfter = time.Second

// passRate is the rate at which one table's pass deletes while it
// deletes: its rows over the time from its first batch's start, less the
// waits between batches longer than heldAfter. A pass held for minutes
// then said 1 row/s and hours left, seconds before it ended; across
// passes, a rate over the last minute was the throughput of short passes
// and the idle time between them (200 rows/s), next to a first batch's
// own speed after a restart (117,000).
type passRate struct {
	deleted int64     // the pass's rows so far (Progress.Deleted)
	lastEnd time.Time // when its last batch was reported
	active  time.Duration
}

// add counts the batch p reports at at, and returns the pass's rate.
func (r *passRate) add(at time.Time, p expiry.Progress) float64 {
	if p.Deleted <= r.deleted || r.lastEnd.IsZero() {
		// A new pass (its count starts again), or the first batch seen:
		// its own time, not the look and the waits before it.
		*r = passRate{active: p.BatchDuration}
		if r.active <= 0 {
			r.active = p.Elapsed
		}
	} else {
		gap := at.Sub(r.lastEnd)
		if gap-p.BatchDuration > heldAfter {
			gap = p.BatchDuration // held back before this batch: only the batch counts
		}
		r.active += gap
	}
	r.deleted, r.lastEnd = p.Deleted, at
	return float64(p.Deleted) / max(r.active.Seconds(), 1e-3)
}
