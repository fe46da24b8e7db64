package kubeproxy

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// nodePortPrefixes returns the node-port prefixes of family: the node's
// own addresses ips with NodePortPrimary, the NodePortAddresses of that
// family otherwise. nil means every local address.
func (c *Config) nodePortPrefixes(family v1.IPFamily, ips []netip.Addr) []netip.Prefix {
	if c.NodePortPrimary {
		return proxy.HostPrefixes(ips)
	}
	var out []netip.Prefix
	for _, p := range c.NodePortAddresses {
		if proxy.FamilyOf(p.Addr()) == family {
			out = append(out, p)
		}
	}
	return out
}

// healthCheckAddresses returns the node addresses the service health
// server listens on: those that serve node ports, when that is restricted;
// nil (every address) otherwise.
func (c *Config) healthCheckAddresses(node proxier.Node) []netip.Addr {
	if !c.NodePortPrimary && len(c.NodePortAddresses) == 0 {
		return nil
	}
	var out []netip.Addr
	for _, f := range node.Families {
		prefixes := c.nodePortPrefixes(f, node.IPs[f])
		for _, ip := range node.IPs[f] {
			for _, p := range prefixes {
				if p.Contains(ip) {
					out = append(out, ip)
					break
				}
			}
		}
	}
	return out
}

// localhostNodePorts reports whether iptables mode serves IPv4 node ports
// on 127.0.0.1 with c: with LocalhostNodePorts, when the node-port
// addresses include it (all of them do by default; the node's own,
// NodePortPrimary, do not).
func (c *Config) localhostNodePorts() bool {
	if !c.LocalhostNodePorts || c.NodePortPrimary {
		return false
	}
	if len(c.NodePortAddresses) == 0 {
		return true
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	for _, p := range c.NodePortAddresses {
		if p.Contains(loopback) {
			return true
		}
	}
	return false
}
