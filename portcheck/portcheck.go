// Package portcheck decides which service ports and endpoints are safe to
// program into a node's datapath. It holds the checks that the service
// rule writers (iptables, nftables) make of every field of a service port
// and an endpoint that reaches their kernel text, for anyone who turns the
// change trackers' maps into rules of their own: a custom Backend, or
// another writer. The trackers (package changetracker) refuse what the
// API server would refuse, but a caller's MakeServicePortFunc or its own
// ServicePort implementation can hand a writer anything, and one value the
// kernel tool refuses would fail the sync of every service, not only that
// one. Checked again here, per object, a bad value costs its own Service
// alone.
//
// A Checker is for one IP family and one node (New), and knows the
// family's ServiceCIDR ranges when given them (WithServiceCIDRs). Usable
// says whether a port may get rules, and logs a refusal with the port's
// name, the reason and the offending value, escaped as logsafe escapes
// API text; Unusable gives the reason without logging. UsableEndpoints
// drops, and logs, the endpoints a port's rules must not name. Only
// values are checked: names are each writer's own business (its own
// quoting), and nothing here touches the kernel.
//
// Edge behaviour:
//   - A nil port is refused without a log; a nil endpoint is dropped.
//   - An address counts as of the family only as iptables and nft take it
//     as written: an IPv4-mapped IPv6 address or a zoned one is of
//     neither.
//   - A cluster IP that is of the other family, special (unspecified,
//     loopback, link-local, multicast, broadcast), an address of this
//     node, or outside known ServiceCIDRs refuses the port. Without
//     ServiceCIDRs, cluster IPs are not checked against ranges.
//   - An external or load-balancer IP of this family that is special
//     refuses the whole port; one not of this family refuses nothing
//     (leave it out of the rules, as the writers do); one equal to a node
//     address is allowed, as the API server and kube-proxy allow it.
//   - An unknown protocol or session affinity, a port, node port or
//     health check node port out of range, or an affinity timeout outside
//     the API server's bounds also refuses the port (Unusable lists every
//     reason).
//
// In a Backend's sync of one family:
//
//	c := portcheck.New(v1.IPv4Protocol, nodeIPs...).WithServiceCIDRs(in.ServiceCIDRs)
//	for name, svc := range in.Services {
//		if !c.Usable(logger, name, svc, "", nil) {
//			continue
//		}
//		eps := c.UsableEndpoints(logger, name, in.Endpoints[name])
//		// render svc and eps
//	}
package portcheck

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
)

// MaxAffinitySeconds is the longest session affinity the API server
// accepts (a day).
const MaxAffinitySeconds = 86400

// Checker checks ports and endpoints for a writer of one IP family.
type Checker struct {
	family  v1.IPFamily
	ipv6    bool
	nodeIPs []netip.Addr
	// serviceCIDRs are the family's ServiceCIDR ranges; none means they
	// are not known and cluster IPs are not checked against them.
	serviceCIDRs []netip.Prefix
}

// New returns a Checker for family; any value but v1.IPv6Protocol checks
// for IPv4. nodeIPs are this node's addresses (proxy.FamilyInput.NodeIPs),
// which no cluster IP may be; IPv4-mapped ones count as IPv4 and invalid
// ones are ignored.
func New(family v1.IPFamily, nodeIPs ...netip.Addr) Checker {
	c := Checker{family: family, ipv6: family == v1.IPv6Protocol}
	return c.WithNodeIPs(nodeIPs)
}

// WithNodeIPs returns a copy of c whose node addresses, which no cluster
// IP may be, are nodeIPs (see New). c is not changed and nodeIPs is not
// kept.
func (c Checker) WithNodeIPs(nodeIPs []netip.Addr) Checker {
	c.nodeIPs = nil
	for _, ip := range nodeIPs {
		if ip.IsValid() {
			c.nodeIPs = append(c.nodeIPs, ip.Unmap().WithZone(""))
		}
	}
	return c
}

