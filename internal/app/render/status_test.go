package render

import (
	"testing"
	"time"
)

// status --watch says how the due count moved: a rise is not a rate at
// which rows go, and has no time to zero.
func TestBacklogTrend(t *testing.T) {
	for _, c := range []struct {
		fall float64
		due  int64
		want string
	}{
		{100, 3000, "falling by 100/s, gone in about 30s at that pace"},
		{0, 0, "none due"},
		{30, 0, "none due"}, // fell to 0 within the minute
		{0.2, 40, "not falling: rows fall due as fast as they go, or nothing deletes them"},
		{-25, 4000, "rising by 25/s: rows fall due faster than they go"},
	} {
		if got := backlogTrend(c.fall, c.due); got != c.want {
			t.Errorf("backlogTrend(%v, %d) = %q, want %q", c.fall, c.due, got, c.want)
		}
	}
}

// A daemon on INTERVAL=1m lets 200 rows/s fall due between its passes and
// clears them in each: status --watch every 2 s sees a saw-tooth, and says
// so, rather than the net change of the minute as if it were a pace toward
// zero ("falling by 1/s, gone in about 43m"). A backlog worked down
// steadily is still a pace and a time to zero.
func TestWatchTrend(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	sawTooth := Rates{}
	var due int64
	for i := 0; i <= 45; i++ { // 90 s: a pass at 30 s and at 90 s
		at := t0.Add(time.Duration(i) * 2 * time.Second)
		due += 400
		if i == 15 || i == 45 {
			due = 0
		}
		sawTooth.Add("t", at, due)
	}
	// One more round, 2 s after the last pass.
	sawTooth.Add("t", t0.Add(92*time.Second), 400)
	got := sawTooth.trend("t", 400)
	want := "cleared by each pass (the last 2s ago, from 11600 to 0); rising by 200/s between passes"
	if got != want {
		t.Errorf("saw-tooth: %q, want %q", got, want)
	}

	steady := Rates{}
	for i := 0; i <= 30; i++ {
		steady.Add("t", t0.Add(time.Duration(i)*2*time.Second), int64(60000-i*200))
	}
	if got := steady.trend("t", 54000); got != "falling by 100/s, gone in about 9m at that pace" {
		t.Errorf("a backlog worked down: %q", got)
	}
	if got := (Rates{}).trend("t", 10); got != "" {
		t.Errorf("one round: %q, want nothing yet", got)
	}
}
