package main

import (
	"fmt"
	"net"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// nodeIPs are this node's addresses by IP family; families lists the
// families the node has, the primary (that of its first address) first.
// The proxier runs one familyProxier per family.
type nodeIPs struct {
	byFamily map[v1.IPFamily][]netip.Addr
	families []v1.IPFamily
}

func newNodeIPs(addrs []netip.Addr) nodeIPs {
	n := nodeIPs{byFamily: map[v1.IPFamily][]netip.Addr{}}
	for _, a := range addrs {
		f := familyOf(a)
		if _, ok := n.byFamily[f]; !ok {
			n.families = append(n.families, f)
		}
		n.byFamily[f] = append(n.byFamily[f], a)
	}
	return n
}

// addressesOfNode returns the addresses in a Node's status, InternalIP ones
// first, as kube-proxy picks the node IP. Unparsable ones are logged and
// skipped. A nil node has none.
func addressesOfNode(logger klog.Logger, node *v1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var out []netip.Addr
	for _, kind := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != kind {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				logger.Error(err, "Ignoring a bad node address", "node", node.Name, "address", a.Address)
				continue
			}
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// hostAddresses returns the global unicast addresses of this host's
// interfaces that are up: the node IPs when no Node object says otherwise.
func hostAddresses() ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of interface %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

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
func healthCheckAddresses(o *options, ips nodeIPs) []netip.Addr {
	if !o.nodePortPrimary && len(o.nodePortAddresses) == 0 {
		return nil
	}
	var out []netip.Addr
	for _, f := range ips.families {
		prefixes := nodePortPrefixes(o, f, ips.byFamily[f])
		for _, ip := range ips.byFamily[f] {
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
