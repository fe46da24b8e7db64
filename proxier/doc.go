// Package proxier is a whole Kubernetes node service proxy around one
// Backend: write the datapath, and get everything around it from here.
//
// A Proxier watches the cluster through a client-go kubernetes.Interface
// with kube-proxy's selectors (package proxier/config), keeps a pair of
// change trackers per IP family each BackendGroup serves (package changetracker),
// follows the node's topology labels and its deletion, and syncs through a
// runner.Runner per BackendGroup: at most once per min sync period, at
// least once per sync period, and again within the retry period after a
// failure. After each good sync it cleans stale conntrack entries
// (WithConntrack), feeds the service health server (WithServiceHealthServer)
// and the proxy health server (WithProxyHealthServer), and observes
// kube-proxy's metrics on the caller's prometheus.Registerer
// (WithMetricsRegisterer); there is no global state.
//
// A Backend gets, per family, the tracker's maps and what changed in them,
// and the family's ranges of the cluster's ServiceCIDR objects
// (proxy.FamilyInput), and applies them. Three ready Backends are
// kube-proxy's modes: iptables mode (iptables.Mode) and nftables mode
// (nftables.Mode) serve one family per Backend, each family's rules being
// a table of its own; IPVS mode (ipvsmode.Mode) serves all of them in one.
// Package kubeproxy builds them from a KubeProxyConfiguration.
//
// Two Backends may serve one family, each in a group of its own, when
// they divide its traffic: a socket-level load balancer that translates a
// Service address when a local socket connects, beside nftables mode for
// the packets that come from other hosts. Each group then gets the same
// input of the family and syncs, fails and resyncs on its own; the
// family's health and last-sync time are those of its slowest group (see
// BackendGroup). A custom Backend of a few dozen lines is enough for
// a proxy of one's own; see the Example.
//
//	p, err := proxier.New(client, nodeName,
//		func(ctx context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
//			return []proxier.BackendGroup{{Backend: myBackend{}, Families: node.Families}}, nil
//		},
//		proxier.WithMetricsRegisterer(registry))
//	if err != nil { ... }
//	err = p.Run(ctx) // until ctx is done
//
// Choosing options: WithSyncPeriods is kube-proxy's --min-sync-period and
// --sync-period; a shorter minimum programs a change sooner and syncs
// more often under churn. WithServiceProxyName lets the Proxier run beside
// kube-proxy, serving only the Services labelled for it. Without
// WithConntrack no conntrack entry is cleaned, so UDP clients of a
// removed endpoint keep sending into the void until their flows expire;
// without the health server options no port is listened on.
//
// It is not a datapath: it touches no kernel state of its own (the health
// servers listen on ports, nothing more), and imports none of the
// netlink-backed blocks. Importing it compiles client-go's informers and
// clientset but no netlink or IPVS library; each ready Backend adds only
// its own mode's blocks (the iptables block; the netlink libraries of
// IPVS and ipset; the nftables block, knftables and google/nftables).
package proxier
