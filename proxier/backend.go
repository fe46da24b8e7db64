package proxier

import (
	"context"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/proxy"
)

// BackendGroup is a Backend and the IP families it serves, in the order of
// the inputs its Sync gets. Each group is synced by a runner of its own.
type BackendGroup struct {
	// Backend syncs the families; it must not be nil.
	Backend proxy.Backend
	// Families are those of the node the Backend serves, at least one,
	// in the order of its Sync's inputs.
	Families []v1.IPFamily
}

// Node is what the Proxier knows of this node when it makes the backends.
type Node struct {
	// Name is the node name the Proxier was made with.
	Name string
	// Families are the IP families of the node's addresses, the primary
	// (that of its first address) first.
	Families []v1.IPFamily
	// IPs are the node's addresses by family: those of its Node object
	// (InternalIP first, then ExternalIP) or, when it has none, of the
	// host's interfaces. Every family in Families has at least one.
	IPs map[v1.IPFamily][]netip.Addr
}

// NewBackendsFunc makes the backends for node, once its Node object (or
// its absence) is known. It returns one group per runner; together they
// must serve each family at most once, and only families of node. A
// family no group serves is not proxied (iptables mode drops a secondary
// family whose ip6tables does not work, as kube-proxy falls back to single
// stack). metrics are kube-proxy's backend counters, registered where the
// Proxier's are. An error stops Proxier.Run. A Backend that implements
// io.Closer is closed when Run returns, once for each group it is in,
// even when the factory also returned an error.
type NewBackendsFunc func(ctx context.Context, node Node, metrics *BackendMetrics) ([]BackendGroup, error)

// BackendMetrics are the counters a Backend reports its own failures to,
// under kube-proxy's names, each labelled by ip_family. A Backend that has
// no such failures leaves them at zero.
type BackendMetrics struct {
	// RestoreFailures counts the applies that failed
	// (kubeproxy_sync_proxy_rules_iptables_restore_failures_total).
	RestoreFailures *prometheus.CounterVec
	// PartialRestoreFailures counts those of partial syncs
	// (kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total).
	PartialRestoreFailures *prometheus.CounterVec
	// DriftRepairs counts the times Run found rules changed by another
	// program and called lost
	// (kubeproxy_sync_proxy_rules_iptables_drift_repairs_total, a
	// proxykit metric).
	DriftRepairs *prometheus.CounterVec
	// NFTablesSyncFailures counts the nftables transactions that failed
	// (kubeproxy_sync_proxy_rules_nftables_sync_failures_total).
	NFTablesSyncFailures *prometheus.CounterVec
	// NFTablesCleanupFailures counts the failures to delete stale
	// nftables chains
	// (kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total).
	NFTablesCleanupFailures *prometheus.CounterVec
}
