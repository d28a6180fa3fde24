package render

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
)

// Progress shows a long pass is alive: on a terminal (stderr a Terminal), a
// progress bar redrawn in place; otherwise a log line every few seconds
// once a table's pass has run that long (a short pass says nothing: its
// table's done line says what it did). The rate is the rows deleted over
// the last minute, across passes.
func Progress(stderr io.Writer, log *slog.Logger) func(expiry.Progress) {
	if t, ok := stderr.(*Terminal); ok {
		return progressBar(t)
	}
	return everyAtMost(progressEvery, progressEvery, func(p expiry.Progress, rate float64) {
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
	return everyAtMost(200*time.Millisecond, 0, func(p expiry.Progress, rate float64) {
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
// (rows per second, per table, over the last minute across passes: a
// running total of every batch's rows) and shows one by show at most every
// period, once a table's pass has run for after.
func everyAtMost(period, after time.Duration, show func(p expiry.Progress, rate float64)) func(expiry.Progress) {
	var last time.Time
	rates := Rates{}
	totals := map[string]int64{}
	return func(p expiry.Progress) {
		totals[p.Table] += p.BatchRows
		rate := rates.Add(p.Table, time.Now(), totals[p.Table])
		if _, ok := rates.rate(p.Table); !ok {
			rate = float64(p.Deleted) / max(p.Elapsed.Seconds(), 1e-9) // the first batch
		}
		if p.Elapsed < after || time.Since(last) < period {
			return
		}
		last = time.Now()
		show(p, rate)
	}
}

// Rates keeps, per table, the counts seen over the last minute: the
// rate at which they change is the rate over the last minute (rows deleted
// for the progress line, the fall of the due count for status --watch).
type Rates map[string]*batchloop.Rate

// Add records n for table at at and returns the rate of change, in rows/s,
// over the samples of the last minute (0 until there are two).
func (r Rates) Add(table string, at time.Time, n int64) float64 {
	if r[table] == nil {
		r[table] = &batchloop.Rate{}
	}
	return r[table].Add(at, n)
}

// slope is the change per second over the samples kept (negative where
// the count fell), and whether there are two to compare.
func (r Rates) slope(table string) (float64, bool) {
	if r[table] == nil {
		return 0, false
	}
	return r[table].Slope()
}

// rate is the rate of change over the samples kept (falling or rising),
// and whether there are two to compare.
func (r Rates) rate(table string) (float64, bool) {
	if r[table] == nil {
		return 0, false
	}
	return r[table].PerSecond()
}
