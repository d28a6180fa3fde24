package humantime

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		1199*time.Hour + 58*time.Minute + 35*time.Second: "50d 0h",
		50*24*time.Hour + 13*time.Hour + 40*time.Minute:  "50d 14h",
		2*time.Hour + 5*time.Minute + 20*time.Second:     "2h 5m",
		4*time.Minute + 10*time.Second:                   "4m 10s",
		12*time.Second + 400*time.Millisecond:            "12s",
		1500 * time.Millisecond:                          "1.5s",
		time.Second:                                      "1s",
		830 * time.Millisecond:                           "830ms",
		0:                                                "0ms",
		-2 * time.Hour:                                   "-2h 0m",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestLogs(t *testing.T) {
	t.Parallel()
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, &slog.HandlerOptions{ReplaceAttr: ForText})).Info("m", "lag", 2*time.Hour+5*time.Minute)
	slog.New(slog.NewJSONHandler(&js, &slog.HandlerOptions{ReplaceAttr: ForJSON})).Info("m", "lag", 2*time.Hour+5*time.Minute, "wait_seconds", time.Second)
	if !strings.Contains(text.String(), `lag="2h 5m"`) {
		t.Errorf("text log: %s", text.String())
	}
	if !strings.Contains(js.String(), `"lag_seconds":7500`) || !strings.Contains(js.String(), `"wait_seconds":1`) {
		t.Errorf("JSON log: %s", js.String())
	}
}
