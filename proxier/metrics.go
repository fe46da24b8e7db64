package proxier

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics kube-proxy exports, under its names, so that dashboards and
// alerts written for kube-proxy work with a proxier built from the blocks.
// Like kube-proxy's, the per-sync ones carry an ip_family label.
const subsystem = "kubeproxy"

// syncBuckets are kube-proxy's buckets for sync durations: 1ms to 16s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's buckets for network programming
// latency: fine below a minute, coarser up to five.
var programmingBuckets = slices.Concat(
	[]float64{0.25, 0.5},
	prometheus.LinearBuckets(1, 1, 59),
	prometheus.LinearBuckets(60, 5, 12),
	prometheus.LinearBuckets(120, 30, 7),
)

// metrics are the Proxier's metrics and its backends' (backend).
type metrics struct {
	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	networkProgramming  *prometheus.HistogramVec
	lastSync            *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	serviceChanges      prometheus.Counter
	endpointChanges     prometheus.Counter
	backend             BackendMetrics
	noLocalEndpoints    *prometheus.GaugeVec
	conntrackDeleted    *prometheus.CounterVec
}

// newMetrics makes the proxier's metrics and registers them on reg, or on
// no registry when reg is nil. pendingServices and pendingEndpoints are
// read at every scrape, so that the pending-changes gauges are exact
// without the event handlers counting. It fails when reg refuses one (it
// has a metric of that name already).
func newMetrics(reg prometheus.Registerer, pendingServices, pendingEndpoints func() int) (*metrics, error) {
	family := []string{"ip_family"}
	m := &metrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_duration_seconds",
			Help:    "How long a sync of the proxy rules took, full or partial, successful or not.",
			Buckets: syncBuckets,
		}, family),
		syncFullDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem, Name: "sync_full_proxy_rules_duration_seconds",
			Help:    "How long a full sync of the proxy rules took.",
			Buckets: syncBuckets,
		}, family),
		syncPartialDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem, Name: "sync_partial_proxy_rules_duration_seconds",
			Help:    "How long a partial sync of the proxy rules took.",
			Buckets: syncBuckets,
		}, family),
		networkProgramming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem, Name: "network_programming_duration_seconds",
			Help:    "Time from an EndpointSlice change (its last-change-trigger-time) to the rules for it being applied.",
			Buckets: programmingBuckets,
		}, family),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "When the proxy rules were last synced successfully, in seconds since the epoch.",
		}, family),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "When a sync of the proxy rules was last asked for, in seconds since the epoch; far ahead of the last sync means syncs are stuck.",
		}, family),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total",
			Help: "Service events received.",
		}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "EndpointSlice events received.",
		}),
		backend: BackendMetrics{RestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
			Help: "iptables-restore runs that failed.",
		}, family),
			PartialRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
				Subsystem: subsystem, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
				Help: "iptables-restore runs of partial syncs that failed (the next sync is full).",
			}, family),
			DriftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
				Subsystem: subsystem, Name: "sync_proxy_rules_iptables_drift_repairs_total",
				Help: "Checks that found the top-level iptables chains different from what was applied, each followed by a full sync (a proxykit metric; kube-proxy has none).",
			}, family),
			NFTablesSyncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
				Subsystem: subsystem, Name: "sync_proxy_rules_nftables_sync_failures_total",
				Help: "nftables transactions that failed (the next sync is full).",
			}, family),
			NFTablesCleanupFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
				Subsystem: subsystem, Name: "sync_proxy_rules_nftables_cleanup_failures_total",
				Help: "Failed nftables transactions that were deleting stale chains, which therefore stay until a later sync deletes them.",
			}, family)},
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Service ports with a Local traffic policy whose traffic is dropped because this node has no endpoint for them.",
		}, []string{"ip_family", "traffic_policy"}),
		conntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Stale conntrack entries deleted after syncs.",
		}, family),
	}
	if reg == nil {
		return m, nil
	}
	collectors := []prometheus.Collector{
		m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.networkProgramming,
		m.lastSync, m.lastQueued, m.serviceChanges, m.endpointChanges,
		m.backend.RestoreFailures, m.backend.PartialRestoreFailures, m.backend.DriftRepairs,
		m.backend.NFTablesSyncFailures, m.backend.NFTablesCleanupFailures,
		m.noLocalEndpoints, m.conntrackDeleted,
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
	return m, nil
}
