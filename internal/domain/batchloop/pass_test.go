package batchloop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

type passResult struct {
	table string
	Outcome
}

// A table whose batch a session queued behind ends the pass there: its
// result says it stopped early at a lock wait, with no error, and the
// tables after it wait for the next pass. Another table's error is its own
// and the pass goes on; a context ended before a table stops the pass with
// the context's error.
func TestPassStopsAtALockWait(t *testing.T) {
	t.Parallel()
	deadline := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	failed := errors.New("relation does not exist")
	errs := map[string]error{"b": failed, "c": fmt.Errorf("batch 3: %w", retry.ErrLockWait)}
	var ran []string
	run := func(_ context.Context, table string, d time.Time) passResult {
		if !d.Equal(deadline) {
			t.Errorf("table %s ran with deadline %s, want the pass's %s", table, d, deadline)
		}
		ran = append(ran, table)
		return passResult{table: table, Outcome: Outcome{Err: errs[table]}}
	}
	out, err := Pass(context.Background(), []string{"a", "b", "c", "d"}, deadline, run)
	if err != nil || !slices.Equal(ran, []string{"a", "b", "c"}) || len(out) != 3 {
		t.Fatalf("ran %v, %d results, error %v; want a, b and c, no error", ran, len(out), err)
	}
	if out[1].Err != failed || out[1].StoppedEarly != (retry.Early{}) {
		t.Errorf("b's outcome %+v, want its own error", out[1].Outcome)
	}
	if out[2].Err != nil || out[2].StoppedEarly != retry.AtLockWait {
		t.Errorf("c's outcome %+v, want stopped early at the lock wait, no error", out[2].Outcome)
	}

	ctx, cancel := context.WithCancel(context.Background())
	ran = nil
	out, err = Pass(ctx, []string{"a", "b"}, deadline, func(ctx context.Context, table string, d time.Time) passResult {
		cancel()
		return run(ctx, table, d)
	})
	if !errors.Is(err, context.Canceled) || !slices.Equal(ran, []string{"a"}) || len(out) != 1 {
		t.Errorf("ran %v, %d results, error %v after the context ended in a; want a alone and context.Canceled", ran, len(out), err)
	}
}
