// Package portcheck holds the checks that the service rule writers
// (iptables, nftables) make of every field of a service port and an
// endpoint that reaches their kernel text, whatever the change trackers
// checked before: a caller's MakeServicePortFunc or its own ServicePort
// implementation can hand a writer anything, and one value the kernel tool
// refuses would fail the sync of every service, not only that one.
package portcheck

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
)

// MaxAffinitySeconds is the longest session affinity the API server
// accepts (a day).
const MaxAffinitySeconds = 86400

// Checker checks ports and endpoints for a writer of one IP family.
type Checker struct {
	family v1.IPFamily
	ipv6   bool
}

// New returns a Checker for family; any value but v1.IPv6Protocol checks
// for IPv4.
func New(family v1.IPFamily) Checker {
	return Checker{family: family, ipv6: family == v1.IPv6Protocol}
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
		logger.Error(nil, "Skipping service port: "+reason, "servicePort", name.String(), "protocol", name.Protocol, "value", value, "ipFamily", c.family)
		return false
	}
	return true
}

// Unusable returns why svc cannot get rules in this family, and the
// offending value, or "" if it can: a cluster IP of another family, an
// unknown protocol or session affinity, a port, node port or health check
// node port out of range, an affinity timeout outside the API server's
// bounds. Names are the writers' own business (each has its own quoting).
func (c Checker) Unusable(svc changetracker.ServicePort) (string, any) {
	if ip := svc.ClusterIP(); !c.OwnAddr(ip) {
		return "cluster IP is not an address of the writer's family", ip
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
			"servicePort", name.String(), "ip", ip, "port", port, "ipFamily", c.family)
	}
	return good
}
