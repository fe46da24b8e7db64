package nftables

import (
	"net/netip"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
)

// usable reports whether a service port can get objects in this table. It
// is the writer's own check of every field that reaches the transaction,
// done whatever the tracker checked, since a caller's MakeServicePortFunc
// or ServicePort implementation can hand the writer anything, and a value
// nft refuses would fail the transaction of every service, not only this
// one. A port it refuses is logged, naming it and the reason, and gets
// nothing.
func (w *Writer) usable(logger klog.Logger, name changetracker.ServicePortName, svc changetracker.ServicePort) bool {
	var value any
	reason := checkName(name)
	if reason != "" {
		value = name.String()
	} else if svc != nil && svc.Protocol() != name.Protocol && protocolName(svc.Protocol()) != "" {
		// The chain names hold the name's protocol, the rules the port's.
		reason, value = "protocol differs from the port name's", svc.Protocol()
	}
	return w.check.Usable(logger, name, svc, reason, value)
}

// ownAddr reports whether ip is an address of the writer's family that
// nft takes as written (portcheck.Checker.OwnAddr).
func (w *Writer) ownAddr(ip netip.Addr) bool { return w.check.OwnAddr(ip) }

// ownRange is ownAddr for a prefix.
func (w *Writer) ownRange(p netip.Prefix) bool { return w.check.OwnRange(p) }

// usableEndpoints returns eps without the endpoints nft would refuse,
// logging each one it leaves out (portcheck.Checker.UsableEndpoints).
func (w *Writer) usableEndpoints(logger klog.Logger, name changetracker.ServicePortName, eps []changetracker.Endpoint) []changetracker.Endpoint {
	return w.check.UsableEndpoints(logger, name, eps)
}
