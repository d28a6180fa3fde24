package daemonmetrics

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Facts owns every per-table gauge a pass measures (rows due, cleanup lag,
// retained range, partitions by state, tier sizes...): what this instance
// last saw of a table, as opposed to history (counters, last-success
// timestamps), which stays in ordinary metrics.
//
// A measured fact is only true of the instance that measured it, and only
// of a table the policy still names. So the daemon clears them all at once
// when it finds it is no longer the active instance (Clear), and drops
// every table the policy no longer names when it loads a policy
// (KeepTables): no hand-kept list of gauges to reset, and no series left
// behind by a table taken out of the policy on a reload.
//
// Each family is a prometheus.Collector of its own that exports the samples
// it holds as constant gauges when scraped.
type Facts struct {
	mu       sync.Mutex
	families []*Fact
}

// NewFacts returns an owner with no families yet.
func NewFacts() *Facts { return &Facts{} }

// Fact is one gauge family of Facts. Its first label is the table.
type Fact struct {
	owner   *Facts
	desc    *prometheus.Desc
	labels  int
	samples map[string]sample
}

type sample struct {
	labels []string
	value  float64
}

// Gauge makes a fact family and registers it on reg. Its first label must
// be "table". On a nil Facts the family has an owner of its own (a
// benchmark or a test that registers one package's metrics alone).
func (f *Facts) Gauge(reg prometheus.Registerer, name, help string, labels ...string) *Fact {
	if len(labels) == 0 || labels[0] != "table" {
		panic(fmt.Sprintf("daemonmetrics: fact %s: the first label must be table, not %q", name, labels))
	}
	if f == nil {
		f = NewFacts()
	}
	g := &Fact{owner: f, desc: prometheus.NewDesc(name, help, labels, nil), labels: len(labels), samples: map[string]sample{}}
	f.mu.Lock()
	f.families = append(f.families, g)
	f.mu.Unlock()
	return register(reg, g)
}

// Clear drops every sample of every family.
func (f *Facts) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.families {
		clear(g.samples)
	}
}

// KeepTables drops the samples of every table for which keep is false.
func (f *Facts) KeepTables(keep func(table string) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.families {
		for k, s := range g.samples {
			if !keep(s.labels[0]) {
				delete(g.samples, k)
			}
		}
	}
}

// Set records the value measured for one combination of labels, the table
// first.
func (g *Fact) Set(v float64, labels ...string) {
	key := g.key(labels)
	g.owner.mu.Lock()
	defer g.owner.mu.Unlock()
	g.samples[key] = sample{labels: slices.Clone(labels), value: v}
}

// Delete forgets one combination of labels: the fact is no longer known.
func (g *Fact) Delete(labels ...string) {
	key := g.key(labels)
	g.owner.mu.Lock()
	defer g.owner.mu.Unlock()
	delete(g.samples, key)
}

// Reset forgets every sample of this family (before it is measured again
// in full).
func (g *Fact) Reset() {
	g.owner.mu.Lock()
	defer g.owner.mu.Unlock()
	clear(g.samples)
}

// Value is the value recorded for one combination of labels; 0 when none
// is (as a GaugeVec reads a series it has not set).
func (g *Fact) Value(labels ...string) float64 {
	key := g.key(labels)
	g.owner.mu.Lock()
	defer g.owner.mu.Unlock()
	return g.samples[key].value
}

func (g *Fact) key(labels []string) string {
	if len(labels) != g.labels {
		// A programming error, as with a GaugeVec.
		panic(fmt.Sprintf("daemonmetrics: %s takes %d label values, got %d", g.desc, g.labels, len(labels)))
	}
	return strings.Join(labels, "\xff")
}

// Describe is part of prometheus.Collector.
func (g *Fact) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

// Collect is part of prometheus.Collector.
func (g *Fact) Collect(ch chan<- prometheus.Metric) {
	g.owner.mu.Lock()
	out := make([]prometheus.Metric, 0, len(g.samples))
	for _, s := range g.samples {
		out = append(out, prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, s.value, s.labels...))
	}
	g.owner.mu.Unlock()
	for _, m := range out {
		ch <- m
	}
}