// WithServiceCIDRs returns a copy of c that refuses a cluster IP outside
// every one of prefixes, the ranges the API server allocates cluster IPs
// from (those of the family's ServiceCIDR objects): it never hands out
// one outside them, so such a port comes from a caller's own objects and
// would capture traffic to some other host's address. The ranges may nest
// or overlap. Prefixes that are not valid or not of c's family are
// ignored, IPv4-mapped ones counting as IPv4; when none is left (the
// ranges are not known) cluster IPs are not checked against them. c is
// not changed and prefixes is not kept.
func (c Checker) WithServiceCIDRs(prefixes []netip.Prefix) Checker {
	c.serviceCIDRs = nil
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		bits := p.Bits()
		if p.Addr().Is4In6() {
			// ::ffff:10.96.0.0/112 is 10.96.0.0/16; one wider than
			// ::ffff:0:0/96 is left invalid, and out.
			bits -= 96
		}
		p = netip.PrefixFrom(p.Addr().Unmap().WithZone(""), bits).Masked()
		if p.IsValid() && c.OwnRange(p) {
			c.serviceCIDRs = append(c.serviceCIDRs, p)
		}
	}
	// Sorted and without duplicates, for SameServiceCIDRs.
	slices.SortFunc(c.serviceCIDRs, netip.Prefix.Compare)
	c.serviceCIDRs = slices.Compact(c.serviceCIDRs)
	return c
}

// SameServiceCIDRs reports whether c and o hold the same ServiceCIDR
// ranges (see WithServiceCIDRs), whatever the order they were given in. A
// writer syncs every port again when they differ, since each may be
// judged otherwise.
func (c Checker) SameServiceCIDRs(o Checker) bool {
	return slices.Equal(c.serviceCIDRs, o.serviceCIDRs)
}

