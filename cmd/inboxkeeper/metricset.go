package main

import (
	"context"
	"fmt"
	"os"
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
// serves it on /metrics, once writes it to a textfile or pushes it. The
// per-table gauges a pass measures are facts, all owned by one Facts.
type metricSet struct {
	reg        *prometheus.Registry
	facts      *daemonmetrics.Facts
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
	facts := daemonmetrics.NewFacts()
	m := &metricSet{reg: reg, facts: facts, expiry: expiry.NewMetrics(reg, facts), tiering: tiering.NewMetrics(reg, facts),
		partitions: partitions.NewMetrics(reg, facts), daemon: daemonmetrics.New(reg, facts, buildVersion())}
	// One series each, whichever step measured it.
	m.partitions.Errors, m.partitions.CleanupLag, m.partitions.LastSuccess = m.expiry.Errors, m.expiry.CleanupLag, m.expiry.LastSuccess
	return m
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
