package config

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
)

// makeService returns a ClusterIP Service ns/name on 10.96.0.10 with one
// TCP port "http" 80, changed by tweaks.
func makeService(ns, name string, tweaks ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, f := range tweaks {
		f(svc)
	}
	return svc
}

func withClusterIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ips[0]
	}
}

// ep is a ready endpoint on a node.
type ep struct{ addr, node string }

func readyEP(addr, node string) ep { return ep{addr: addr, node: node} }

type port struct {
	name  string
	port  int32
	proto v1.Protocol
}

func namedPort(name string, p int32, proto v1.Protocol) port {
	return port{name: name, port: p, proto: proto}
}

// makeSlice returns the EndpointSlice ns/name of Service svc.
func makeSlice(ns, svc, name string, at discoveryv1.AddressType, ports []port, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: at,
	}
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.name), Port: ptr.To(p.port), Protocol: ptr.To(p.proto)})
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.addr}, NodeName: ptr.To(e.node)})
	}
	return s
}

// describeServicePortMap renders a map as "ns/name:port/PROTO" to the
// port's String().
func describeServicePortMap(m changetracker.ServicePortMap) map[string]string {
	out := map[string]string{}
	for name, p := range m {
		out[fmt.Sprintf("%s/%s", name, name.Protocol)] = p.String()
	}
	return out
}

// describeEndpointsMap renders a map, keyed like describeServicePortMap,
// with each endpoint's address and flags.
func describeEndpointsMap(m changetracker.EndpointsMap) map[string][]string {
	out := map[string][]string{}
	for name, eps := range m {
		var list []string
		for _, e := range eps {
			var b strings.Builder
			b.WriteString(e.String())
			for _, f := range []struct {
				on   bool
				name string
			}{{e.IsLocal(), "local"}, {e.IsReady(), "ready"}, {e.IsServing(), "serving"}, {e.IsTerminating(), "terminating"}} {
				if f.on {
					b.WriteString(" " + f.name)
				}
			}
			if e.NodeName() != "" {
				b.WriteString(" node=" + e.NodeName())
			}
			list = append(list, b.String())
		}
		out[fmt.Sprintf("%s/%s", name, name.Protocol)] = list
	}
	return out
}
