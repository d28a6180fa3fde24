package batchloop

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLockedRowsStepOver(t *testing.T) {
	cause := errors.New("lock timeout")
	anchor := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	found := func() (time.Time, bool, error) { return anchor, true, nil }

	var l LockedRows
	for i := range MaxLockedSteps {
		held, next, ok, err := l.StepOver(cause, found)
		if err != nil || !ok {
			t.Fatalf("step %d: ok %v, err %v; want a step", i+1, ok, err)
		}
		if !held.Equal(anchor) || !next.Valid || !next.Time.Equal(anchor.Add(time.Microsecond)) {
			t.Fatalf("step %d: held %v, next %v; want the anchor and a microsecond after it", i+1, held, next)
		}
	}
	_, _, ok, err := l.StepOver(cause, func() (time.Time, bool, error) {
		t.Fatal("the held row was looked for after the last step")
		return time.Time{}, false, nil
	})
	if ok || !errors.Is(err, cause) || !strings.Contains(err.Error(), "16 rows held locked") {
		t.Errorf("past the last step: ok %v, err %v; want the lock timeout, saying 16 rows", ok, err)
	}

	var fresh LockedRows
	if _, next, ok, err := fresh.StepOver(cause, func() (time.Time, bool, error) { return time.Time{}, false, nil }); ok || err != nil || next.Valid {
		t.Errorf("no row due any more: ok %v, next %v, err %v; want no step and no error", ok, next, err)
	}
	lookup := errors.New("connection lost")
	if _, _, ok, err := fresh.StepOver(cause, func() (time.Time, bool, error) { return time.Time{}, false, lookup }); ok || !errors.Is(err, lookup) {
		t.Errorf("the lookup failed: ok %v, err %v; want its error", ok, err)
	}
}
