package changetracker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// defaultStickyMaxAgeSeconds is the API server's default for
// sessionAffinityConfig.clientIP.timeoutSeconds (three hours). It is used when
// a Service asks for ClientIP affinity but the config is missing, which the API
// server never allows but a hand-written manifest might.
const defaultStickyMaxAgeSeconds = 10800

// ServicePortName names one port of one Service: the Service's namespace and
// name, the port's name (empty for a Service's single unnamed port) and its
// protocol. It is the key of ServicePortMap and EndpointsMap.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

// String returns "namespace/name:port", or "namespace/name" when the port is
// unnamed. The protocol is not part of the string, as in kube-proxy, so two
// ports that differ only by protocol print the same.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// CompareServicePortNames orders service port names by namespace, name,
// port name and protocol, each compared as a string, for slices.SortFunc.
// It returns 0 only for equal names.
func CompareServicePortNames(a, b ServicePortName) int {
	if c := CompareNamespacedNames(a.NamespacedName, b.NamespacedName); c != 0 {
		return c
	}
	if c := strings.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	return strings.Compare(string(a.Protocol), string(b.Protocol))
}

// CompareNamespacedNames orders Service names by namespace, then name, for
// slices.SortFunc. It returns 0 only for equal names.
func CompareNamespacedNames(a, b types.NamespacedName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// ChangedServices returns dst[:0] with every Service in svc.UpdatedServices
// or eps.UpdatedServices once, sorted by CompareNamespacedNames: the Services
// a partial sync rewrites. It costs the size of the change, not of the maps,
// and reuses dst's array when it is large enough; nil sets count as empty.
func ChangedServices(dst []types.NamespacedName, svc UpdateServiceMapResult, eps UpdateEndpointsMapResult) []types.NamespacedName {
	dst = dst[:0]
	for nn := range svc.UpdatedServices {
		dst = append(dst, nn)
	}
	for nn := range eps.UpdatedServices {
		if !svc.UpdatedServices.Has(nn) {
			dst = append(dst, nn)
		}
	}
	slices.SortFunc(dst, CompareNamespacedNames)
	return dst
}

// ServicePort is what a proxier needs to know about one port of one Service, in
// one IP family. The tracker builds a BaseServicePort for each port and hands
// it to the MakeServicePortFunc, which may wrap it in a type of its own that
// embeds *BaseServicePort and precomputes backend data (chain names, for
// example).
//
// Values are immutable once built: a change to the Service produces new
// values. Slices returned by the methods are shared and must not be modified.
type ServicePort interface {
	// String returns "clusterIP:port/protocol", e.g. "10.96.0.1:80/TCP" or
	// "[fd00::1]:80/UDP".
	String() string
	// ClusterIP returns the Service's cluster IP in the tracker's IP family.
	ClusterIP() netip.Addr
	// Port returns the Service port number.
	Port() int
	// Protocol returns the port's protocol (TCP, UDP or SCTP).
	Protocol() v1.Protocol
	// SessionAffinityType returns the Service's session affinity (None or ClientIP).
	SessionAffinityType() v1.ServiceAffinity
	// StickyMaxAgeSeconds returns the ClientIP affinity timeout, or 0 when the
	// affinity is not ClientIP.
	StickyMaxAgeSeconds() int
	// ExternalIPs returns the Service's external IPs of the tracker's family;
	// nil when there are none. Unparsable addresses and addresses that cannot
	// be a service address (unspecified, loopback, link-local, multicast,
	// broadcast) are logged and dropped.
	ExternalIPs() []netip.Addr
	// LoadBalancerVIPs returns the load-balancer ingress IPs of the tracker's
	// family, leaving out ingress points whose ipMode is Proxy; nil when none.
	// Unparsable addresses and addresses that cannot be a service address
	// (see SpecialAddressReason) are logged and dropped.
	LoadBalancerVIPs() []netip.Addr
	// LoadBalancerSourceRanges returns spec.loadBalancerSourceRanges of the
	// tracker's family, parsed as prefixes (a Service with an unparsable
	// range is refused by the tracker). nil means no restriction from this
	// family's point of view.
	LoadBalancerSourceRanges() []netip.Prefix
	// HealthCheckNodePort returns the health-check node port of a LoadBalancer
	// Service with externalTrafficPolicy Local, 0 otherwise.
	HealthCheckNodePort() int
	// NodePort returns the port's node port, 0 when it has none.
	NodePort() int
	// ExternalPolicyLocal reports whether externalTrafficPolicy is Local for a
	// Service that can receive external traffic (NodePort, LoadBalancer, or
	// with external IPs).
	ExternalPolicyLocal() bool
	// InternalPolicyLocal reports whether internalTrafficPolicy is Local.
	InternalPolicyLocal() bool
	// TrafficDistribution returns spec.trafficDistribution as written ("" when
	// unset). Topology decisions are made from endpoint hints, see
	// CategorizeEndpoints; this value is informational.
	TrafficDistribution() string
	// ExternallyAccessible reports whether the port has a node port, a
	// load-balancer VIP or an external IP of this family.
	ExternallyAccessible() bool
	// UsesClusterEndpoints reports whether some traffic to this port is
	// routed to endpoints anywhere in the cluster.
	UsesClusterEndpoints() bool
	// UsesLocalEndpoints reports whether some traffic to this port is routed
	// only to endpoints on this node.
	UsesLocalEndpoints() bool
}

// MakeServicePortFunc turns the BaseServicePort built for one port of a
// Service into the ServicePort stored in the ServicePortMap. It is called from
// ServiceChangeTracker.Update, on the informer's goroutine. Returning nil drops
// the port. A nil MakeServicePortFunc stores the *BaseServicePort itself.
//
// The values it returns decide what counts as a change: when a Service is
// updated, ServiceChangeTracker.Update drops the change if every port built
// for the new Service equals the one built for the last applied state, and
// ports of a custom type are compared with reflect.DeepEqual (the
// *BaseServicePort values by their fields). So, in the custom type:
//   - a non-nil func field is never equal to anything, itself included: every
//     update of the Service, even one that touches only its status or
//     labels, is then recorded as a change and costs a sync of it. Keep funcs
//     out of the type (compute in the backend, or store a value the func
//     would return);
//   - a pointer field is compared by what it points to, not by address: two
//     ports pointing at distinct but equal values are equal, and a value
//     shared between ports and mutated later changes the old port as well as
//     the new one, so the change can go unseen. Point only at immutable data;
//   - unexported fields, nil versus empty slices and maps, and channels (by
//     identity) take part in the comparison too, so build the same input into
//     the same value every time.
type MakeServicePortFunc func(port *v1.ServicePort, service *v1.Service, bsvcPortInfo *BaseServicePort) ServicePort

// BaseServicePort is the tracker's own ServicePort. Embed *BaseServicePort in a
// type of your own to add fields; its methods then satisfy ServicePort.
type BaseServicePort struct {
	str                      string
	clusterIP                netip.Addr
	port                     int
	nodePort                 int
	healthCheckNodePort      int
	stickyMaxAgeSeconds      int
	protocol                 v1.Protocol
	sessionAffinityType      v1.ServiceAffinity
	trafficDistribution      string
	externalIPs              []netip.Addr
	loadBalancerVIPs         []netip.Addr
	loadBalancerSourceRanges []netip.Prefix
	externalPolicyLocal      bool
	internalPolicyLocal      bool
}

var _ ServicePort = (*BaseServicePort)(nil)

// String is part of ServicePort.
func (p *BaseServicePort) String() string { return p.str }

// ClusterIP is part of ServicePort.
func (p *BaseServicePort) ClusterIP() netip.Addr { return p.clusterIP }

// Port is part of ServicePort.
func (p *BaseServicePort) Port() int { return p.port }

// Protocol is part of ServicePort.
func (p *BaseServicePort) Protocol() v1.Protocol { return p.protocol }

// SessionAffinityType is part of ServicePort.
func (p *BaseServicePort) SessionAffinityType() v1.ServiceAffinity { return p.sessionAffinityType }

// StickyMaxAgeSeconds is part of ServicePort.
func (p *BaseServicePort) StickyMaxAgeSeconds() int { return p.stickyMaxAgeSeconds }

// ExternalIPs is part of ServicePort.
func (p *BaseServicePort) ExternalIPs() []netip.Addr { return p.externalIPs }

// LoadBalancerVIPs is part of ServicePort.
func (p *BaseServicePort) LoadBalancerVIPs() []netip.Addr { return p.loadBalancerVIPs }

// LoadBalancerSourceRanges is part of ServicePort.
func (p *BaseServicePort) LoadBalancerSourceRanges() []netip.Prefix {
	return p.loadBalancerSourceRanges
}

// HealthCheckNodePort is part of ServicePort.
func (p *BaseServicePort) HealthCheckNodePort() int { return p.healthCheckNodePort }

// NodePort is part of ServicePort.
func (p *BaseServicePort) NodePort() int { return p.nodePort }

// ExternalPolicyLocal is part of ServicePort.
func (p *BaseServicePort) ExternalPolicyLocal() bool { return p.externalPolicyLocal }

// InternalPolicyLocal is part of ServicePort.
func (p *BaseServicePort) InternalPolicyLocal() bool { return p.internalPolicyLocal }

// TrafficDistribution is part of ServicePort.
func (p *BaseServicePort) TrafficDistribution() string { return p.trafficDistribution }

// ExternallyAccessible is part of ServicePort.
func (p *BaseServicePort) ExternallyAccessible() bool {
	return p.nodePort != 0 || len(p.loadBalancerVIPs) != 0 || len(p.externalIPs) != 0
}

// UsesClusterEndpoints is part of ServicePort. An externally accessible port
// uses cluster endpoints even with externalTrafficPolicy Local, because
// traffic from inside the cluster to its external addresses is short-circuited
// to all endpoints.
func (p *BaseServicePort) UsesClusterEndpoints() bool {
	return !p.internalPolicyLocal || p.ExternallyAccessible()
}

// UsesLocalEndpoints is part of ServicePort.
func (p *BaseServicePort) UsesLocalEndpoints() bool {
	return p.internalPolicyLocal || (p.externalPolicyLocal && p.ExternallyAccessible())
}

// equal reports whether two base ports describe the same thing.
func (p *BaseServicePort) equal(o *BaseServicePort) bool {
	return p.str == o.str &&
		p.clusterIP == o.clusterIP &&
		p.port == o.port &&
		p.nodePort == o.nodePort &&
		p.healthCheckNodePort == o.healthCheckNodePort &&
		p.stickyMaxAgeSeconds == o.stickyMaxAgeSeconds &&
		p.protocol == o.protocol &&
		p.sessionAffinityType == o.sessionAffinityType &&
		p.trafficDistribution == o.trafficDistribution &&
		p.externalPolicyLocal == o.externalPolicyLocal &&
		p.internalPolicyLocal == o.internalPolicyLocal &&
		slices.Equal(p.externalIPs, o.externalIPs) &&
		slices.Equal(p.loadBalancerVIPs, o.loadBalancerVIPs) &&
		slices.Equal(p.loadBalancerSourceRanges, o.loadBalancerSourceRanges)
}

// NewBaseServicePort builds the BaseServicePort for one port of service in the
// given IP family, exactly as ServiceChangeTracker does. It returns an error,
// naming the Service, when the Service is not proxied in that family (headless,
// ExternalName, or without a cluster IP of the family) and when the API server
// would refuse the Service or the port: a namespace, name or port name that is
// not a DNS-1123 label, an unparsable cluster IP or load-balancer source
// range, a cluster IP that is unspecified, loopback, link-local, multicast,
// broadcast or written as an IPv4-mapped IPv6 address (any of the
// Service's cluster IPs, in either family), a ClientIP affinity timeout
// outside 1..86400 seconds, a port,
// nodePort or targetPort out of range, or a protocol other than TCP, UDP and
// SCTP. Bad addresses that only narrow what the Service exposes (an external
// IP or load-balancer ingress IP that does not parse or is unspecified,
// loopback, link-local, multicast or broadcast; a missing health-check
// node port) are logged through logger and left out. It knows no node
// addresses: see WithNodeIPs for the trackers' check of those.
func NewBaseServicePort(logger klog.Logger, service *v1.Service, port *v1.ServicePort, ipFamily v1.IPFamily) (*BaseServicePort, error) {
	if service == nil || port == nil {
		return nil, fmt.Errorf("nil service or service port")
	}
	if err := validateServiceObject(service); err != nil {
		return nil, fmt.Errorf("service %s: %w", logsafe.KObj(service), err)
	}
	if err := validateServicePortNumbers(port); err != nil {
		return nil, fmt.Errorf("service %s port %q: %w", logsafe.KObj(service), port.Name, err)
	}
	if port.Protocol != "" && !validProtocol(port.Protocol) {
		return nil, fmt.Errorf("service %s port %q: %w", logsafe.KObj(service), port.Name, invalidf("protocol %q: must be TCP, UDP or SCTP", port.Protocol))
	}
	clusterIP, err := serviceClusterIP(service, ipFamily, nil)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", logsafe.KObj(service), err)
	}
	w, err := serviceWide(logger, service, ipFamily)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", logsafe.KObj(service), err)
	}
	return newBaseServicePort(service, port, clusterIP, w), nil
}

