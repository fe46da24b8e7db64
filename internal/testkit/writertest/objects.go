package writertest

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ServiceOption changes a Service that Service makes.
type ServiceOption func(*v1.Service)

// Service makes a ClusterIP Service ns/name of one cluster IP with one TCP
// port "p" 80, then applies opts in order.
func Service(ns, name, clusterIP string, opts ...ServiceOption) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

// WithPorts replaces the Service's ports.
func WithPorts(ports ...v1.ServicePort) ServiceOption {
	return func(s *v1.Service) { s.Spec.Ports = ports }
}

// WithNodePort gives the Service's first port node port np, and makes a
// ClusterIP Service a NodePort one (a LoadBalancer stays one).
func WithNodePort(np int32) ServiceOption {
	return func(s *v1.Service) {
		if s.Spec.Type == v1.ServiceTypeClusterIP {
			s.Spec.Type = v1.ServiceTypeNodePort
		}
		s.Spec.Ports[0].NodePort = np
	}
}

// WithExternalIPs sets the Service's external IPs.
func WithExternalIPs(ips ...string) ServiceOption {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

// WithLoadBalancer makes the Service a LoadBalancer with one ingress VIP
// and the source ranges given (none: any source).
func WithLoadBalancer(vip string, ranges ...string) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: vip}}
		s.Spec.LoadBalancerSourceRanges = ranges
	}
}

// WithHealthCheckNodePort sets the Service's health check node port.
func WithHealthCheckNodePort(port int32) ServiceOption {
	return func(s *v1.Service) { s.Spec.HealthCheckNodePort = port }
}

// WithExternalLocal sets externalTrafficPolicy Local, and no health check
// node port: WithHealthCheckNodePort gives one.
func WithExternalLocal() ServiceOption {
	return func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
}

// WithInternalLocal sets internalTrafficPolicy Local.
func WithInternalLocal() ServiceOption {
	return func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
}

// WithAffinity sets ClientIP session affinity with a timeout of seconds.
func WithAffinity(seconds int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(seconds)}}
	}
}

// Endpoint is one endpoint of a slice: ready unless NotReady or
// Terminating (a terminating endpoint is still serving, a not-ready one
// is not).
type Endpoint struct {
	IP string
	// Node is the endpoint's node; empty leaves NodeName unset.
	Node        string
	NotReady    bool
	Terminating bool
	// ZoneHints are the zones the endpoint is hinted for (topology).
	ZoneHints []string
}

// SlicePort is a port of an EndpointSlice.
func SlicePort(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
}

// TCP8080 are the slice ports for Service's default port "p": TCP 8080. A
// test must not change them: every caller shares the slice.
var TCP8080 = []discoveryv1.EndpointPort{SlicePort("p", 8080, v1.ProtocolTCP)}

// Slice makes the EndpointSlice "svc-1" of Service ns/svc, of the address
// type of family, with ports and eps.
func Slice(family v1.IPFamily, ns, svc string, ports []discoveryv1.EndpointPort, eps ...Endpoint) *discoveryv1.EndpointSlice {
	at := discoveryv1.AddressTypeIPv4
	if family == v1.IPv6Protocol {
		at = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: svc + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: at,
		Ports:       ports,
	}
	for _, e := range eps {
		d := discoveryv1.Endpoint{
			Addresses: []string{e.IP},
			Conditions: discoveryv1.EndpointConditions{
				Ready:       ptr.To(!e.NotReady && !e.Terminating),
				Serving:     ptr.To(!e.NotReady),
				Terminating: ptr.To(e.Terminating),
			},
		}
		if e.Node != "" {
			d.NodeName = ptr.To(e.Node)
		}
		if len(e.ZoneHints) > 0 {
			d.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.ZoneHints {
				d.Hints.ForZones = append(d.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}
