package main

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
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

type metrics struct {
	registry *prometheus.Registry

	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	networkProgramming  *prometheus.HistogramVec
	lastSync            *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	serviceChanges      prometheus.Counter
	endpointChanges     prometheus.Counter
	restoreFailures     *prometheus.CounterVec
	partialFailures     *prometheus.CounterVec
	driftRepairs        *prometheus.CounterVec
	noLocalEndpoints    *prometheus.GaugeVec
	conntrackDeleted    *prometheus.CounterVec
}

// newMetrics registers the proxier's metrics, with the process and Go
// runtime ones, in a registry of their own. pendingServices and
// pendingEndpoints are read at every scrape, so that the pending-changes
// gauges are exact without the event handlers counting.
func newMetrics(pendingServices, pendingEndpoints func() int) *metrics {
	family := []string{"ip_family"}
	m := &metrics{
		registry: prometheus.NewRegistry(),
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
		restoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
			Help: "iptables-restore runs that failed.",
		}, family),
		partialFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
			Help: "iptables-restore runs of partial syncs that failed (the next sync is full).",
		}, family),
		driftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_iptables_drift_repairs_total",
			Help: "Checks that found the top-level iptables chains different from what was applied, each followed by a full sync (a proxykit metric; kube-proxy has none).",
		}, family),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Service ports with a Local traffic policy whose traffic is dropped because this node has no endpoint for them.",
		}, []string{"ip_family", "traffic_policy"}),
		conntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Stale conntrack entries deleted after syncs.",
		}, family),
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.networkProgramming,
		m.lastSync, m.lastQueued, m.serviceChanges, m.endpointChanges,
		m.restoreFailures, m.partialFailures, m.driftRepairs, m.noLocalEndpoints, m.conntrackDeleted,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Services with a change not yet synced.",
		}, func() float64 { return float64(pendingServices()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Services whose endpoints have a change not yet synced.",
		}, func() float64 { return float64(pendingEndpoints()) }),
	)
	return m
}