// serviceWideInfo holds what all ports of one Service share, so that it is
// parsed once per Service rather than once per port.
type serviceWideInfo struct {
	externalIPs              []netip.Addr
	loadBalancerVIPs         []netip.Addr
	loadBalancerSourceRanges []netip.Prefix
	stickyMaxAgeSeconds      int
	healthCheckNodePort      int
	externalPolicyLocal      bool
	internalPolicyLocal      bool
}

// serviceWide parses the Service-wide fields for ipFamily. It returns an
// error for an unparsable load-balancer source range: leaving the range out
// would open the load balancer to every source, so the Service is refused,
// as the API server would refuse it. Other bad addresses are logged and
// left out, which only narrows what the Service exposes.
func serviceWide(logger klog.Logger, service *v1.Service, ipFamily v1.IPFamily) (serviceWideInfo, error) {
	var w serviceWideInfo
	spec := &service.Spec
	if spec.SessionAffinity == v1.ServiceAffinityClientIP {
		w.stickyMaxAgeSeconds = defaultStickyMaxAgeSeconds
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			w.stickyMaxAgeSeconds = int(*c.ClientIP.TimeoutSeconds)
		}
	}
	for _, s := range spec.ExternalIPs {
		ip, ok := parseAddr(s)
		if !ok {
			logger.Error(nil, "Ignoring unparsable external IP", "service", logsafe.KObj(service), "externalIP", logsafe.Quote(s))
			continue
		}
		if reason := SpecialAddressReason(ip); reason != "" {
			// Rules for such an address would capture the node's own
			// traffic, which is why the API server refuses them.
			logger.Error(nil, "Ignoring invalid external IP", "service", logsafe.KObj(service), "externalIP", logsafe.Quote(s), "reason", reason)
			continue
		}
		if familyOf(ip) == ipFamily {
			w.externalIPs = append(w.externalIPs, ip)
		}
	}
	for _, ing := range service.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue
		}
		// ipMode Proxy means the load balancer delivers traffic to the node
		// itself, so the VIP must not be short-circuited on the node (KEP-1860,
		// kubernetes#97681).
		if ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
			continue
		}
		ip, ok := parseAddr(ing.IP)
		if !ok {
			logger.Error(nil, "Ignoring unparsable load-balancer ingress IP", "service", logsafe.KObj(service), "ip", logsafe.Quote(ing.IP))
			continue
		}
		if reason := SpecialAddressReason(ip); reason != "" {
			// The API server checks only that the status holds an IP, but
			// a load balancer cannot have such a VIP, and rules for it
			// would catch the node's own traffic, as for external IPs.
			logger.Error(nil, "Ignoring invalid load-balancer ingress IP", "service", logsafe.KObj(service), "ip", logsafe.Quote(ing.IP), "reason", reason)
			continue
		}
		if familyOf(ip) == ipFamily {
			w.loadBalancerVIPs = append(w.loadBalancerVIPs, ip)
		}
	}
	for _, s := range spec.LoadBalancerSourceRanges {
		// API validation has long let whitespace around the range through.
		pfx, ok := parsePrefix(strings.TrimSpace(s))
		if !ok {
			return serviceWideInfo{}, invalidf("loadBalancerSourceRanges entry %q: not a CIDR", s)
		}
		if familyOf(pfx.Addr()) == ipFamily {
			w.loadBalancerSourceRanges = append(w.loadBalancerSourceRanges, pfx)
		}
	}
	externallyReachable := spec.Type == v1.ServiceTypeNodePort || spec.Type == v1.ServiceTypeLoadBalancer || len(spec.ExternalIPs) > 0
	w.externalPolicyLocal = externallyReachable && spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	w.internalPolicyLocal = spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	if spec.Type == v1.ServiceTypeLoadBalancer && w.externalPolicyLocal {
		if spec.HealthCheckNodePort <= 0 || spec.HealthCheckNodePort > 65535 {
			logger.Error(nil, "Service has no valid health-check node port", "service", logsafe.KObj(service), "healthCheckNodePort", spec.HealthCheckNodePort)
		} else {
			w.healthCheckNodePort = int(spec.HealthCheckNodePort)
		}
	}
	return w, nil
}

