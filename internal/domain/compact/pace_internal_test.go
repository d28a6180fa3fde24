package compact

import (
	"testing"
	"time"
)

// Ten seconds the moves spent held (by the throttle, say) are no credit:
// after one portion's burst the pace makes the next batch wait again.
// Without the cap the pace owed them ten seconds of WAL, written back to
// back.
func TestWALPaceNoCreditForAHold(t *testing.T) {
	t.Parallel()
	const rate = 1 << 20
	p := &walPace{rate: rate, began: time.Now().Add(-10 * time.Second), spent: rate} // one second's WAL in ten
	if d := p.pause(); d > 0 || d < -walPortion-time.Second {
		t.Errorf("pause after the hold = %s, want none (at most one portion owed)", d)
	}
	p.wrote(2*rate*walPortion.Seconds(), 1) // a batch of two portions
	if d := p.pause(); d < walPortion/2 {
		t.Errorf("pause after two portions' WAL = %s, want about one portion (%s): the hold was taken as credit", d, walPortion)
	}
	if d := (&walPace{}).pause(); d != 0 {
		t.Errorf("no rate: pause %s", d)
	}
}
