package stop

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
)

func TestEarly(t *testing.T) {
	lease := errors.New("lease lost to host-b")
	for _, c := range []struct {
		e       Early
		stopped bool
		reason  Reason
		text    string
	}{
		{Early{}, false, "", ""},
		{AtRunTime, true, RunTime, "run time reached"},
		{AtLockWait, true, LockWait, "a session waited on a lock the daemon held"},
		{Throttle("run time reached while throttled (replica lag)"), true, Throttled, "run time reached while throttled (replica lag)"},
		{Inactive(lease), true, Lease, "lease lost to host-b"},
		{Inactive(fmt.Errorf("check: %w", ErrSettingsChanged)), true, SettingsChanged, ErrSettingsChanged.Error()},
	} {
		if c.e.Stopped() != c.stopped || c.e.Reason != c.reason || c.e.String() != c.text {
			t.Errorf("%+v: stopped %v reason %q text %q, want %v %q %q", c.e, c.e.Stopped(), c.e.Reason, c.e.String(), c.stopped, c.reason, c.text)
		}
		b, err := json.Marshal(struct{ S Early }{c.e})
		if want := fmt.Sprintf(`{"S":%q}`, c.text); err != nil || string(b) != want {
			t.Errorf("%+v: JSON %s (%v), want %s", c.e, b, err, want)
		}
	}
}
