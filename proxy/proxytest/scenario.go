package proxytest

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/proxy"
)

// NodeName is the name of the node the suite's Backends serve (the Name
// of the NodeConfig Suite.New is given): the endpoints on it are local.
const NodeName = "node-a"

// namespace holds every object of the scenario.
const namespace = "ns"

// node returns the NodeConfig Suite.New is given: the pod network of
// each family, so that the masquerading of traffic from outside it is
// exercised.
func node() proxy.NodeConfig {
	return proxy.NodeConfig{
		Name:         NodeName,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
	}
}

// nodeIPs are the node's addresses in the inputs, and movedNodeIPs what
// they become when the check of node changes moves the node.
var (
	nodeIPs      = []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00:1::10")}
	movedNodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.11"), netip.MustParseAddr("fd00:1::11")}
	nodeLabels   = map[string]string{v1.LabelTopologyZone: "zone-a"}
	movedLabels  = map[string]string{v1.LabelTopologyZone: "zone-b"}
)

// step is one batch of informer events between two syncs.
type step struct {
	name    string
	changes []change
}

// start is the cluster's state before the first sync: a dual-stack
// ClusterIP Service, a single-stack IPv4 one with UDP, TCP and SCTP ports
// and endpoints hinted for zones (so that the node's zone decides which
// it uses), a dual-stack LoadBalancer with externalTrafficPolicy Local, and an
// IPv6-only one with an external IP and ClientIP affinity, each with
// endpoints local and remote.
func start() []change {
	return []change{
		{svc: web(portHTTP(80))},
		{slice: slice("web", v1.IPv4Protocol, []discoveryv1.EndpointPort{epPort("http", 8080)}, ready(1), localReady(2))},
		{slice: slice("web", v1.IPv6Protocol, []discoveryv1.EndpointPort{epPort("http", 8080)}, ready(1), localReady(2))},
		{svc: dns()},
		{slice: slice("dns", v1.IPv4Protocol, dnsPorts(), hinted(ready(3), "zone-a"), hinted(ready(4), "zone-b"))},
		{svc: shop(true)},
		{slice: slice("shop", v1.IPv4Protocol, []discoveryv1.EndpointPort{epPort("http", 8080)}, localReady(5), ready(6))},
		{slice: slice("shop", v1.IPv6Protocol, []discoveryv1.EndpointPort{epPort("http", 8080)}, localReady(5), ready(6))},
		{svc: sixOnly()},
		{slice: slice("six", v1.IPv6Protocol, []discoveryv1.EndpointPort{epPort("https", 8443)}, ready(7))},
	}
}

// scenario is what changes after start, one step per sync. Some steps
// change one family alone, so that a Backend of two families gets a Sync
// in which one input has no changes.
func scenario() []step {
	webPorts := []discoveryv1.EndpointPort{epPort("http", 8080)}
	webPorts2 := []discoveryv1.EndpointPort{epPort("http", 8080), epPort("grpc", 50051)}
	apiPorts := []discoveryv1.EndpointPort{epPort("http", 8080)}
	return []step{
		{"an endpoint added to a Service", []change{
			{slice: slice("web", v1.IPv4Protocol, webPorts, ready(1), localReady(2), ready(8))},
			{slice: slice("web", v1.IPv6Protocol, webPorts, ready(1), localReady(2), ready(8))},
		}},
		{"endpoints terminating, not ready and removed", []change{
			{slice: slice("web", v1.IPv4Protocol, webPorts, terminating(1), localReady(2), notReady(8))},
			{slice: slice("web", v1.IPv6Protocol, webPorts, terminating(1), localReady(2), notReady(8))},
			{slice: slice("dns", v1.IPv4Protocol, dnsPorts(), hinted(ready(3), "zone-a"))},
		}},
		{"Services added with their endpoints", []change{
			{svc: api()},
			{slice: slice("api", v1.IPv4Protocol, apiPorts, ready(9), localReady(10))},
			{slice: slice("api", v1.IPv6Protocol, apiPorts, ready(9))},
			{svc: external()},
			{slice: slice("external", v1.IPv4Protocol, []discoveryv1.EndpointPort{epPort("http", 8080)}, localReady(11))},
		}},
		{"a port added and a port number changed", []change{
			{svc: web(portHTTP(8000), v1.ServicePort{Name: "grpc", Protocol: v1.ProtocolTCP, Port: 50051, TargetPort: intstr.FromInt32(50051)})},
			{slice: slice("web", v1.IPv4Protocol, webPorts2, terminating(1), localReady(2), notReady(8))},
			{slice: slice("web", v1.IPv6Protocol, webPorts2, terminating(1), localReady(2), notReady(8))},
		}},
		{"a LoadBalancer becomes a ClusterIP Service", []change{
			{svc: shop(false)},
		}},
		{"a Service's endpoints removed", []change{
			{slice: slice("six", v1.IPv6Protocol, nil), delete: true},
		}},
		{"a Service removed, its endpoints left", []change{
			{svc: api(), delete: true},
		}},
		{"the left endpoints removed, a Service's endpoints back", []change{
			{slice: slice("api", v1.IPv4Protocol, nil), delete: true},
			{slice: slice("api", v1.IPv6Protocol, nil), delete: true},
			{slice: slice("six", v1.IPv6Protocol, []discoveryv1.EndpointPort{epPort("https", 8443)}, ready(7), localReady(12))},
		}},
		{"an IPv4 change alone", []change{
			{slice: slice("dns", v1.IPv4Protocol, dnsPorts(), hinted(ready(3), "zone-a"), hinted(localReady(13), "zone-a"))},
		}},
		{"a Service removed with its endpoints", []change{
			{svc: web(), delete: true},
			{slice: slice("web", v1.IPv4Protocol, nil), delete: true},
			{slice: slice("web", v1.IPv6Protocol, nil), delete: true},
		}},
	}
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}

