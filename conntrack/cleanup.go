package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
)

// CleanupOption changes what a [Cleaner] looks at; [NewCleaner] reads it.
type CleanupOption func(*cleanupOptions)

type cleanupOptions struct {
	protocols []Protocol
}

// WithProtocols sets the protocols whose flows a [Cleaner] cleans; the
// default is UDP only. Read by [NewCleaner]. UDP and SCTP are accepted;
// any other protocol makes every [Cleaner.CleanStaleEntries] fail, since
// for TCP the endpoint's reset already ends the flow and deleting entries
// only breaks connections.
func WithProtocols(protocols ...v1.Protocol) CleanupOption {
	return func(o *cleanupOptions) {
		o.protocols = o.protocols[:0]
		for _, p := range protocols {
			proto, ok := protocolOf(p)
			if !ok || proto == ProtocolTCP {
				proto = 0 // rejected by CleanStaleEntries
			}
			o.protocols = append(o.protocols, proto)
		}
	}
}

// Cleaner deletes the conntrack flows that a proxy's rules no longer stand
// behind. Its CleanStaleEntries method is a proxier.ConntrackCleaner, so
// that proxier.WithConntrack(conntrack.NewCleaner(ct)) wires it without an
// adapter. A Cleaner keeps no state between calls and is safe for
// concurrent use if its Interface is.
type Cleaner struct {
	ct        Interface
	protocols []Protocol
}

// NewCleaner returns a Cleaner that lists and deletes flows through ct. It
// reads [WithProtocols]; a protocol it cannot clean is reported by each
// CleanStaleEntries, not here.
func NewCleaner(ct Interface, opts ...CleanupOption) *Cleaner {
	o := cleanupOptions{protocols: []Protocol{ProtocolUDP}}
	for _, opt := range opts {
		opt(&o)
	}
	return &Cleaner{ct: ct, protocols: o.protocols}
}

// frontend is a service address as a flow's original destination shows it.
type frontend struct {
	proto Protocol
	ip    netip.Addr // zero for a node port
	port  uint16
}

// backend is a serving endpoint as a DNATed flow's reply source shows it.
type backend struct {
	ip   netip.Addr
	port uint16
}

// CleanStaleEntries deletes the conntrack flows of family that a proxy's
// rules no longer stand behind, and returns how many it deleted. Call it
// after a sync has applied svcPortMap and endpointsMap to the kernel.
//
// A UDP flow (see [WithProtocols]) is stale when its original destination
// is one of a service port's frontends — cluster IP, external IP or
// load-balancer IP with the service port, or any address with its node
// port — and its reply source is not one of that port's serving endpoints
// (IP and port). Such flows are deleted so that the next packet goes
// through the current rules. This covers:
//
//   - an endpoint that stopped serving or went away: flows still DNATed to
//     it;
//   - a service that had no endpoints (kubernetes#48370): flows created
//     then were not DNATed at all (their reply source is the service IP),
//     and would keep black-holing a client that reuses its socket after
//     endpoints appear;
//   - a service that now has no endpoints (kubernetes#139628): all its
//     flows, so that the REJECT rule applies instead of conntrack sending
//     packets to an endpoint that is gone.
//
// deletedClusterIPs holds the cluster IPs of UDP service ports removed
// since the last cleanup (changetracker's
// UpdateServiceMapResult.DeletedUDPClusterIPs); it may be nil. Their
// services are gone from the ServicePortMap, but one-way UDP senders keep
// their entries alive and DNATed to the old endpoint (kubernetes PR
// 141371). Flows to these addresses are deleted unless they match a port
// of a service that still exists.
//
// Everything else is kept: flows to serving endpoints (which is why a
// proxy restart does not disturb healthy flows, kubernetes#122740), flows
// of other protocols, and flows to addresses that are no service's.
// Terminating endpoints that still serve keep their flows; traffic
// policies and topology are not considered, because a change to them
// should not break existing flows, as it does not for TCP.
//
// It lists the table once and deletes through [Interface.DeleteFlows]. An
// error from listing means nothing was deleted; an error from deleting
// comes with the number deleted so far.
func (c *Cleaner) CleanStaleEntries(ctx context.Context, family v1.IPFamily,
	svcPortMap changetracker.ServicePortMap, endpointsMap changetracker.EndpointsMap, deletedClusterIPs sets.Set[netip.Addr]) (int, error) {
	logger := klog.FromContext(ctx)
	if err := checkFamily(family); err != nil {
		return 0, err
	}
	if slices.Contains(c.protocols, 0) {
		return 0, fmt.Errorf("conntrack cleanup: only UDP and SCTP flows can be cleaned")
	}
	start := time.Now()

	serving := frontends(family, c.protocols, svcPortMap, endpointsMap)
	flows, err := c.ct.ListFlows(ctx, family)
	if err != nil {
		return 0, fmt.Errorf("conntrack cleanup: %w", err)
	}
	var stale []Flow
	for _, f := range flows {
		if !slices.Contains(c.protocols, f.Protocol) {
			continue
		}
		if isStale(f, serving, deletedClusterIPs) {
			logger.V(6).Info("Stale conntrack flow", "flow", f)
			stale = append(stale, f)
		}
	}
	n, err := c.ct.DeleteFlows(ctx, family, stale)
	logger.V(4).Info("Cleaned stale conntrack flows", "ipFamily", family, "flows", len(flows), "stale", len(stale), "deleted", n, "took", time.Since(start))
	if err != nil {
		return n, fmt.Errorf("conntrack cleanup: %w", err)
	}
	return n, nil
}

