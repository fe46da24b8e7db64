package nftables

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/proxy"
)

// modeMetrics are nftables mode's own metrics, each by ip_family.
type modeMetrics struct {
	syncFailures, cleanupFailures *prometheus.CounterVec
}

// newModeMetrics makes nftables mode's metrics on m.
func newModeMetrics(m *proxy.Metrics) (modeMetrics, error) {
	var mm modeMetrics
	var err error
	if mm.syncFailures, err = m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_nftables_sync_failures_total",
		Help: "nftables transactions that failed (the next sync is full)."}, []string{"ip_family"}); err != nil {
		return mm, err
	}
	mm.cleanupFailures, err = m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_nftables_cleanup_failures_total",
		Help: "Failed nftables transactions that were deleting stale chains, which therefore stay until a later sync deletes them."}, []string{"ip_family"})
	return mm, err
}
