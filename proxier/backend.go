package proxier

import (
	"context"
	"net/netip"

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
// stack). metrics registers the Backends' own metrics where the Proxier's
// are (the ready modes' WithMetrics); it is the same at every Run of one
// Proxier, so that a metric is registered once. An error stops
// Proxier.Run. A Backend that implements
// io.Closer is closed when Run returns, once for each group it is in,
// even when the factory also returned an error.
type NewBackendsFunc func(ctx context.Context, node Node, metrics *proxy.Metrics) ([]BackendGroup, error)