func portHTTP(port int32) v1.ServicePort {
	return v1.ServicePort{Name: "http", Protocol: v1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(8080)}
}

// clusterIPs makes spec's addresses ips (the primary first).
func clusterIPs(spec *v1.ServiceSpec, ips ...string) {
	spec.ClusterIP, spec.ClusterIPs = ips[0], ips
	for _, ip := range ips {
		spec.IPFamilies = append(spec.IPFamilies, proxy.FamilyOf(netip.MustParseAddr(ip)))
	}
	policy := v1.IPFamilyPolicySingleStack
	if len(ips) > 1 {
		policy = v1.IPFamilyPolicyPreferDualStack
	}
	spec.IPFamilyPolicy = &policy
}

func web(ports ...v1.ServicePort) *v1.Service {
	s := &v1.Service{ObjectMeta: meta("web"), Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: ports}}
	clusterIPs(&s.Spec, "10.96.0.10", "fd00:10:96::10")
	return s
}

func dns() *v1.Service {
	s := &v1.Service{ObjectMeta: meta("dns"), Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: []v1.ServicePort{
		{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)},
		{Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(5353)},
		{Name: "sctp", Protocol: v1.ProtocolSCTP, Port: 9999, TargetPort: intstr.FromInt32(9999)},
	}}}
	clusterIPs(&s.Spec, "10.96.0.53")
	return s
}

func dnsPorts() []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{
		{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To[int32](5353)},
		{Name: ptr.To("dns-tcp"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](5353)},
		{Name: ptr.To("sctp"), Protocol: ptr.To(v1.ProtocolSCTP), Port: ptr.To[int32](9999)},
	}
}

// shop is a dual-stack LoadBalancer with externalTrafficPolicy Local and
// source ranges, or, when lb is false, the ClusterIP Service it becomes.
func shop(lb bool) *v1.Service {
	s := &v1.Service{ObjectMeta: meta("shop"), Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: []v1.ServicePort{portHTTP(80)}}}
	clusterIPs(&s.Spec, "10.96.0.20", "fd00:10:96::20")
	if lb {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
		s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/64"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.10"}, {IP: "2001:db8::10"}}
	}
	return s
}

// sixOnly is an IPv6 ClusterIP Service with an external IP and ClientIP
// session affinity.
func sixOnly() *v1.Service {
	s := &v1.Service{ObjectMeta: meta("six"), Spec: v1.ServiceSpec{
		Type:            v1.ServiceTypeClusterIP,
		Ports:           []v1.ServicePort{{Name: "https", Protocol: v1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(8443)}},
		ExternalIPs:     []string{"2001:db8::20"},
		SessionAffinity: v1.ServiceAffinityClientIP,
		SessionAffinityConfig: &v1.SessionAffinityConfig{
			ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)},
		},
	}}
	clusterIPs(&s.Spec, "fd00:10:96::30")
	return s
}

// api is a dual-stack NodePort Service.
func api() *v1.Service {
	s := &v1.Service{ObjectMeta: meta("api"), Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, Ports: []v1.ServicePort{portHTTP(80)}}}
	s.Spec.Ports[0].NodePort = 30081
	clusterIPs(&s.Spec, "10.96.0.40", "fd00:10:96::40")
	return s
}

// external is an IPv4 ClusterIP Service with an external IP and
// externalTrafficPolicy Local.
func external() *v1.Service {
	s := &v1.Service{ObjectMeta: meta("external"), Spec: v1.ServiceSpec{
		Type:                  v1.ServiceTypeClusterIP,
		Ports:                 []v1.ServicePort{portHTTP(80)},
		ExternalIPs:           []string{"198.51.100.7"},
		ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
	}}
	clusterIPs(&s.Spec, "10.96.0.50")
	return s
}

func epPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(port)}
}

// endpoint is endpoint n of the scenario: pod n has 10.244.1.n and
// fd00:10:244:1::n, and runs on this node when local is set.
type endpoint struct {
	n                           int
	local                       bool
	ready, serving, terminating bool
	// zone, when set, is the zone the endpoint is hinted for.
	zone string
}

func hinted(e endpoint, zone string) endpoint { e.zone = zone; return e }

func ready(n int) endpoint       { return endpoint{n: n, ready: true, serving: true} }
func localReady(n int) endpoint  { return endpoint{n: n, local: true, ready: true, serving: true} }
func terminating(n int) endpoint { return endpoint{n: n, serving: true, terminating: true} }
func notReady(n int) endpoint    { return endpoint{n: n} }

// slice is the EndpointSlice of family of Service svc; the ports and
// endpoints do not matter for a deletion.
func slice(svc string, family v1.IPFamily, ports []discoveryv1.EndpointPort, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  meta(fmt.Sprintf("%s-%s", svc, map[v1.IPFamily]string{v1.IPv4Protocol: "v4", v1.IPv6Protocol: "v6"}[family])),
		AddressType: discoveryv1.AddressType(family),
		Ports:       ports,
	}
	s.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	for _, e := range eps {
		addr := fmt.Sprintf("10.244.1.%d", e.n)
		if family == v1.IPv6Protocol {
			addr = fmt.Sprintf("fd00:10:244:1::%d", e.n)
		}
		node := "node-b"
		if e.local {
			node = NodeName
		}
		ep := discoveryv1.Endpoint{
			Addresses: []string{addr},
			NodeName:  ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr.To(e.ready), Serving: ptr.To(e.serving), Terminating: ptr.To(e.terminating),
			},
		}
		if e.zone != "" {
			ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.zone}}}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}
