package pass

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
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

// The stages ask the lease before the settings watch: a lost lease is the
// reason a pass stops even when the settings changed too.
func TestBoth(t *testing.T) {
	t.Parallel()
	lost := errors.New("lease lost")
	var watched int
	watch := func() error { watched++; return retry.ErrSettingsChanged }
	if err := both(func() error { return lost }, watch)(); !errors.Is(err, lost) || watched != 0 {
		t.Errorf("a lost lease: %v, the watch asked %d times", err, watched)
	}
	if err := both(nil, watch)(); !errors.Is(err, retry.ErrSettingsChanged) || watched != 1 {
		t.Errorf("no lease (a dry run): %v, the watch asked %d times", err, watched)
	}
}

// A table's own RUN_TIME bounds its stage within the pass's; one equal to
// the pass's, or none, leaves the stage as it is.
func TestLimit(t *testing.T) {
	t.Parallel()
	var ran []string
	var got time.Time
	s := fake{"expiry", nil, nil, &ran, &got}
	deadline := time.Now().Add(time.Hour)
	for _, own := range []time.Duration{0, time.Hour} {
		if _, err := limit(s, own, time.Hour).Run(context.Background(), deadline); err != nil || !got.Equal(deadline) {
			t.Errorf("a RUN_TIME of its own of %s: the stage got %s (%v), want the pass's deadline", own, got, err)
		}
	}
	if _, err := limit(s, time.Minute, time.Hour).Run(context.Background(), deadline); err != nil {
		t.Fatal(err)
	}
	if until := time.Until(got); until > time.Minute || until < 50*time.Second {
		t.Errorf("the table's stage got %s, want its own minute", until)
	}
}

// The configuration accepts exactly the strategies the deleter knows.
func TestExpiryStrategiesInStep(t *testing.T) {
	var known []string
	for _, s := range expiry.Strategies {
		known = append(known, string(s))
	}
	if !slices.Equal(known, config.ExpiryStrategies) {
		t.Errorf("INBOXKEEPER_EXPIRY_STRATEGY accepts %v, the deleter knows %v", config.ExpiryStrategies, known)
	}
}