func newBaseServicePort(service *v1.Service, port *v1.ServicePort, clusterIP netip.Addr, w serviceWideInfo) *BaseServicePort {
	p := &BaseServicePort{
		clusterIP:                clusterIP,
		port:                     int(port.Port),
		nodePort:                 int(port.NodePort),
		protocol:                 port.Protocol,
		sessionAffinityType:      service.Spec.SessionAffinity,
		stickyMaxAgeSeconds:      w.stickyMaxAgeSeconds,
		externalIPs:              w.externalIPs,
		loadBalancerVIPs:         w.loadBalancerVIPs,
		loadBalancerSourceRanges: w.loadBalancerSourceRanges,
		healthCheckNodePort:      w.healthCheckNodePort,
		externalPolicyLocal:      w.externalPolicyLocal,
		internalPolicyLocal:      w.internalPolicyLocal,
	}
	if p.protocol == "" {
		// The API server defaults the protocol; a manifest may not.
		p.protocol = v1.ProtocolTCP
	}
	if p.sessionAffinityType == "" {
		p.sessionAffinityType = v1.ServiceAffinityNone
	}
	if service.Spec.TrafficDistribution != nil {
		p.trafficDistribution = *service.Spec.TrafficDistribution
	}
	p.str = servicePortString(clusterIP, p.port, p.protocol)
	return p
}