// frontends maps each frontend of the service ports of the given protocols
// to the serving endpoints behind it. A frontend shared by several service
// ports (a node port cannot be, an external IP can) gets the union of their
// endpoints, so that no port's healthy flows are deleted. A port without
// serving endpoints still gets its frontends, with an empty set: all their
// flows are stale.
func frontends(family v1.IPFamily, protocols []Protocol, svcPortMap changetracker.ServicePortMap, endpointsMap changetracker.EndpointsMap) map[frontend]sets.Set[backend] {
	m := make(map[frontend]sets.Set[backend], len(svcPortMap))
	add := func(fe frontend, backends sets.Set[backend]) {
		if cur, ok := m[fe]; ok {
			m[fe] = cur.Union(backends)
			return
		}
		m[fe] = backends
	}
	for name, svc := range svcPortMap {
		proto, ok := protocolOf(svc.Protocol())
		if !ok || !slices.Contains(protocols, proto) || svc.Port() <= 0 || svc.Port() > 65535 {
			continue
		}
		eps := endpointsMap[name]
		backends := make(sets.Set[backend], len(eps))
		for _, ep := range eps {
			if ep.IsServing() && ep.Port() > 0 && ep.Port() <= 65535 {
				backends.Insert(backend{ip: ep.IP().Unmap(), port: uint16(ep.Port())})
			}
		}
		port := uint16(svc.Port())
		for _, ips := range [][]netip.Addr{{svc.ClusterIP()}, svc.ExternalIPs(), svc.LoadBalancerVIPs()} {
			for _, ip := range ips {
				if ip.IsValid() && familyOf(ip, family) {
					add(frontend{proto: proto, ip: ip.Unmap(), port: port}, backends)
				}
			}
		}
		if np := svc.NodePort(); np > 0 && np <= 65535 {
			add(frontend{proto: proto, port: uint16(np)}, backends)
		}
	}
	return m
}

// isStale applies CleanStaleEntries's rule to one flow.
func isStale(f Flow, serving map[frontend]sets.Set[backend], deletedIPs sets.Set[netip.Addr]) bool {
	dst := f.Original.Dst.Unmap()
	reply := backend{ip: f.Reply.Src.Unmap(), port: f.Reply.SrcPort}
	if backends, ok := serving[frontend{proto: f.Protocol, ip: dst, port: f.Original.DstPort}]; ok {
		return !backends.Has(reply)
	}
	if backends, ok := serving[frontend{proto: f.Protocol, port: f.Original.DstPort}]; ok {
		return !backends.Has(reply)
	}
	return f.Protocol == ProtocolUDP && deletedIPs.Has(dst)
}
