package conntrack_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/conntrack/conntracktest"
)

// svc describes one port of a Service for the tests.
type svc struct {
	name        string // Service name, in namespace "ns"
	port        string // port name
	proto       v1.Protocol
	clusterIP   string
	portNum     int32
	nodePort    int32
	externalIPs []string
	lbIPs       []string
}

func (s svc) portName() changetracker.ServicePortName {
	return changetracker.ServicePortName{
		NamespacedName: types.NamespacedName{Namespace: "ns", Name: s.name},
		Port:           s.port,
		Protocol:       s.proto,
	}
}

// servicePortMap builds the ServicePortMap of family for the given ports,
// as the tracker would.
func servicePortMap(t testing.TB, family v1.IPFamily, ports ...svc) changetracker.ServicePortMap {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	m := changetracker.ServicePortMap{}
	for _, s := range ports {
		service := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: s.name},
			Spec: v1.ServiceSpec{
				Type:        v1.ServiceTypeClusterIP,
				ClusterIP:   s.clusterIP,
				ClusterIPs:  []string{s.clusterIP},
				ExternalIPs: s.externalIPs,
				Ports:       []v1.ServicePort{{Name: s.port, Protocol: s.proto, Port: s.portNum, NodePort: s.nodePort}},
			},
		}
		if s.nodePort != 0 {
			service.Spec.Type = v1.ServiceTypeNodePort
		}
		if len(s.lbIPs) > 0 {
			service.Spec.Type = v1.ServiceTypeLoadBalancer
			for _, ip := range s.lbIPs {
				service.Status.LoadBalancer.Ingress = append(service.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
			}
		}
		p, err := changetracker.NewBaseServicePort(logger, service, &service.Spec.Ports[0], family)
		if err != nil {
			t.Fatal(err)
		}
		m[s.portName()] = p
	}
	return m
}

// ep is an endpoint "ip:port", ready and serving unless said otherwise.
type ep struct {
	addr        string
	notServing  bool
	terminating bool
}

func endpoint(e ep) changetracker.Endpoint {
	ap := netip.MustParseAddrPort(e.addr)
	return changetracker.NewBaseEndpoint(changetracker.EndpointInfo{
		IP: ap.Addr(), Port: int(ap.Port()),
		Ready: !e.notServing && !e.terminating, Serving: !e.notServing, Terminating: e.terminating,
	})
}

// backends are the endpoints of one service port.
type backends struct {
	svc svc
	eps []ep
}

func endpointsMap(list ...backends) changetracker.EndpointsMap {
	m := changetracker.EndpointsMap{}
	for _, b := range list {
		name := b.svc.portName()
		m[name] = []changetracker.Endpoint{}
		for _, e := range b.eps {
			m[name] = append(m[name], endpoint(e))
		}
	}
	return m
}

// flow is a flow from client to frontend, DNATed to backend (or not NATed
// when backend is frontend).
func flow(proto conntrack.Protocol, client, frontend, backend string) conntrack.Flow {
	return conntracktest.NewFlow(proto, netip.MustParseAddrPort(client), netip.MustParseAddrPort(frontend), netip.MustParseAddrPort(backend))
}

func udp(client, frontend, backend string) conntrack.Flow {
	return flow(conntrack.ProtocolUDP, client, frontend, backend)
}

// lines renders flows as conntrack -L lines, for readable diffs.
func lines(flows []conntrack.Flow) []string {
	var out []string
	for _, f := range flows {
		out = append(out, f.String())
	}
	return out
}
