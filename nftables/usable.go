package nftables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
)

// maxAffinitySeconds is the longest session affinity the API server
// accepts (a day).
const maxAffinitySeconds = 86400

// usable reports whether a service port can get objects in this table. It
// is the writer's own check of every field that reaches the transaction,
// done whatever the tracker checked, since a caller's MakeServicePortFunc
// or ServicePort implementation can hand the writer anything, and a value
// nft refuses would fail the transaction of every service, not only this
// one. A port it refuses is logged, naming it and the reason, and gets
// nothing.
func (w *Writer) usable(logger klog.Logger, name changetracker.ServicePortName, svc changetracker.ServicePort) bool {
	if svc == nil {
		return false
	}
	if reason, value := w.unusable(name, svc); reason != "" {
		logger.Error(nil, "Skipping service port: "+reason, "servicePort", name.String(), "protocol", name.Protocol, "value", value, "ipFamily", w.cfg.IPFamily)
		return false
	}
	return true
}

// unusable returns why svc cannot get objects, and the offending value, or
// "" if it can.
func (w *Writer) unusable(name changetracker.ServicePortName, svc changetracker.ServicePort) (string, any) {
	if reason := checkName(name); reason != "" {
		return reason, name.String()
	}
	if ip := svc.ClusterIP(); !w.ownAddr(ip) {
		return "cluster IP is not an address of the writer's family", ip
	}
	switch p := svc.Protocol(); p {
	case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
		if p != name.Protocol {
			return "protocol differs from the port name's", p
		}
	default:
		return "unknown protocol", p
	}
	if p := svc.Port(); !validPort(p) {
		return "port is not in 1..65535", p
	}
	if p := svc.NodePort(); p != 0 && !validPort(p) {
		return "node port is not 0 (none) or in 1..65535", p
	}
	switch a := svc.SessionAffinityType(); a {
	case "", v1.ServiceAffinityNone:
	case v1.ServiceAffinityClientIP:
		if s := svc.StickyMaxAgeSeconds(); s < 1 || s > maxAffinitySeconds {
			return "session affinity timeout is not in 1..86400 seconds", s
		}
	default:
		return "unknown session affinity", a
	}
	return "", nil
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }

// ownAddr reports whether ip is an address of the writer's family that
// nft takes as written: not an IPv4-mapped IPv6 address and without a
// zone.
func (w *Writer) ownAddr(ip netip.Addr) bool {
	if !w.isIPv6() {
		return ip.Is4()
	}
	return ip.Is6() && !ip.Is4In6() && ip.Zone() == ""
}

func (w *Writer) isIPv6() bool { return w.ipX == "ip6" }

// ownRange is ownAddr for a prefix.
func (w *Writer) ownRange(p netip.Prefix) bool {
	return p.IsValid() && w.ownAddr(p.Addr())
}

// restrictsSources reports whether svc's loadBalancerSourceRanges restrict
// the sources of this family: they hold a range of this family, and none
// of length 0, which allows every source. Ranges of the other family, or
// that are not valid, restrict nothing here.
func (w *Writer) restrictsSources(svc changetracker.ServicePort) bool {
	restricts := false
	for _, p := range svc.LoadBalancerSourceRanges() {
		if !w.ownRange(p) {
			continue
		}
		if p.Bits() == 0 {
			return false
		}
		restricts = true
	}
	return restricts
}

func (w *Writer) badEndpoint(ep changetracker.Endpoint) bool {
	return ep == nil || !w.ownAddr(ep.IP()) || !validPort(ep.Port())
}

// usableEndpoints returns eps without the endpoints whose address or port
// nft would refuse, logging each one it leaves out; eps itself when all
// are good, which is the common case and costs nothing.
func (w *Writer) usableEndpoints(logger klog.Logger, name changetracker.ServicePortName, eps []changetracker.Endpoint) []changetracker.Endpoint {
	allGood := true
	for _, ep := range eps {
		allGood = allGood && !w.badEndpoint(ep)
	}
	if allGood {
		return eps
	}
	good := make([]changetracker.Endpoint, 0, len(eps))
	for _, ep := range eps {
		if !w.badEndpoint(ep) {
			good = append(good, ep)
			continue
		}
		var ip netip.Addr
		var port int
		if ep != nil {
			ip, port = ep.IP(), ep.Port()
		}
		logger.Error(nil, "Skipping endpoint: its address is not of the writer's family or its port is not in 1..65535",
			"servicePort", name.String(), "ip", ip, "port", port, "ipFamily", w.cfg.IPFamily)
	}
	return good
}
