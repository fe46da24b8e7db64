// Package proxier is a whole Kubernetes node service proxy around one
// Backend: write the datapath, and get everything around it from here.
//
// A Proxier watches the cluster through a client-go kubernetes.Interface
// with kube-proxy's selectors (package proxier/config), keeps a pair of
// change trackers per IP family of the node (package changetracker),
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
// (FamilyInput), and applies them. Three ready Backends are kube-proxy's
// modes: iptables mode (proxier/iptablesbackend) and nftables mode
// (proxier/nftablesbackend) serve one family per Backend, each family's
// rules being a table of its own; IPVS mode (proxier/ipvsbackend) serves
// all of them in one. A custom Backend of a few dozen lines is enough for
// a proxy of one's own; see the Example.
//
//	p, err := proxier.New(client, nodeName,
//		func(ctx context.Context, node proxier.Node, _ *proxier.BackendMetrics) ([]proxier.BackendGroup, error) {
//			return []proxier.BackendGroup{{Backend: myBackend{}, Families: node.Families}}, nil
//		},
//		proxier.WithMetricsRegisterer(registry))
//	if err != nil { ... }
//	err = p.Run(ctx) // until ctx is done
//
// It is not a datapath: it touches no kernel state of its own (the health
// servers listen on ports, nothing more), and imports none of the
// netlink-backed blocks. Importing it compiles 733 packages (go list
// -deps), client-go's informers and clientset among them, and no netlink
// or IPVS library; iptablesbackend adds the iptables block (738 in all),
// ipvsbackend the netlink libraries of IPVS and ipset (746),
// nftablesbackend the nftables block, knftables and the google/nftables
// netlink library (750).
package proxier
