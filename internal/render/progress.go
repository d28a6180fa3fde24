package render

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
)

// Progress shows a long pass is alive: on a terminal (stderr a Terminal), a
// progress bar redrawn in place; otherwise a log line every few seconds.
func Progress(stderr io.Writer, log *slog.Logger) func(expiry.Progress) {
	if t, ok := stderr.(*Terminal); ok {
		return progressBar(t)
	}
	return everyAtMost(3*time.Second, func(p expiry.Progress, rate float64) {
		args := []any{"table", p.Table, "deleted", p.Deleted, "batches", p.Batches, "rows_per_second", int64(rate)}
		if left := p.Estimate - p.Deleted; p.Estimate > 0 && left > 0 && rate > 0 {
			args = append(args, "rows_left", left, "time_left", time.Duration(float64(left)/rate*float64(time.Second)))
		}
		log.Info("expiry: progress", args...)
	})
}

// progressBar draws "table [#####.....] 50% 5000/10000 rows 2500 rows/s ~2s left".
func progressBar(t *Terminal) func(expiry.Progress) {
	return everyAtMost(200*time.Millisecond, func(p expiry.Progress, rate float64) {
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
// (rows per second, per table) and shows one by show at most every period.
func everyAtMost(period time.Duration, show func(p expiry.Progress, rate float64)) func(expiry.Progress) {
	var last time.Time
	rates := Rates{}
	return func(p expiry.Progress) {
		rate := rates.progress(p)
		if time.Since(last) < period {
			return
		}
		last = time.Now()
		show(p, rate)
	}
}

// Rates keeps, per table, the counts seen over the last minute: the
// rate at which they change is the rate over the last minute (rows deleted
// for the progress line, the fall of the due count for status --watch).
type Rates map[string][]rateSample

type rateSample struct {
	at time.Time
	n  int64
}

// Add records n for table at at and returns the rate of change, in rows/s,
// over the samples of the last minute (0 until there are two).
func (r Rates) Add(table string, at time.Time, n int64) float64 {
	s := append(r[table], rateSample{at, n})
	for len(s) > 1 && at.Sub(s[0].at) > time.Minute {
		s = s[1:]
	}
	r[table] = s
	rate, _ := r.rate(table)
	return rate
}

// progress is the progress line's rate: rows deleted per second over the
// last minute, or since the table's pass began until there is a minute's
// second sample.
func (r Rates) progress(p expiry.Progress) float64 {
	r.Add(p.Table, time.Now(), p.Deleted)
	if rate, ok := r.rate(p.Table); ok {
		return rate
	}
	return float64(p.Deleted) / max(p.Elapsed.Seconds(), 1e-9)
}

// rate is the rate of change over the samples kept (falling or rising),
// and whether there are two to compare.
func (r Rates) rate(table string) (float64, bool) {
	s := r[table]
	if len(s) < 2 {
		return 0, false
	}
	first, last := s[0], s[len(s)-1]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 {
		return 0, false
	}
	d := float64(last.n - first.n)
	if d < 0 {
		d = -d
	}
	return d / dt, true
}
