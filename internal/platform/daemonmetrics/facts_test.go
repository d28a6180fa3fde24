package daemonmetrics

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series lists what reg exports, one "name{label=value,...} value" per
// sample (labels in name order), sorted.
func series(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", f.GetName(), strings.Join(labels, ","), m.GetGauge().GetValue()))
		}
	}
	slices.Sort(out)
	return out
}

func TestFacts(t *testing.T) {
	reg := prometheus.NewRegistry()
	facts := NewFacts()
	due := facts.Gauge(reg, "t_rows_due", "Rows due.", "table")
	count := facts.Gauge(reg, "t_partitions", "Partitions by state.", "table", "state")
	history := GaugeVec(reg, "t_last_success", "Not a fact: history.", "table")

	due.Set(5, "a")
	due.Set(7, "b")
	due.Set(6, "a") // replaces
	count.Set(3, "a", "attached")
	count.Set(1, "b", "detached")
	history.WithLabelValues("a").Set(100)
	want := []string{"t_last_success{table=a} 100", "t_partitions{state=attached,table=a} 3", "t_partitions{state=detached,table=b} 1", "t_rows_due{table=a} 6", "t_rows_due{table=b} 7"}
	if got := series(t, reg); !slices.Equal(got, want) {
		t.Fatalf("exported\n%q\nwant\n%q", got, want)
	}

	// A policy that no longer names b: every fact of b goes, history stays.
	facts.KeepTables(func(table string) bool { return table == "a" })
	want = []string{"t_last_success{table=a} 100", "t_partitions{state=attached,table=a} 3", "t_rows_due{table=a} 6"}
	if got := series(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after KeepTables(a)\n%q\nwant\n%q", got, want)
	}

	count.Delete("a", "attached")
	want = []string{"t_last_success{table=a} 100", "t_rows_due{table=a} 6"}
	if got := series(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after Delete\n%q\nwant\n%q", got, want)
	}

	// No longer the active instance: every fact goes.
	count.Set(2, "a", "detached")
	facts.Clear()
	want = []string{"t_last_success{table=a} 100"}
	if got := series(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after Clear\n%q\nwant\n%q", got, want)
	}
}

// A wrong number of label values is a programming error, as with a
// GaugeVec; a fact whose first label is not the table cannot be made.
func TestFactMisuse(t *testing.T) {
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	facts := NewFacts()
	g := facts.Gauge(prometheus.NewRegistry(), "t_x", "x", "table", "tier")
	panics("Set with one label of two", func() { g.Set(1, "a") })
	panics("Delete with three labels of two", func() { g.Delete("a", "b", "c") })
	panics("a fact without a table label", func() { facts.Gauge(prometheus.NewRegistry(), "t_y", "y", "replica") })
}
