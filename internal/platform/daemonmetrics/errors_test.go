package daemonmetrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The steps registering inboxkeeper_errors_total on one registry share one
// series per table and kind; on another registry it is another counter.
func TestErrorsShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	deleter, partitions := Errors(reg), Errors(reg)
	deleter.WithLabelValues("public.inbox", "lock_timeout").Inc()
	partitions.WithLabelValues("public.inbox", "lock_timeout").Inc()
	if got := testutil.ToFloat64(deleter.WithLabelValues("public.inbox", "lock_timeout")); got != 2 {
		t.Errorf("the shared series counts %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "inboxkeeper_errors_total"); err != nil || n != 1 {
		t.Errorf("the registry gathers %d series (err %v), want 1", n, err)
	}
	other := Errors(prometheus.NewRegistry())
	if got := testutil.ToFloat64(other.WithLabelValues("public.inbox", "lock_timeout")); got != 0 {
		t.Errorf("another registry's counter starts at %v, want 0", got)
	}
}
