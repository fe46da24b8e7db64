package proxy_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/proxy"
)

// TestMetrics checks that a name is registered once, that later requests
// of it get the same vector, and that requests that cannot be that vector
// fail with the name.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := proxy.NewMetrics(reg)
	opts := prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "x_total", Help: "x"}
	a, err := m.CounterVec(opts, []string{"ip_family"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.CounterVec(opts, []string{"ip_family"})
	if err != nil || a != b {
		t.Fatalf("second request: %v, same vector %v; want the first one", err, a == b)
	}
	a.WithLabelValues("IPv4").Inc()
	families, err := reg.Gather()
	if err != nil || len(families) != 1 || families[0].GetName() != "kubeproxy_x_total" {
		t.Fatalf("gathered %v, %v; want kubeproxy_x_total once", families, err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want string
	}{
		{"other labels", func() error { _, err := m.CounterVec(opts, []string{"table"}); return err }, "labels"},
		{"another kind", func() error {
			_, err := m.GaugeVec(prometheus.GaugeOpts{Subsystem: proxy.MetricsSubsystem, Name: "x_total"}, []string{"ip_family"})
			return err
		}, "another kind"},
		{"registered by another collector", func() error {
			other := prometheus.NewCounter(prometheus.CounterOpts{Name: "kubeproxy_y_total", Help: "y"})
			reg.MustRegister(other)
			_, err := m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "y_total", Help: "y"}, nil)
			return err
		}, "kubeproxy_y_total"},
	} {
		if err := tc.do(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// A nil Metrics makes working vectors that are registered nowhere.
	var none *proxy.Metrics
	h, err := none.HistogramVec(prometheus.HistogramOpts{Name: "h"}, []string{"l"})
	if err != nil || h == nil {
		t.Fatalf("nil Metrics: %v, %v", h, err)
	}
	h.WithLabelValues("v").Observe(1)
}

// TestMetricsCollector checks that Collector registers the first
// collector of a name and drops later ones, refuses a name a vector has,
// and does nothing on a nil Metrics.
func TestMetricsCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := proxy.NewMetrics(reg)
	gauge := func(v float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kernel_value", Help: "h"}, func() float64 { return v })
	}
	for _, v := range []float64{1, 2} {
		if err := m.Collector("kernel_value", gauge(v)); err != nil {
			t.Fatalf("Collector %v: %v", v, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("gathered %v, want kernel_value 1 alone (the first collector)", families)
	}
	if _, err := m.CounterVec(prometheus.CounterOpts{Name: "kernel_value", Help: "h"}, nil); err == nil {
		t.Error("a counter vector of the collector's name: no error")
	}
	if err := (*proxy.Metrics)(nil).Collector("kernel_value", gauge(3)); err != nil {
		t.Errorf("nil Metrics: %v", err)
	}
}
