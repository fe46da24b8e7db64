package kerneltest

import (
	"net/netip"
	"testing"
)

// ProxyNetwork is the network of a service proxy's kernel tests: a node
// namespace, where the proxy's rules go, between a client namespace and
// pod namespaces on a bridge, each pod running a [Backend]:
//
//	client ── veth ── node ── br0 ─┬─ pod
//	                               └─ pod ...
//
// The node forwards between them, and routes everything it has no route
// for to the client, so an address nothing serves leads nowhere. It sends
// rejections straight back: ICMP redirects and the ICMP rate limit, which
// would turn a REJECT into a client timeout, are off.
type ProxyNetwork struct {
	// Node and Client are the node's and the client's namespaces.
	Node, Client *NS
	// Pods are the pods' namespaces, by name.
	Pods map[string]*NS
	// ClientLink is the client's end of its link to the node, NodeLink
	// the node's.
	ClientLink, NodeLink string
}

// ProxyNetworkConfig describes a [ProxyNetwork]. Addresses are given with
// their prefixes; the first of each family of ClientAddrs, NodeAddrs and
// BridgeAddrs is the one routes go through, and a family the node has no
// address of is not routed.
type ProxyNetworkConfig struct {
	// ClientAddrs and NodeAddrs are the client's and the node's addresses
	// on their link.
	ClientAddrs, NodeAddrs []netip.Prefix
	// BridgeAddrs are the node's addresses on the pods' bridge, br0.
	BridgeAddrs []netip.Prefix
	// Pods are the pods, each with a backend on BackendPort.
	Pods        []NetworkPod
	BackendPort uint16
}

// NetworkPod is a pod of a [ProxyNetwork]: its name, which its backend
// answers with, and its addresses in the bridge's prefixes.
type NetworkPod struct {
	Name  string
	Addrs []netip.Prefix
}

// NewProxyNetwork builds the network of cfg in new namespaces, removed when
// t ends, and starts the pods' backends. Call [Require] first.
func NewProxyNetwork(t testing.TB, cfg ProxyNetworkConfig) *ProxyNetwork {
	t.Helper()
	n := &ProxyNetwork{Node: NewNS(t), Client: NewNS(t), Pods: map[string]*NS{}}
	n.Node.Sysctl(t, "net.ipv4.ip_forward", "1")
	n.Node.Sysctl(t, "net.ipv4.conf.all.send_redirects", "0")
	n.Node.Sysctl(t, "net.ipv4.conf.default.send_redirects", "0")
	n.Node.Sysctl(t, "net.ipv4.icmp_ratelimit", "0")
	if first(cfg.NodeAddrs, true).IsValid() {
		n.Node.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
		n.Node.Sysctl(t, "net.ipv6.icmp.ratelimit", "0")
	}

	v := Link(t, n.Client, n.Node, netip.Prefix{}, netip.Prefix{})
	n.ClientLink, n.NodeLink = v.A, v.B
	for _, a := range cfg.ClientAddrs {
		n.Client.AddAddr(t, v.A, a)
	}
	for _, a := range cfg.NodeAddrs {
		n.Node.AddAddr(t, v.B, a)
	}
	for _, v6 := range []bool{false, true} {
		if via := first(cfg.NodeAddrs, v6); via.IsValid() {
			n.Client.AddRoute(t, netip.Prefix{}, via.Addr())
		}
		if via := first(cfg.ClientAddrs, v6); via.IsValid() {
			n.Node.AddRoute(t, netip.Prefix{}, via.Addr())
		}
	}

	n.Node.AddBridge(t, "br0")
	for _, a := range cfg.BridgeAddrs {
		n.Node.AddAddr(t, "br0", a)
	}
	for _, p := range cfg.Pods {
		pod := NewNS(t)
		pv := Link(t, pod, n.Node, netip.Prefix{}, netip.Prefix{})
		n.Node.AttachToBridge(t, pv.B, "br0")
		for _, a := range p.Addrs {
			pod.AddAddr(t, pv.A, a)
			if gw := first(cfg.BridgeAddrs, a.Addr().Is6()); gw.IsValid() && first(p.Addrs, a.Addr().Is6()) == a {
				pod.AddRoute(t, netip.Prefix{}, gw.Addr())
			}
		}
		StartBackend(t, pod, p.Name, cfg.BackendPort)
		n.Pods[p.Name] = pod
	}
	return n
}

// first returns the first prefix of the family in prefixes (IPv6 if v6),
// or the zero Prefix.
func first(prefixes []netip.Prefix, v6 bool) netip.Prefix {
	for _, p := range prefixes {
		if p.Addr().Is6() == v6 {
			return p
		}
	}
	return netip.Prefix{}
}
