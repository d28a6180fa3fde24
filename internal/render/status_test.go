package render

import "testing"

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
