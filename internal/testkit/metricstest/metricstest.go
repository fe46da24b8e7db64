// Package metricstest reads Prometheus metrics in tests without
// prometheus/testutil (which would add a requirement to go.mod).
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
