package pass

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
)

type fake struct {
	name     string
	results  []TableResult
	err      error
	ran      *[]string
	deadline *time.Time
}

func (f fake) Name() string { return f.name }

func (f fake) Run(_ context.Context, deadline time.Time) ([]TableResult, error) {
	*f.ran = append(*f.ran, f.name)
	*f.deadline = deadline
	return f.results, f.err
}

func TestRunner(t *testing.T) {
	t.Parallel()
	var ran, told []string
	var d1, d2 time.Time
	ok := TableResult{Table: "a"}
	early := TableResult{Table: "b", StoppedEarly: retry.AtRunTime}
	failed := TableResult{Table: "c", Err: errors.New("boom")}
	r := Runner{
		Stages:     []Stage{fake{"one", []TableResult{ok}, nil, &ran, &d1}, fake{"two", []TableResult{early, failed}, nil, &ran, &d2}},
		RunTime:    time.Hour,
		AfterStage: func(stage string, rs []TableResult) { told = append(told, stage) },
	}
	res, err := r.Run(context.Background())
	if err != nil || len(ran) != 2 || ran[0] != "one" || len(told) != 2 {
		t.Fatalf("ran %v, told %v, err %v", ran, told, err)
	}
	if d1.IsZero() || !d1.Equal(d2) || time.Until(d1) < 59*time.Minute {
		t.Errorf("the stages got deadlines %v and %v, want one, RUN_TIME from the start", d1, d2)
	}
	if f, e, n := res.Counts(); f != 1 || e != 1 || n != 3 || res.Outcome() != daemonmetrics.PassPartial {
		t.Errorf("counts %d %d %d, outcome %s", f, e, n, res.Outcome())
	}

	// A stage that ends the pass (ctx) stops the stages after it.
	ran = nil
	r.Stages[0] = fake{"one", nil, context.Canceled, &ran, &d1}
	if _, err := r.Run(context.Background()); !errors.Is(err, context.Canceled) || len(ran) != 1 {
		t.Errorf("after an interrupted stage: ran %v, err %v", ran, err)
	}

	if (Result{Tables: []TableResult{failed}}).Outcome() != daemonmetrics.PassFailed || (Result{Tables: []TableResult{ok}}).Outcome() != daemonmetrics.PassOK {
		t.Error("outcomes wrong")
	}
	if got := Of[string]([]TableResult{{Detail: "x"}, {Detail: 1}}); len(got) != 1 || got[0] != "x" {
		t.Errorf("Of = %v", got)
	}
}