// inServiceCIDRs reports whether ip is inside one of c's ServiceCIDR
// ranges, or they are not known.
func (c Checker) inServiceCIDRs(ip netip.Addr) bool {
	if len(c.serviceCIDRs) == 0 {
		return true
	}
	ip = ip.Unmap()
	for _, p := range c.serviceCIDRs {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// OwnAddr reports whether ip is an address of the checker's family that
// iptables and nft take as written: not an IPv4-mapped IPv6 address, which
// the IPv4 tools refuse, and without a zone.
func (c Checker) OwnAddr(ip netip.Addr) bool {
	if !c.ipv6 {
		// Is4 is false for the invalid address and for mapped ones.
		return ip.Is4()
	}
	return ip.Is6() && !ip.Is4In6() && ip.Zone() == ""
}

// OwnRange is OwnAddr for a prefix.
func (c Checker) OwnRange(p netip.Prefix) bool {
	return p.IsValid() && c.OwnAddr(p.Addr())
}

// RestrictsSources reports whether svc's loadBalancerSourceRanges restrict
// the sources of this family: they hold a range of this family, and none
// of length 0, which allows every source as kube-proxy reads it. Ranges of
// the other family, or that are not valid, restrict nothing here.
func (c Checker) RestrictsSources(svc changetracker.ServicePort) bool {
	restricts := false
	for _, p := range svc.LoadBalancerSourceRanges() {
		if !c.OwnRange(p) {
			continue
		}
		if p.Bits() == 0 {
			return false
		}
		restricts = true
	}
	return restricts
}

// Usable reports whether svc can get rules, given what the writer's own
// check of the port found (reason "" for nothing; for example its name in
// the writer's own quoting) and then Unusable. A refused port is logged
// with its name, the reason and the offending value, and ipFamily. A nil
// svc is refused without a log: the map has no such port.
func (c Checker) Usable(logger klog.Logger, name changetracker.ServicePortName, svc changetracker.ServicePort, reason string, value any) bool {
	if svc == nil {
		return false
	}
	if reason == "" {
		reason, value = c.Unusable(svc)
	}
	if reason != "" {
		logger.Error(nil, "Skipping service port: "+reason, "servicePort", logsafe.Quote(name.String()),
			"protocol", logsafe.Quote(string(name.Protocol)), "value", safeValue(value), "ipFamily", c.family)
		return false
	}
	return true
}

// safeValue returns v for a log line, its text escaped by logsafe.Quote:
// the offending value of a refused port is often text from the API (an
// address's zone included).
func safeValue(v any) any {
	switch v := v.(type) {
	case string:
		return logsafe.Quote(v)
	case v1.Protocol:
		return logsafe.Quote(string(v))
	case v1.ServiceAffinity:
		return logsafe.Quote(string(v))
	case error:
		return logsafe.Quote(v.Error())
	case fmt.Stringer:
		return logsafe.Quote(v.String())
	}
	return v
}

// Unusable returns why svc cannot get rules in this family, and the
// offending value, or "" if it can: a cluster IP of another family, one
// that no API server hands out (see changetracker.SpecialAddressReason:
// unspecified, loopback, link-local, multicast, broadcast), an address
// of this node, whose rules would take the node's own ports, or one
// outside the ServiceCIDRs when they are known (see WithServiceCIDRs); an external
// or load-balancer IP of this family that is such a special address (the
// whole port is refused: the writer cannot tell which of its addresses
// the caller meant, and the trackers never hand one on); an unknown
// protocol or session affinity, a port, node port or health check node
// port out of range, an affinity timeout outside the API server's bounds.
// External and load-balancer IPs equal to a node address are usable, as
// the API server and kube-proxy allow them. Names are the writers' own
// business (each has its own quoting).
func (c Checker) Unusable(svc changetracker.ServicePort) (string, any) {
	ip := svc.ClusterIP()
	if !c.OwnAddr(ip) {
		return "cluster IP is not an address of the writer's family", ip
	}
	if r := changetracker.SpecialAddressReason(ip); r != "" {
		return "cluster IP cannot be a service address (" + r + ")", ip
	}
	if slices.Contains(c.nodeIPs, ip) {
		return "cluster IP is an address of this node", ip
	}
	if !c.inServiceCIDRs(ip) {
		return "cluster IP is outside the ServiceCIDRs", ip
	}
	for _, ips := range [2][]netip.Addr{svc.ExternalIPs(), svc.LoadBalancerVIPs()} {
		for _, ip := range ips {
			if !c.OwnAddr(ip) {
				continue // left out by the writer
			}
			if r := changetracker.SpecialAddressReason(ip); r != "" {
				return "external or load-balancer IP cannot be a service address (" + r + ")", ip
			}
		}
	}
	switch p := svc.Protocol(); p {
	case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
	default:
		return "unknown protocol", p
	}
	if p := svc.Port(); !ValidPort(p) {
		return "port is not in 1..65535", p
	}
	if p := svc.NodePort(); p != 0 && !ValidPort(p) {
		return "node port is not 0 (none) or in 1..65535", p
	}
	if p := svc.HealthCheckNodePort(); p != 0 && !ValidPort(p) {
		return "health check node port is not 0 (none) or in 1..65535", p
	}
	switch a := svc.SessionAffinityType(); a {
	case "", v1.ServiceAffinityNone:
	case v1.ServiceAffinityClientIP:
		// The API server's bounds (sessionAffinityConfig.clientIP.timeoutSeconds).
		if s := svc.StickyMaxAgeSeconds(); s < 1 || s > MaxAffinitySeconds {
			return "session affinity timeout is not in 1..86400 seconds", s
		}
	default:
		return "unknown session affinity", a
	}
	return "", nil
}

// ValidPort reports whether p is a port number, 1 to 65535.
func ValidPort(p int) bool { return p >= 1 && p <= 65535 }

func (c Checker) badEndpoint(ep changetracker.Endpoint) bool {
	return ep == nil || !c.OwnAddr(ep.IP()) || !ValidPort(ep.Port())
}

// UsableEndpoints returns eps without the endpoints whose address is not
// of this family or whose port is out of range, logging each one it
// leaves out with the service port's name; eps itself when all are good,
// which is the common case and costs nothing.
func (c Checker) UsableEndpoints(logger klog.Logger, name changetracker.ServicePortName, eps []changetracker.Endpoint) []changetracker.Endpoint {
	allGood := true
	for _, ep := range eps {
		allGood = allGood && !c.badEndpoint(ep)
	}
	if allGood {
		return eps
	}
	good := make([]changetracker.Endpoint, 0, len(eps))
	for _, ep := range eps {
		if !c.badEndpoint(ep) {
			good = append(good, ep)
			continue
		}
		var ip netip.Addr
		var port int
		if ep != nil {
			ip, port = ep.IP(), ep.Port()
		}
		logger.Error(nil, "Skipping endpoint: its address is not of the writer's family or its port is not in 1..65535",
			"servicePort", logsafe.Quote(name.String()), "ip", logsafe.Quote(ip.String()), "port", port, "ipFamily", c.family)
	}
	return good
}
