package main

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/proxier"
)

// nodePortPrefixes returns the --nodeport-addresses prefixes of family: the
// node's own addresses for "primary", the given prefixes of that family
// otherwise. nil means every local address.
func nodePortPrefixes(o *options, family v1.IPFamily, ips []netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	if o.nodePortPrimary {
		for _, ip := range ips {
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
		return out
	}
	for _, p := range o.nodePortAddresses {
		if familyOf(p.Addr()) == family {
			out = append(out, p)
		}
	}
	return out
}

// healthCheckAddresses returns the node addresses the service health
// server listens on: those that serve node ports, when that is restricted;
// nil (every address) otherwise.
func healthCheckAddresses(o *options, node proxier.Node) []netip.Addr {
	if !o.nodePortPrimary && len(o.nodePortAddresses) == 0 {
		return nil
	}
	var out []netip.Addr
	for _, f := range node.Families {
		prefixes := nodePortPrefixes(o, f, node.IPs[f])
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
