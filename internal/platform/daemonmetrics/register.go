package daemonmetrics

import "github.com/prometheus/client_golang/prometheus"

// The constructors below make one metric and register it on reg at once,
// for the Metrics structs of every package: a metric cannot be made and
// left unregistered, and each reads as its name, help text and labels.

// CounterVec makes and registers a counter with labels.
func CounterVec(reg prometheus.Registerer, name, help string, labels ...string) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// GaugeVec makes and registers a gauge with labels.
func GaugeVec(reg prometheus.Registerer, name, help string, labels ...string) *prometheus.GaugeVec {
	return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// HistogramVec makes and registers a histogram with labels.
func HistogramVec(reg prometheus.Registerer, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}

// Counter makes and registers a counter without labels.
func Counter(reg prometheus.Registerer, name, help string) prometheus.Counter {
	return register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// Gauge makes and registers a gauge without labels.
func Gauge(reg prometheus.Registerer, name, help string) prometheus.Gauge {
	return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	reg.MustRegister(c)
	return c
}
