package humantime

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]time.Duration{
		"90d":    90 * Day,
		"36h":    36 * time.Hour,
		"1d12h":  36 * time.Hour,
		"1.5d":   36 * time.Hour,
		"1d":     Day,
		"12h1d":  36 * time.Hour,
		"720h":   30 * Day,
		"500ms":  500 * time.Millisecond,
		"1h30m":  90 * time.Minute,
		"0":      0,
		"0s":     0,
		"-2h":    -2 * time.Hour,
		" 30d ":  30 * Day,
		"1m0.5s": time.Minute + 500*time.Millisecond,
		"250us":  250 * time.Microsecond,
		"250µs":  250 * time.Microsecond,
	} {
		got, err := Parse(s)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "d", "1", "1x", "1 d", "1d 2h", "1w", "d1", "1dd", "1..5d", "-", "forever", "106752d", "1d-2h"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		} else if !strings.Contains(err.Error(), "90d") {
			t.Errorf("Parse(%q): %v: the message gives no example", s, err)
		}
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{90 * Day, "90d"},
		{36 * time.Hour, "1d12h"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{time.Minute, "1m"},
		{90 * time.Second, "1m30s"},
		{1500 * time.Millisecond, "1.5s"},
		{200 * time.Millisecond, "200ms"},
		{999 * time.Microsecond, "999us"},
		{0, "0s"},
		{-36 * time.Hour, "-1d12h"},
		{Day + time.Second, "1d1s"},
		{time.Hour + 500*time.Millisecond, "1h0m0.5s"},
	} {
		if got := Format(c.d); got != c.want {
			t.Errorf("Format(%v) = %q, want %q", c.d, got, c.want)
		}
		// What is printed reads back as the same duration.
		if back, err := Parse(c.want); err != nil || back != c.d {
			t.Errorf("Parse(Format(%v)) = %v, %v", c.d, back, err)
		}
	}
}

func TestDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		1199*time.Hour + 58*time.Minute + 35*time.Second: "50d",
		50*24*time.Hour + 13*time.Hour + 40*time.Minute:  "50d14h",
		2*time.Hour + 5*time.Minute + 20*time.Second:     "2h5m",
		4*time.Minute + 10*time.Second:                   "4m10s",
		12*time.Second + 400*time.Millisecond:            "12s",
		1500 * time.Millisecond:                          "1.5s",
		time.Second:                                      "1s",
		830 * time.Millisecond:                           "830ms",
		0:                                                "0s",
		-2 * time.Hour:                                   "-2h",
	} {
		got := Duration(d)
		if got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
		if _, err := Parse(got); err != nil {
			t.Errorf("Duration(%s) = %q does not parse: %v", d, got, err)
		}
	}
}

func TestLogs(t *testing.T) {
	t.Parallel()
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, &slog.HandlerOptions{ReplaceAttr: ForText})).Info("m", "lag", 2*time.Hour+5*time.Minute)
	slog.New(slog.NewJSONHandler(&js, &slog.HandlerOptions{ReplaceAttr: ForJSON})).Info("m", "lag", 2*time.Hour+5*time.Minute, "wait_seconds", time.Second)
	if !strings.Contains(text.String(), `lag=2h5m`) {
		t.Errorf("text log: %s", text.String())
	}
	if !strings.Contains(js.String(), `"lag_seconds":7500`) || !strings.Contains(js.String(), `"wait_seconds":1`) {
		t.Errorf("JSON log: %s", js.String())
	}
}
