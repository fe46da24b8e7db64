package iptables

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/proxy"
)

// modeMetrics are iptables mode's own metrics, each by ip_family.
type modeMetrics struct {
	restoreFailures, partialRestoreFailures, driftRepairs *prometheus.CounterVec
}

// RestoreFailuresMetric is kube-proxy's counter of failed iptables-restore
// runs, by ip_family; IPVS mode, which restores its few rules with
// iptables-restore too, counts on it.
func RestoreFailuresMetric(m *proxy.Metrics) (*prometheus.CounterVec, error) {
	return m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
		Help: "iptables-restore runs that failed."}, []string{"ip_family"})
}

// newModeMetrics makes iptables mode's metrics on m.
func newModeMetrics(m *proxy.Metrics) (modeMetrics, error) {
	var mm modeMetrics
	var err error
	if mm.restoreFailures, err = RestoreFailuresMetric(m); err != nil {
		return mm, err
	}
	if mm.partialRestoreFailures, err = m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
		Help: "iptables-restore runs of partial syncs that failed (the next sync is full)."}, []string{"ip_family"}); err != nil {
		return mm, err
	}
	mm.driftRepairs, err = m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_drift_repairs_total",
		Help: "Checks that found the top-level iptables chains different from what was applied, each followed by a full sync (a proxykit metric; kube-proxy has none)."}, []string{"ip_family"})
	return mm, err
}
