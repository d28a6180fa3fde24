package pass

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/push"
	dto "github.com/prometheus/client_model/go"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/horizon"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/daemonmetrics"
	"github.com/inboxkeeper/inboxkeeper/partitions"
	"github.com/inboxkeeper/inboxkeeper/throttle"
	"github.com/inboxkeeper/inboxkeeper/tiering"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// Metrics is every metric a pass exports, on one private registry: run
// serves it on /metrics, once writes it to a textfile or pushes it. The
// per-table gauges a pass measures are facts, all owned by one Facts.
type Metrics struct {
	Registry   *prometheus.Registry
	Facts      *daemonmetrics.Facts
	Expiry     *expiry.Metrics
	Tiering    *tiering.Metrics
	Partitions *partitions.Metrics
	Daemon     *daemonmetrics.Metrics
	Throttle   *throttle.Metrics // nil until the throttle is started with it
	Horizon    *horizon.Metrics
	Vacuum     *vacuum.Metrics
	Compact    *compact.Metrics
	// Live: the metrics are served while passes run (run's /metrics), not
	// only recorded after a pass (once), so a pass exports rows_due as it
	// begins (expiry.Options.LiveDue).
	Live bool

	reg prometheus.Registerer // where the metrics are registered

	atScrape struct {
		sync.Mutex
		measure func(ctx context.Context)
		last    time.Time
	}
}

// scrapeMeasureEvery bounds how often a scrape measures (MeasureAtScrape):
// two Prometheus servers, or a person with curl, do not double the reads
// of facts that change over minutes.
const scrapeMeasureEvery = 10 * time.Second

// scrapeMeasureTimeout bounds a scrape's measurement, below Prometheus's
// default scrape timeout (10 s): a slow read leaves the facts it did not
// reach as they were.
const scrapeMeasureTimeout = 5 * time.Second

// MeasureAtScrape makes fn measure facts when /metrics is scraped, at most
// once every scrapeMeasureEvery, before the registry is gathered.
func (m *Metrics) MeasureAtScrape(fn func(ctx context.Context)) {
	m.atScrape.Lock()
	defer m.atScrape.Unlock()
	m.atScrape.measure = fn
}

// gather measures what is measured at scrape time, then gathers.
func (m *Metrics) gather() ([]*dto.MetricFamily, error) {
	m.atScrape.Lock()
	if fn := m.atScrape.measure; fn != nil && time.Since(m.atScrape.last) >= scrapeMeasureEvery {
		ctx, cancel := context.WithTimeout(context.Background(), scrapeMeasureTimeout)
		fn(ctx)
		cancel()
		m.atScrape.last = time.Now()
	}
	m.atScrape.Unlock()
	return m.Registry.Gather()
}

// NewMetrics registers every metric on a new registry; process adds the Go
// runtime's and the process's (run's /metrics). version is the build's.
func NewMetrics(process bool, version string) *Metrics {
	reg := prometheus.NewRegistry()
	if process {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := Register(reg, version)
	m.Registry = reg
	return m
}

// Register registers every metric of a pass on reg (metricsinfo describes
// them from here).
func Register(reg prometheus.Registerer, version string) *Metrics {
	facts := daemonmetrics.NewFacts()
	m := &Metrics{Facts: facts, Expiry: expiry.NewMetrics(reg, facts), Tiering: tiering.NewMetrics(reg, facts),
		Partitions: partitions.NewMetrics(reg, facts), Daemon: daemonmetrics.New(reg, facts, version), Horizon: horizon.NewMetrics(reg),
		Vacuum: vacuum.NewMetrics(reg, facts), Compact: compact.NewMetrics(reg, facts), reg: reg}
	// One series each, whichever step measured it (each step registers
	// inboxkeeper_errors_total itself: daemonmetrics.Errors).
	m.Partitions.CleanupLag, m.Partitions.LastSuccess = m.Expiry.CleanupLag, m.Expiry.LastSuccess
	return m
}

// ThrottleMetrics registers the throttle's metrics, for a throttle that
// runs with them.
func (m *Metrics) ThrottleMetrics() *throttle.Metrics {
	if m == nil {
		return nil
	}
	if m.Throttle == nil {
		m.Throttle = throttle.NewMetrics(m.reg)
	}
	return m.Throttle
}

// PolicyLoaded says the policy in force is the file's, loaded now.
func (m *Metrics) PolicyLoaded() {
	m.Daemon.ReloadOK.Set(1)
	m.Daemon.ReloadTime.Set(float64(time.Now().Unix()))
}

// Inactive clears what only the active instance may say: every per-table
// fact, and the xmin horizon's holders. Counters and last-success
// timestamps keep their history.
func (m *Metrics) Inactive() {
	m.Daemon.Active.Set(0)
	m.Facts.Clear()
	m.Horizon.Age.Reset()
}

// PassEnded records a finished pass with its outcome.
func (m *Metrics) PassEnded(outcome string) {
	m.Daemon.Passes.WithLabelValues(outcome).Inc()
	m.Daemon.LastPass.Set(float64(time.Now().Unix()))
}

// results are the facts a deletion pass measured besides deleting.
func (m *Metrics) results() expiry.ResultFacts {
	d := m.Daemon
	return expiry.ResultFacts{RowsProtected: d.RowsProtected, OldestExpiry: d.OldestExpiry, NewestExpiry: d.NewestExpiry,
		BytesPerKey: d.BytesPerKey, PermanentKeys: m.Tiering.RowsDemoted}
}

// retained are the facts of what each table remembers.
func (m *Metrics) retained() expiry.RetainedFacts {
	d := m.Daemon
	return expiry.RetainedFacts{ReplayHorizon: d.ReplayHorizon, PostReceipt: d.PostReceipt, Margin: d.Margin, FirstSeen: d.FirstSeen,
		ScopeExpiry: d.ScopeExpiry, ScopeFirstSeen: d.ScopeFirstSeen, ReplaysBeyond: d.ReplaysBeyond}
}

// Export is once's --metrics-file and --pushgateway: the metrics of the
// pass for a run that serves no /metrics (a CronJob, a systemd timer).
func (m *Metrics) Export(ctx context.Context, file, gateway, instance string) error {
	if file != "" {
		// Written to a temporary file and renamed: the node_exporter's
		// textfile collector never reads half a file.
		if err := prometheus.WriteToTextfile(file, m.Registry); err != nil {
			return fmt.Errorf("--metrics-file %s: %w", file, err)
		}
	}
	if gateway != "" {
		if err := push.New(gateway, "inboxkeeper").Grouping("instance", instance).Gatherer(m.Registry).PushContext(ctx); err != nil {
			return fmt.Errorf("--pushgateway %s: %w", gateway, err)
		}
	}
	return nil
}

// Serve serves the metrics on addr (/metrics, and /livez and /readyz for
// probes) until the returned stop.
func (m *Metrics) Serve(addr string, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.GathererFunc(m.gather), promhttp.HandlerOpts{Registry: m.Registry}))
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }
	mux.HandleFunc("/livez", ok)
	mux.HandleFunc("/readyz", ok)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("INBOXKEEPER_METRICS_ADDR: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	log.Info("inboxkeeper: metrics listening", "addr", l.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