// servicePortString formats "ip:port/proto" with one allocation.
func servicePortString(ip netip.Addr, port int, proto v1.Protocol) string {
	b := appendHostPort(make([]byte, 0, 48), ip, port)
	b = append(b, '/')
	b = append(b, proto...)
	return string(b)
}

// serviceClusterIP returns the Service's cluster IP of ipFamily, or an error
// saying why the Service is not proxied in that family. Every cluster IP
// of the Service is checked (see checkClusterIP), whatever its family: the
// API server would refuse the whole object for one bad address, so the
// trackers of both families refuse it alike.
func serviceClusterIP(service *v1.Service, ipFamily v1.IPFamily, nodeIPs []netip.Addr) (netip.Addr, error) {
	if service.Spec.Type == v1.ServiceTypeExternalName {
		return netip.Addr{}, errExternalName
	}
	if service.Spec.ClusterIP == v1.ClusterIPNone {
		return netip.Addr{}, errHeadless
	}
	ips := service.Spec.ClusterIPs
	if len(ips) == 0 && service.Spec.ClusterIP != "" {
		ips = []string{service.Spec.ClusterIP}
	}
	if len(ips) == 0 {
		return netip.Addr{}, errNoClusterIP
	}
	var found netip.Addr
	for _, s := range ips {
		if s == v1.ClusterIPNone {
			return netip.Addr{}, errHeadless
		}
		ip, ok := parseAddr(s)
		if !ok {
			return netip.Addr{}, invalidf("unparsable cluster IP %q", s)
		}
		if err := checkClusterIP(s, ip, nodeIPs); err != nil {
			return netip.Addr{}, err
		}
		if !found.IsValid() && familyOf(ip) == ipFamily {
			found = ip
		}
	}
	if !found.IsValid() {
		return netip.Addr{}, fmt.Errorf("no cluster IP of family %q", ipFamily)
	}
	return found, nil
}
