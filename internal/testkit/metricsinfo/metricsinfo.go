// Package metricsinfo describes every metric the project exports, with its
// type and help text, without running anything: the tests of the alert rules,
// the dashboard and the reference docs read it. Test support, not a library.
package metricsinfo

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// Metric is what a collector describes of one metric.
type Metric struct{ Kind, Help string }

// recorder is a prometheus.Registerer that only writes down what the
// collectors registered on it describe. Like a registry, it hands back
// the collector already registered for an identical descriptor from
// Register (prometheus.AlreadyRegisteredError: daemonmetrics.Errors shares
// it so), and any other name registered twice is an error.
type recorder struct {
	metrics    map[string]Metric
	collectors map[string]prometheus.Collector
	err        error
}

type exported struct{ kind, help string }

var descFields = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*")`)

func (r *recorder) Register(c prometheus.Collector) error {
	return r.register(c, false)
}

func (r *recorder) register(c prometheus.Collector, must bool) error {
	kind := kindOf(c)
	var already error
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := descFields.FindStringSubmatch(d.String())
		if m == nil {
			r.err = errors.Join(r.err, fmt.Errorf("cannot parse %s", d))
			continue
		}
		name, err1 := strconv.Unquote(m[1])
		help, err2 := strconv.Unquote(m[2])
		if err := errors.Join(err1, err2); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("%s: %w", d, err))
			continue
		}
		if prev, dup := r.metrics[name]; dup {
			if !must && prev == (Metric{Kind: kind, Help: help}) {
				already = prometheus.AlreadyRegisteredError{ExistingCollector: r.collectors[name], NewCollector: c}
				continue
			}
			r.err = errors.Join(r.err, fmt.Errorf("%s registered twice", name))
		}
		r.metrics[name] = Metric{Kind: kind, Help: help}
		r.collectors[name] = c
	}
	return already
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.register(c, true)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// kindOf tells the metric type from the collector's Go type. Gauge comes
// before Counter: a gauge has Inc and Add too.
func kindOf(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec, *daemonmetrics.Fact:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	case prometheus.Gauge:
		return "gauge"
	case prometheus.Counter:
		return "counter"
	case prometheus.Histogram:
		return "histogram" // a plain Summary looks the same; the project has none
	}
	return fmt.Sprintf("unknown (%T)", c)
}

// All registers every metric of the project on a recorder: the daemon's
// (a pass's, pass.Register, and the throttle's) and the claim path's
// (inbox, on the consumers' registries), and returns what they describe,
// by name.
func All() (map[string]Metric, error) {
	r := &recorder{metrics: map[string]Metric{}, collectors: map[string]prometheus.Collector{}}
	pass.Register(r, "test")
	throttle.NewMetrics(r)
	inbox.NewMetrics(r)
	if r.err == nil && len(r.metrics) == 0 {
		r.err = errors.New("no metric registered")
	}
	return r.metrics, r.err
}

// Consumer is the claim path's metrics alone: those a consumer registers
// on its own registry (inbox.NewMetrics), which arrive under the
// consumers' jobs and instances, not the daemon's.
func Consumer() (map[string]Metric, error) {
	r := &recorder{metrics: map[string]Metric{}, collectors: map[string]prometheus.Collector{}}
	inbox.NewMetrics(r)
	return r.metrics, r.err
}
