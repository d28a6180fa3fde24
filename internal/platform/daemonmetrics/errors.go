package daemonmetrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors is inboxkeeper_errors_total{table,kind}: the failed attempts of
// every step of a pass that writes (the deleter's and the demoter's batches,
// the partitions' DDL, compaction's moves), by table and kind
// (retry.ErrorKinds). Each step's Metrics registers it on reg: the first
// registers it, the others on the same registry get that one, so that a
// table's failures are one series whichever step failed.
func Errors(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inboxkeeper_errors_total",
		Help: "Errors by kind: lock_timeout, deadlock, statement_timeout, serialization, connection, lock_wait, privilege, fence, other.",
	}, []string{"table", "kind"})
	err := reg.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing
		}
	}
	if err != nil {
		panic(err)
	}
	return c
}
