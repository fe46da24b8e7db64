package proxier

import (
	"errors"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/proxy"
)

// The metrics kube-proxy exports, under its names, so that dashboards and
// alerts written for kube-proxy work with a proxier built from the blocks.
// Like kube-proxy's, the per-sync ones carry an ip_family label.
const subsystem = "kubeproxy"

// syncBuckets are kube-proxy's buckets for sync durations, and for those
// of conntrack cleanups: 1ms to 16s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's buckets for network programming
// latency: fine below a minute, coarser up to five.
var programmingBuckets = slices.Concat(
	[]float64{0.25, 0.5},
	prometheus.LinearBuckets(1, 1, 59),
	prometheus.LinearBuckets(60, 5, 12),
	prometheus.LinearBuckets(120, 30, 7),
)

// metrics are the Proxier's metrics, and where its backends register theirs.
type metrics struct {
	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	networkProgramming  *prometheus.HistogramVec
	lastSync            *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	serviceChanges      prometheus.Counter
	endpointChanges     prometheus.Counter
	// backend registers the Backends' own metrics on the same registry.
	backend          *proxy.Metrics
	noLocalEndpoints *prometheus.GaugeVec
	conntrackDeleted *prometheus.CounterVec
	// conntrackDuration times each conntrack cleanup, failed or not.
	conntrackDuration *prometheus.HistogramVec
	// healthzTotal and livezTotal count the proxy health server's
	// answers by status code (healthz.WithProbeCounters).
	healthzTotal, livezTotal *prometheus.CounterVec
	// clientHooksTaken is set when client-go's request metrics are
	// registered but fed by another adapter (RegisterClientMetrics).
	clientHooksTaken bool
}

// newMetrics makes the proxier's metrics and registers them on reg, or on
// no registry when reg is nil. pendingServices and pendingEndpoints are
// read at every scrape, so that the pending-changes gauges are exact
// without the event handlers counting. It fails when reg refuses one (it
// has a metric of that name already).
func newMetrics(reg prometheus.Registerer, pendingServices, pendingEndpoints func() int) (*metrics, error) {
	// The makers of the metrics whose only label is the IP family.
	family := []string{"ip_family"}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}, family)
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem, Name: name, Help: help}, family)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem, Name: name, Help: help}, family)
	}
	m := &metrics{
		syncDuration: histogram("sync_proxy_rules_duration_seconds",
			"How long a sync of the proxy rules took, full or partial, successful or not.", syncBuckets),
		syncFullDuration: histogram("sync_full_proxy_rules_duration_seconds",
			"How long a full sync of the proxy rules took.", syncBuckets),
		syncPartialDuration: histogram("sync_partial_proxy_rules_duration_seconds",
			"How long a partial sync of the proxy rules took.", syncBuckets),
		networkProgramming: histogram("network_programming_duration_seconds",
			"Time from an EndpointSlice change (its last-change-trigger-time) to the rules for it being applied.", programmingBuckets),
		lastSync: gauge("sync_proxy_rules_last_timestamp_seconds",
			"When the proxy rules were last synced successfully, in seconds since the epoch."),
		lastQueued: gauge("sync_proxy_rules_last_queued_timestamp_seconds",
			"When a sync of the proxy rules was last asked for, in seconds since the epoch; far ahead of the last sync means syncs are stuck."),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total",
			Help: "Service events received.",
		}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "EndpointSlice events received.",
		}),
		backend: proxy.NewMetrics(reg),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Service ports with a Local traffic policy whose traffic is dropped because this node has no endpoint for them.",
		}, []string{"ip_family", "traffic_policy"}),
		conntrackDeleted: counter("conntrack_reconciler_deleted_entries_total",
			"Stale conntrack entries deleted after syncs."),
		conntrackDuration: histogram("conntrack_reconciler_sync_duration_seconds",
			"How long a cleanup of stale conntrack entries after a sync took, failed or not.", syncBuckets),
		healthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "proxy_healthz_total",
			Help: "Answers of the proxy health server's /healthz, by HTTP status code.",
		}, []string{"code"}),
		livezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "proxy_livez_total",
			Help: "Answers of the proxy health server's /livez, by HTTP status code.",
		}, []string{"code"}),
	}
	if reg == nil {
		return m, nil
	}
	collectors := []prometheus.Collector{
		m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.networkProgramming,
		m.lastSync, m.lastQueued, m.serviceChanges, m.endpointChanges,
		m.noLocalEndpoints, m.conntrackDeleted, m.conntrackDuration,
		m.healthzTotal, m.livezTotal,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Services with a change not yet synced.",
		}, func() float64 { return float64(pendingServices()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Services whose endpoints have a change not yet synced.",
		}, func() float64 { return float64(pendingEndpoints()) }),
	}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			// None or all: a Proxier that failed to start leaves reg as
			// it was, so that another can register there.
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("registering the proxier's metrics: %w", err)
		}
	}
	// client-go's request metrics, which kube-proxy serves beside its own.
	if err := RegisterClientMetrics(reg); err != nil {
		if !errors.Is(err, ErrClientMetricsHooksTaken) {
			for _, done := range collectors {
				reg.Unregister(done)
			}
			return nil, err
		}
		m.clientHooksTaken = true
	}
	return m, nil
}
