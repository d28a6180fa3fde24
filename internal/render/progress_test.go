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
