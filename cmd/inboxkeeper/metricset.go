package main

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/push"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// metricSet is every metric a pass exports, on one private registry: run
// serves it on /metrics, once writes it to a textfile or pushes it.
type metricSet struct {
	reg        *prometheus.Registry
	expiry     *expiry.Metrics
	tiering    *tiering.Metrics
	partitions *partitions.Metrics
	daemon     *daemonmetrics.Metrics
}

func newMetricSet(process bool) *metricSet {
	reg := prometheus.NewRegistry()
	if process {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := &metricSet{reg: reg, expiry: expiry.NewMetrics(reg), tiering: tiering.NewMetrics(reg), partitions: partitions.NewMetrics(reg),
		daemon: daemonmetrics.New(reg, buildVersion())}
	// One series each, whichever step measured it.
	m.partitions.Errors, m.partitions.CleanupLag, m.partitions.LastSuccess = m.expiry.Errors, m.expiry.CleanupLag, m.expiry.LastSuccess
	return m
}

// resetMeasured clears every per-table gauge of the set except the ones
// that keep their history (the last-success timestamps, the build info):
// what a pass measured, an instance that is no longer active must not go on
// exporting beside the active one's. The gauges are found by reflection, so
// a new one is cleared unless it is kept here on purpose.
func (m *metricSet) resetMeasured() {
	keep := map[*prometheus.GaugeVec]bool{m.expiry.LastSuccess: true, m.partitions.LastSuccess: true, m.daemon.BuildInfo: true}
	for _, g := range gaugeVecs(m.expiry, m.tiering, m.partitions, m.daemon) {
		if !keep[g] {
			g.Reset()
		}
	}
}

// gaugeVecs lists the *prometheus.GaugeVec fields of the given structs.
func gaugeVecs(structs ...any) []*prometheus.GaugeVec {
	var out []*prometheus.GaugeVec
	for _, s := range structs {
		v := reflect.ValueOf(s).Elem()
		for i := range v.NumField() {
			if f := v.Field(i); !f.CanInterface() {
				continue
			} else if g, ok := f.Interface().(*prometheus.GaugeVec); ok && g != nil {
				out = append(out, g)
			}
		}
	}
	return out
}

// passEnded records a finished pass.
func (m *metricSet) passEnded(res pass.Result) {
	m.daemon.Passes.WithLabelValues(res.Outcome()).Inc()
	m.daemon.LastPass.Set(float64(time.Now().Unix()))
}

// export is once's --metrics-file and --pushgateway: the metrics of the pass
// for a run that serves no /metrics (a CronJob, a systemd timer).
func (m *metricSet) export(ctx context.Context, file, gateway, instance string) error {
	if file != "" {
		// Written to a temporary file and renamed: the node_exporter's
		// textfile collector never reads half a file.
		if err := prometheus.WriteToTextfile(file, m.reg); err != nil {
			return fmt.Errorf("--metrics-file %s: %w", file, err)
		}
	}
	if gateway != "" {
		if err := push.New(gateway, "inboxkeeper").Grouping("instance", instance).Gatherer(m.reg).PushContext(ctx); err != nil {
			return fmt.Errorf("--pushgateway %s: %w", gateway, err)
		}
	}
	return nil
}

// instanceName names this process's series at a Pushgateway.
func instanceName() string {
	host, err := os.Hostname()
	if err != nil {
		return "inboxkeeper"
	}
	return host
}
