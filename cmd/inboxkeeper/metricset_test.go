package main

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// An instance that stops being the active one clears every per-table gauge
// it measured, found by reflection (rows_due and max_expiry were once left
// off a hand-kept list), and keeps the ones with history.
func TestResetMeasured(t *testing.T) {
	m := newMetricSet(false)
	vecs := gaugeVecs(m.expiry, m.tiering, m.partitions, m.daemon)
	if len(vecs) < 20 {
		t.Fatalf("found %d gauge vectors, want every per-table gauge (20 or more)", len(vecs))
	}
	for _, g := range vecs {
		// One series each, whatever its labels.
		ch := make(chan *prometheus.Desc, 1)
		g.Describe(ch)
		desc := (<-ch).String()
		n := strings.Count(desc[strings.Index(desc, "variableLabels"):], ",") + 1
		labels := make([]string, n)
		for i := range labels {
			labels[i] = "x"
		}
		g.WithLabelValues(labels...).Set(1)
	}
	m.resetMeasured()
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]bool{}
	for _, f := range families {
		if len(f.GetMetric()) > 0 && f.GetType().String() == "GAUGE" && len(f.GetMetric()[0].GetLabel()) > 0 {
			kept[f.GetName()] = true
		}
	}
	for _, name := range []string{"inboxkeeper_last_success_timestamp_seconds", "inboxkeeper_build_info"} {
		if !kept[name] {
			t.Errorf("%s was cleared; it keeps its history", name)
		}
		delete(kept, name)
	}
	for name := range kept {
		t.Errorf("%s still has series after the instance stopped being active", name)
	}
}
