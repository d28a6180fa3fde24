package render

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
)

func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	progressBar(&Terminal{w: &b})(expiry.Progress{Table: "public.consumer_inbox", Deleted: 5000, Elapsed: 2 * time.Second, Estimate: 10000})
	got := b.String()
	for _, want := range []string{"\r", "public.consumer_inbox [###############...............]", " 50%", "5000/10000 rows", "2500 rows/s", "~2s left"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress bar %q lacks %q", got, want)
		}
	}
	b.Reset()
	progressBar(&Terminal{w: &b})(expiry.Progress{Table: "t", Deleted: 10, Elapsed: time.Second})
	if !strings.Contains(b.String(), "t 10 rows, 10 rows/s") {
		t.Errorf("without an estimate: %q", b.String())
	}
}

// Off a terminal, a pass shorter than the progress period logs no progress
// line (its table's done line says what it did); a long one does, with the
// rows deleted per second.
func TestProgressLogsOnlyLongPasses(t *testing.T) {
	var b bytes.Buffer
	progress := Progress(&b, slog.New(slog.NewTextHandler(&b, nil)))
	progress(expiry.Progress{Table: "t", Deleted: 5000, Batches: 1, BatchRows: 5000, Elapsed: 100 * time.Millisecond})
	if b.Len() > 0 {
		t.Errorf("a short pass logged progress: %s", b.String())
	}
	progress(expiry.Progress{Table: "t", Deleted: 15000, Batches: 3, BatchRows: 5000, Elapsed: 4 * time.Second})
	if !strings.Contains(b.String(), `msg="expiry: progress" table=t deleted=15000 batches=3 rows_per_second=`) {
		t.Errorf("a long pass logged no progress line: %q", b.String())
	}
}

// The rate of the progress line is the pass's while it deletes: a pass
// held for minutes (a pause, the throttle) reports the pace of its batches
// and the little time its rows left take at it, not 1 row/s and hours;
// and a new pass starts its own rate, rather than a minute's throughput
// across short passes and the idle time between them.
func TestProgressRateLeavesWaitsOut(t *testing.T) {
	clock := time.Unix(0, 0)
	var lines []float64
	var left []int64
	progress := everyAtMost(func() time.Time { return clock }, 0, 0, func(p expiry.Progress, rate float64) {
		lines = append(lines, rate)
		left = append(left, p.Estimate-p.Deleted)
	})
	batch := func(deleted int64, elapsed time.Duration) {
		progress(expiry.Progress{Table: "t", Deleted: deleted, Batches: int(deleted / 1000), BatchRows: 1000,
			BatchDuration: 100 * time.Millisecond, Elapsed: elapsed, Estimate: 20000})
	}
	// Two batches of 1,000 rows, each 100 ms, back to back: 10,000 rows/s.
	clock = clock.Add(100 * time.Millisecond)
	batch(1000, 100*time.Millisecond)
	clock = clock.Add(100 * time.Millisecond)
	batch(2000, 200*time.Millisecond)
	// Held for ten minutes, then one more batch.
	clock = clock.Add(10*time.Minute + 100*time.Millisecond)
	batch(3000, 10*time.Minute+300*time.Millisecond)
	for i, rate := range lines {
		if rate < 9000 || rate > 11000 {
			t.Errorf("line %d: %.0f rows/s, want about 10,000: the pass's pace, its ten minutes held left out", i, rate)
		}
	}
	// A new pass: its first batch's own pace, not the last pass's.
	clock = clock.Add(time.Minute)
	progress(expiry.Progress{Table: "t", Deleted: 500, Batches: 1, BatchRows: 500, BatchDuration: 250 * time.Millisecond, Elapsed: 300 * time.Millisecond})
	if got := lines[len(lines)-1]; got != 2000 {
		t.Errorf("a new pass's first batch: %.0f rows/s, want its own 2,000", got)
	}
}
