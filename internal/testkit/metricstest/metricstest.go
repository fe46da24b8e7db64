// Package metricstest reads Prometheus metrics in tests without
// prometheus/testutil (which would add a requirement to go.mod).
package metricstest

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/proxy"
)

// CounterValue returns the value of v's one series, or 0 if it has none
// (or more than one). It registers v on a registry of its own, so v must
// not be registered on another Gatherer the test reads at the same time.
func CounterValue(t testing.TB, v *prometheus.CounterVec) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(v); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// Registry is a proxy.Metrics on a registry of its own, whose values a
// test reads by name.
type Registry struct {
	*proxy.Metrics
	reg *prometheus.Registry
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	reg := prometheus.NewRegistry()
	return &Registry{Metrics: proxy.NewMetrics(reg), reg: reg}
}

// Value returns the sum of the counter or gauge series of the metric
// named name (its full name, kubeproxy_...), or 0 when it has none.
func (r *Registry) Value(t testing.TB, name string) float64 {
	t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Series returns the counter or gauge value of each series of the metric
// named name, keyed by its labels as "name=value" joined with commas in
// the registry's (sorted) order; an empty map when it has none.
func (r *Registry) Series(t testing.TB, name string) map[string]float64 {
	t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[strings.Join(labels, ",")] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return got
}
