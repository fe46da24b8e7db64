package writertest

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/proxy"
)

// LocalDetection is one local-traffic detection mode, of one IP family,
// that the iptables and nftables writers' golden tests render: a cluster
// IP (whose traffic from elsewhere is masqueraded) and a load balancer
// with externalTrafficPolicy Local (whose pod traffic is short-circuited
// to every endpoint).
type LocalDetection struct {
	Name   string
	Family v1.IPFamily
	// Node is the writer's node config: ClusterCIDRs that NodeCIDR mode
	// must not read, and the mode's own fields.
	Node proxy.NodeConfig
	// PodCIDRs are the node's, for FamilyInput.PodCIDRs.
	PodCIDRs []netip.Prefix
	// Setup sets the Services and endpoints on an empty Cluster of Family.
	Setup func(c *Cluster)
}

// LocalDetections are NodeCIDR, BridgeInterface and InterfaceNamePrefix
// mode in each family.
var LocalDetections = func() []LocalDetection {
	pods := []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd00:10:0:1::/64")}
	cluster := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00:10::/48")}
	modes := []struct {
		name string
		node proxy.NodeConfig
	}{
		{"node-cidr", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR}},
		{"bridge-interface", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "cni0"}},
		{"interface-name-prefix", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"}},
	}
	var out []LocalDetection
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		suffix, addr := "", func(v4, _ string) string { return v4 }
		if family == v1.IPv6Protocol {
			suffix, addr = "-ipv6", func(_, v6 string) string { return v6 }
		}
		for _, m := range modes {
			node := m.node
			node.Name, node.ClusterCIDRs = Node, cluster
			out = append(out, LocalDetection{
				Name:     "detect-local-" + m.name + suffix,
				Family:   family,
				Node:     node,
				PodCIDRs: pods,
				Setup: func(c *Cluster) {
					c.SetService(Service("ns", "web", addr("10.96.0.10", "fd00:96::10")))
					c.SetEndpoints("ns", "web", TCP8080, local(addr("10.0.1.1", "fd00:10:0:1::1")), remote(addr("10.0.2.1", "fd00:10:0:2::1")))
					c.SetService(Service("ns", "lb", addr("10.96.0.11", "fd00:96::11"),
						WithLoadBalancer(addr("203.0.113.5", "fd00:113::5")), WithNodePort(31000),
						WithExternalLocal(), WithHealthCheckNodePort(32000)))
					c.SetEndpoints("ns", "lb", TCP8080, local(addr("10.0.1.2", "fd00:10:0:1::2")), remote(addr("10.0.2.2", "fd00:10:0:2::2")))
				},
			})
		}
	}
	return out
}()
