package retry

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
		kind    Kind
		text    string
	}{
		{Early{}, false, "", ""},
		{AtRunTime, true, KindRunTime, "run time reached"},
		{AtLockWait, true, KindLockWait, "a session waited on a lock the daemon held"},
		{Throttled("run time reached while throttled (replica lag)"), true, KindThrottled, "run time reached while throttled (replica lag)"},
		{Inactive(lease), true, KindLease, "lease lost to host-b"},
		{Inactive(fmt.Errorf("check: %w", ErrSettingsChanged)), true, KindSettingsChanged, ErrSettingsChanged.Error()},
	} {
		if c.e.Stopped() != c.stopped || c.e.Kind != c.kind || c.e.String() != c.text {
			t.Errorf("%+v: stopped %v kind %q text %q, want %v %q %q", c.e, c.e.Stopped(), c.e.Kind, c.e.String(), c.stopped, c.kind, c.text)
		}
		b, err := json.Marshal(struct{ S Early }{c.e})
		if want := fmt.Sprintf(`{"S":%q}`, c.text); err != nil || string(b) != want {
			t.Errorf("%+v: JSON %s (%v), want %s", c.e, b, err, want)
		}
	}
}
