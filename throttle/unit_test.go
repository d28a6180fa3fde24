package throttle

import (
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
)

func TestHysteresis(t *testing.T) {
	th := New(nil, config.Config{}, service.Base{}, nil)
	steps := []struct {
		value float64
		over  bool
	}{
		{0.5, false}, {1.0, false}, {1.01, true}, {0.8, true}, {0.51, true}, {0.5, false}, {0.9, false}, {2, true},
	}
	for i, s := range steps {
		th.set(Reading{Kind: ReplicaLag, Subject: "r", Value: s.value, Threshold: 1, Unit: "s"})
		st := th.Check()
		if st.Throttled != s.over {
			t.Errorf("step %d (value %v): throttled=%v, want %v", i, s.value, st.Throttled, s.over)
		}
		if s.over && (st.Kind != ReplicaLag || !strings.Contains(st.Reason, "replica_lag r")) {
			t.Errorf("step %d: kind %q reason %q", i, st.Kind, st.Reason)
		}
	}
}

func TestActiveWindow(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		window string
		tz     *time.Location
		at     time.Time
		open   bool
	}{
		{"22:00-06:00", time.UTC, time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), false},
		{"22:00-06:00", time.UTC, time.Date(2026, 1, 1, 23, 0, 0, 0, time.UTC), true},
		{"22:00-06:00", time.UTC, time.Date(2026, 1, 1, 22, 0, 0, 0, time.UTC), true},
		{"22:00-06:00", time.UTC, time.Date(2026, 1, 1, 5, 59, 0, 0, time.UTC), true},
		{"22:00-06:00", time.UTC, time.Date(2026, 1, 1, 6, 0, 0, 0, time.UTC), false},
		{"09:00-17:00", time.UTC, time.Date(2026, 1, 1, 16, 59, 0, 0, time.UTC), true},
		{"09:00-17:00", time.UTC, time.Date(2026, 1, 1, 17, 0, 0, 0, time.UTC), false},
		// 21:30 UTC is 22:30 in Berlin in winter.
		{"22:00-06:00", berlin, time.Date(2026, 1, 1, 21, 30, 0, 0, time.UTC), true},
		{"22:00-06:00", berlin, time.Date(2026, 7, 1, 19, 30, 0, 0, time.UTC), false},
	}
	for _, c := range cases {
		at := c.at
		th := New(nil, config.Config{ActiveHours: c.window, ActiveTZ: c.tz.String()}, service.Base{Clock: func() time.Time { return at }}, nil)
		st := th.Check()
		if st.Throttled == c.open {
			t.Errorf("%s %s at %s: throttled=%v", c.window, c.tz, c.at, st.Throttled)
		}
		if st.Throttled && st.Kind != OutsideHours {
			t.Errorf("kind %q, want %q", st.Kind, OutsideHours)
		}
	}
}

// SetLimits changes the active window (and the lag thresholds) of a
// running throttle: a runtime setting needs no restart.
func TestSetLimits(t *testing.T) {
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	th := New(nil, config.Config{}, service.Base{Clock: func() time.Time { return noon }}, nil)
	if st := th.Check(); st.Throttled {
		t.Fatalf("throttled without a window: %+v", st)
	}
	th.SetLimits(config.Limits{MaxReplicaLag: 5 * time.Second, MaxReplicaLagBytes: 1 << 20, ActiveHours: "22:00-06:00", ActiveTZ: time.UTC})
	if st := th.Check(); !st.Throttled || st.Kind != OutsideHours {
		t.Errorf("after SetLimits with a night window, at noon: %+v", st)
	}
	if l := th.limits(); l.MaxReplicaLag != 5*time.Second || l.MaxReplicaLagBytes != 1<<20 || th.pacer.maxLag() != 5*time.Second {
		t.Errorf("the thresholds in force: %+v, pacer %s", l, th.pacer.maxLag())
	}
	th.SetLimits(config.Limits{MaxReplicaLag: time.Second, MaxReplicaLagBytes: 1 << 20})
	if st := th.Check(); st.Throttled {
		t.Errorf("after the window was removed: %+v", st)
	}
}
