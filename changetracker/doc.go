// Package changetracker turns Kubernetes Services and EndpointSlices into the
// per-port maps a service proxy programs into the kernel, the way kube-proxy
// does, as a block any proxy can import.
//
// A proxier keeps, per IP family, a ServiceChangeTracker and an
// EndpointsChangeTracker fed from informer event handlers, and a ServicePortMap
// and an EndpointsMap owned by its sync goroutine. Handlers record changes
// (cheaply, coalescing repeated changes to one object); the sync calls Update
// on each map, which applies only what changed and reports which Services
// changed, which UDP conntrack entries may be stale and the trigger times for
// latency metrics. CategorizeEndpoints then picks, for one service port, the
// endpoints this node should use under the traffic policies, topology hints
// and the terminating-endpoint fallback. NodeTopology follows this node's
// topology labels.
//
// The package needs only the k8s.io/api and k8s.io/apimachinery types: it
// compiles none of client-go's informers or clientset. The informer glue
// that feeds the trackers from an API server (ServiceConfig,
// EndpointSliceConfig, NodeConfig and the informer factories with
// kube-proxy's selectors) is in package
// github.com/proxykit/proxykit/proxier/config.
//
// Input is validated at the edge, as the API server of this module's
// Kubernetes line (1.37) validates it, because a proxier hands names and
// numbers to kernel tools (iptables-restore, nft, netlink) and one bad value
// must neither inject into nor break the sync of the others. The trackers
// refuse, with one log line at the default verbosity that names the object:
//   - a whole Service whose namespace, name or any port name is not a DNS-1123
//     label (names starting with a digit are accepted, as with KEP-5311's
//     relaxed Service names), whose ClientIP affinity timeout is outside
//     1..86400 seconds, whose session affinity is unknown, whose cluster IP
//     does not parse, is unspecified, loopback, link-local, multicast or
//     broadcast, is written as an IPv4-mapped IPv6 address, or is an
//     address of this node (WithNodeIPs; its rules would take the node's
//     own ports), or with an unparsable load-balancer source range
//     (dropping the range would open the load balancer to all);
//   - one port of a Service whose port, nodePort or targetPort is out of
//     range or whose protocol is not TCP, UDP or SCTP, keeping its other ports;
//   - one external IP or load-balancer ingress IP that does not parse or
//     is unspecified, loopback, link-local, multicast or broadcast (see
//     SpecialAddressReason; an address of the node is accepted there, as
//     the API server and kube-proxy accept it);
//   - a whole EndpointSlice whose namespace is not a DNS-1123 label, whose name
//     is not a DNS-1123 subdomain, whose kubernetes.io/service-name label is
//     missing or not a DNS-1123 label, or with a port name that is not a
//     DNS-1123 label or a protocol other than TCP, UDP and SCTP (an update to
//     such a slice removes its endpoints);
//   - one endpoint whose address does not parse or is unspecified, loopback,
//     link-local, multicast or broadcast, none of which can be a backend.
//
// The checks use k8s.io/apimachinery's validation helpers, so they accept
// what the API server accepts, with one exception on purpose: the special
// addresses above are refused wherever they appear, also where the API
// server checks only that an address parses (load-balancer ingress IPs,
// and cluster IPs, which it allocates but a caller's own objects need not
// come from it), because programming one would capture the node's own or
// local traffic. The trackers never panic on any input.
//
// Endpoint lists are kept in kube-proxy's order, by their "ip:port" strings
// (CompareHostPort), so that a node moved between kube-proxy and a proxier
// built on this package keeps its endpoint chains and dumps compare.
//
// It is not a proxier: it renders no rules, touches no kernel state and
// decides nothing about when to sync (see the runner package for that).
//
// The smallest use, in a sync function:
//
//	svcTracker := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil)
//	epTracker := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, nodeName, nil)
//	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
//	// informer handlers: svcTracker.Update(old, new); epTracker.EndpointSliceUpdate(slice, deleted)
//	svcMap.Update(svcTracker)
//	epMap.Update(epTracker)
//	for name, svc := range svcMap {
//		cluster, local, all, any := changetracker.CategorizeEndpoints(epMap[name], svc, nodeName, nodeLabels)
//		// program cluster/local/all into the kernel
//	}
//
// Dual-stack: use one tracker pair per family. A dual-stack Service shows up in
// both, a single-stack one only in its family's.
package changetracker
