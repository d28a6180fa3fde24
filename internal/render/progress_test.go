package render

import (
	"bytes"
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
