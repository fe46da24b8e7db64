package proxier

import (
	"context"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/proxy"
)

// BackendGroup is a Backend and the IP families it serves, in the order of
// the inputs its Sync gets. Each group is synced by a runner of its own.
//
// Several groups may serve one family, when their Backends divide the
// family's traffic between them rather than each serving all of it: a
// socket-level Backend that rewrites a Service address to an endpoint's
// when a local socket connects, beside a packet-level one (nftables mode)
// for the packets that arrive from other hosts, which never pass a local
// socket. A connection the first has translated never carries a Service
// address, so the second's rules never match it, and the two cannot both
// act on one packet. Dividing the traffic so is the Backends' business;
// the Proxier gives each group an input of the family with the same
// Services, endpoints and node state, as if it served the family alone,
// and keeps the groups apart otherwise:
//
//   - each group has its own change trackers and maps for the family,
//     fed by the same events (the family's maps are held once per group),
//     and its own runner: a group's failed or slow sync holds no other
//     back, its retries are its own, and its Backend's lost asks for a
//     full sync of that group alone;
//   - conntrack cleanup and the service health server follow each
//     group's good syncs, as with one group (so a cleanup that a change
//     calls for runs once per group);
//   - the proxy health server counts the family up to date once every
//     group has synced the changes it has had, so /healthz fails when any
//     group of it stops syncing;
//   - the sync durations observe every group's syncs under the family's
//     label, each being a sync of its own; the network programming
//     latency is observed once per change of the family, when the last
//     of its groups has applied it (the first group's trigger times
//     standing for all: each takes the same changes);
//     sync_proxy_rules_last_timestamp_seconds is the oldest of the
//     groups' last good syncs, absent until each has had one, so an
//     alert on its age fires when any group is stuck; the no-local-
//     endpoints gauges are the largest a group reported; the pending
//     changes gauges count those of the group furthest behind.
type BackendGroup struct {
	// Backend syncs the families; it must not be nil.
	Backend proxy.Backend
	// Families are those of Node.Families the Backend serves, at least
	// one, in the order of its Sync's inputs.
	Families []v1.IPFamily
}

// Node is what the Proxier knows of this node when it makes the backends.
type Node struct {
	// Name is the node name the Proxier was made with.
	Name string
	// Families are both IP families, the primary first: the family of
	// the node's first address (see IPs), or IPv4 when it has none. Both
	// are there whatever addresses the Node lists, because kube-proxy
	// decides the families it proxies from the node's primary family and
	// what the host supports, not from the Node's addresses: it runs
	// both whenever the kernel (and, in its iptables and IPVS modes,
	// iptables and ip6tables) supports both, so that the cluster IPs of
	// the other family work from this node's pods on a node whose Node
	// object lists one family alone, and it fails when the primary one
	// is not supported.
	Families []v1.IPFamily
	// IPs are the node's addresses by family: those of its Node object
	// (InternalIP first, then ExternalIP) or, when it has none, of the
	// host's interfaces. A family may have none.
	IPs map[v1.IPFamily][]netip.Addr
}

// NewBackendsFunc makes the backends for node, once its Node object (or
// its absence) is known. It returns one group per runner; a group lists
// each of its families once, and several groups may serve one family when
// their Backends divide its traffic (see BackendGroup). To proxy as kube-proxy does, it
// serves the primary family (node.Families[0]), failing when it cannot,
// and the other one when the host supports it, whether or not the node
// has an address of it (package kubeproxy's modes decide so); a family no
// group serves is not proxied. Each family's sync input carries its node
// addresses (proxy.FamilyInput.NodeIPs), which follow the Node object's.
// metrics registers the Backends' own metrics where the Proxier's
// are (the ready modes' WithMetrics); it is the same at every Run of one
// Proxier, so that a metric is registered once. An error stops
// Proxier.Run. A Backend that implements
// io.Closer is closed when Run returns, once for each group it is in,
// even when the factory also returned an error.
type NewBackendsFunc func(ctx context.Context, node Node, metrics *proxy.Metrics) ([]BackendGroup, error)
