package pass

import (
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
)

// An instance that stops being the active one clears every per-table gauge
// it measured, and the xmin horizon's holders (rows_due and max_expiry were once left off a hand-kept list
// of gauges to reset): they are all facts of one daemonmetrics.Facts, and a
// per-table gauge of any other kind must be one that keeps its history.
func TestMeasuredGaugesAreFacts(t *testing.T) {
	m := NewMetrics(false, "test")
	history := map[string]bool{"inboxkeeper_last_success_timestamp_seconds": true, "inboxkeeper_build_info": true}
	facts := 0
	for _, s := range []any{m.Expiry, m.Tiering, m.Partitions, m.Daemon} {
		v := reflect.ValueOf(s).Elem()
		for i := range v.NumField() {
			var c prometheus.Collector
			switch f := v.Field(i).Interface().(type) {
			case *daemonmetrics.Fact:
				facts++
				c = f
			case *prometheus.GaugeVec:
				c = f
			default:
				continue
			}
			name := describe(c)
			if _, isFact := c.(*daemonmetrics.Fact); !isFact && !history[name] {
				t.Errorf("%s.%s (%s) is a per-table GaugeVec that Facts does not own: make it a daemonmetrics.Fact, or list it here if it keeps its history", v.Type(), v.Type().Field(i).Name, name)
			}
			// One series each, whatever its labels.
			n := strings.Count(describeLabels(c), ",") + 1
			labels := make([]string, n)
			for j := range labels {
				labels[j] = "x"
			}
			switch g := c.(type) {
			case *daemonmetrics.Fact:
				g.Set(1, labels...)
			case *prometheus.GaugeVec:
				g.WithLabelValues(labels...).Set(1)
			}
		}
	}
	if facts < 20 {
		t.Fatalf("found %d facts, want every per-table gauge a pass measures (20 or more)", facts)
	}
	m.Horizon.Age.WithLabelValues("backend").Set(1)
	m.Inactive()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetType().String() != "GAUGE" || len(f.GetMetric()) == 0 || len(f.GetMetric()[0].GetLabel()) == 0 {
			continue
		}
		if !history[f.GetName()] {
			t.Errorf("%s still has series after the instance stopped being active", f.GetName())
		}
		delete(history, f.GetName())
	}
	for name := range history {
		t.Errorf("%s was cleared; it keeps its history", name)
	}
}

func describeDesc(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 1)
	c.Describe(ch)
	return (<-ch).String()
}

// describe is the name of the one metric c describes.
func describe(c prometheus.Collector) string {
	d := describeDesc(c)
	d = d[strings.Index(d, `fqName: "`)+len(`fqName: "`):]
	return d[:strings.Index(d, `"`)]
}

// describeLabels is the variable labels part of c's description.
func describeLabels(c prometheus.Collector) string {
	d := describeDesc(c)
	return d[strings.Index(d, "variableLabels"):]
}
