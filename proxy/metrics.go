package proxy

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricsSubsystem is the subsystem of kube-proxy's metrics
// ("kubeproxy_..."), for a Backend's own metrics under kube-proxy's names.
const MetricsSubsystem = "kubeproxy"

// Metrics is where a Backend registers metrics of its own (a mode's
// failure counters, say) beside the composition's, on the registerer the
// composition was given. A metric is registered once per name: two
// Backends of one mode (one per IP family) that ask for the same name get
// the same vector, and tell their series apart by their labels, as
// kube-proxy's ip_family label does.
//
// A nil *Metrics is valid: its vectors work but are registered nowhere,
// for a Backend made without a composition. Metrics is safe for concurrent
// use.
type Metrics struct {
	reg  prometheus.Registerer
	mu   sync.Mutex
	vecs map[string]registered
}

// registered is a vector made by a Metrics, with its label names.
type registered struct {
	vec    prometheus.Collector
	labels []string
}

// NewMetrics returns a Metrics that registers on reg; nil registers
// nowhere.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return &Metrics{reg: reg, vecs: map[string]registered{}}
}

// CounterVec returns the counter vector of opts and labels, made and
// registered at its first request; a later request of the same name gets
// the same vector (its help is the first request's). It fails when an
// earlier request made that name as another kind of metric or with other
// label names, or the registerer refuses it (it holds another metric of
// that name, say).
func (m *Metrics) CounterVec(opts prometheus.CounterOpts, labels []string) (*prometheus.CounterVec, error) {
	return vec(m, prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), labels, func() *prometheus.CounterVec {
		return prometheus.NewCounterVec(opts, labels)
	})
}

// GaugeVec is CounterVec for a gauge.
func (m *Metrics) GaugeVec(opts prometheus.GaugeOpts, labels []string) (*prometheus.GaugeVec, error) {
	return vec(m, prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), labels, func() *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(opts, labels)
	})
}

// HistogramVec is CounterVec for a histogram.
func (m *Metrics) HistogramVec(opts prometheus.HistogramOpts, labels []string) (*prometheus.HistogramVec, error) {
	return vec(m, prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), labels, func() *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(opts, labels)
	})
}

// Collector registers c, which collects the metric named name (its full
// name) alone, at the first request of that name; a later request of the
// same name does nothing (c is dropped), so that two Backends of one mode
// that export one value the kernel keeps for both families register it
// once. It fails when an earlier request made that name as a vector, or
// the registerer refuses c. On a nil *Metrics it does nothing.
func (m *Metrics) Collector(name string, c prometheus.Collector) error {
	if m == nil {
		return nil
	}
	_, err := vec(m, name, nil, func() prometheus.Collector { return c })
	return err
}

func vec[V prometheus.Collector](m *Metrics, name string, labels []string, newVec func() V) (V, error) {
	var zero V
	if m == nil {
		return newVec(), nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vecs == nil {
		m.vecs = map[string]registered{}
	}
	if r, ok := m.vecs[name]; ok {
		v, ok := r.vec.(V)
		if !ok {
			return zero, fmt.Errorf("proxy: metric %s is registered as another kind", name)
		}
		if !slices.Equal(r.labels, labels) {
			return zero, fmt.Errorf("proxy: metric %s is registered with labels %q, not %q", name, r.labels, labels)
		}
		return v, nil
	}
	v := newVec()
	if m.reg != nil {
		if err := m.reg.Register(v); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				err = fmt.Errorf("another collector already has it: %w", err)
			}
			return zero, fmt.Errorf("proxy: registering metric %s: %w", name, err)
		}
	}
	m.vecs[name] = registered{vec: v, labels: slices.Clone(labels)}
	return v, nil
}
