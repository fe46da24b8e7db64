package changetracker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

func TestCompareServicePortNames(t *testing.T) {
	name := func(ns, n, port string, proto v1.Protocol) ServicePortName {
		return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: n}, Port: port, Protocol: proto}
	}
	// Each name sorts before the next: namespace first, then name, port
	// name and protocol.
	ordered := []ServicePortName{
		name("a", "z", "z", v1.ProtocolUDP),
		name("b", "a", "z", v1.ProtocolUDP),
		name("b", "b", "", v1.ProtocolUDP),
		name("b", "b", "http", v1.ProtocolSCTP),
		name("b", "b", "http", v1.ProtocolTCP),
		name("b", "b", "http", v1.ProtocolUDP),
	}
	for i, a := range ordered {
		for j, b := range ordered {
			if got, want := CompareServicePortNames(a, b), cmpInt(i, j); got != want {
				t.Errorf("CompareServicePortNames(%v/%s, %v/%s) = %d, want %d", a, a.Protocol, b, b.Protocol, got, want)
			}
		}
	}
}

func cmpInt(i, j int) int {
	switch {
	case i < j:
		return -1
	case i > j:
		return 1
	}
	return 0
}

func TestChangedServices(t *testing.T) {
	nn := func(ns, n string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: n} }
	tests := []struct {
		name     string
		svc, eps []types.NamespacedName
		want     []types.NamespacedName
	}{
		{name: "none", want: []types.NamespacedName{}},
		{name: "services only", svc: []types.NamespacedName{nn("b", "a"), nn("a", "b")}, want: []types.NamespacedName{nn("a", "b"), nn("b", "a")}},
		{name: "endpoints only", eps: []types.NamespacedName{nn("a", "b"), nn("a", "a")}, want: []types.NamespacedName{nn("a", "a"), nn("a", "b")}},
		{
			name: "both, overlapping once",
			svc:  []types.NamespacedName{nn("ns", "x"), nn("ns", "y")},
			eps:  []types.NamespacedName{nn("ns", "y"), nn("ms", "z")},
			want: []types.NamespacedName{nn("ms", "z"), nn("ns", "x"), nn("ns", "y")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := UpdateServiceMapResult{UpdatedServices: sets.New(tt.svc...)}
			eps := UpdateEndpointsMapResult{UpdatedServices: sets.New(tt.eps...)}
			// A dst with stale content and room: the result reuses it from
			// its start.
			dst := make([]types.NamespacedName, 1, 8)
			dst[0] = nn("stale", "stale")
			got := ChangedServices(dst, svc, eps)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ChangedServices (-want +got):\n%s", diff)
			}
			if len(got) > 0 && &got[0] != &dst[0] {
				t.Error("ChangedServices did not reuse dst's array")
			}
			if !slices.IsSortedFunc(got, CompareNamespacedNames) {
				t.Errorf("ChangedServices = %v, not sorted", got)
			}
		})
	}
	if got := ChangedServices(nil, UpdateServiceMapResult{}, UpdateEndpointsMapResult{}); len(got) != 0 {
		t.Errorf("ChangedServices of nil sets = %v, want none", got)
	}
}

func TestServicePortNameString(t *testing.T) {
	nn := types.NamespacedName{Namespace: "ns", Name: "svc"}
	tests := []struct {
		name ServicePortName
		want string
	}{
		{ServicePortName{NamespacedName: nn, Port: "http", Protocol: v1.ProtocolTCP}, "ns/svc:http"},
		{ServicePortName{NamespacedName: nn, Protocol: v1.ProtocolUDP}, "ns/svc"},
	}
	for _, tc := range tests {
		if got := tc.name.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// portView is everything a ServicePort reports, in diffable form.
type portView struct {
	String               string
	ClusterIP            string
	Port, NodePort       int
	HealthCheckNodePort  int
	StickyMaxAgeSeconds  int
	Protocol             v1.Protocol
	Affinity             v1.ServiceAffinity
	ExternalIPs          []string
	LoadBalancerVIPs     []string
	SourceRanges         []string
	ExternalPolicyLocal  bool
	InternalPolicyLocal  bool
	TrafficDistribution  string
	ExternallyAccessible bool
	UsesCluster          bool
	UsesLocal            bool
}

func viewPort(p ServicePort) portView {
	v := portView{
		String:               p.String(),
		ClusterIP:            p.ClusterIP().String(),
		Port:                 p.Port(),
		NodePort:             p.NodePort(),
		HealthCheckNodePort:  p.HealthCheckNodePort(),
		StickyMaxAgeSeconds:  p.StickyMaxAgeSeconds(),
		Protocol:             p.Protocol(),
		Affinity:             p.SessionAffinityType(),
		ExternalPolicyLocal:  p.ExternalPolicyLocal(),
		InternalPolicyLocal:  p.InternalPolicyLocal(),
		TrafficDistribution:  p.TrafficDistribution(),
		ExternallyAccessible: p.ExternallyAccessible(),
		UsesCluster:          p.UsesClusterEndpoints(),
		UsesLocal:            p.UsesLocalEndpoints(),
	}
	for _, ip := range p.ExternalIPs() {
		v.ExternalIPs = append(v.ExternalIPs, ip.String())
	}
	for _, ip := range p.LoadBalancerVIPs() {
		v.LoadBalancerVIPs = append(v.LoadBalancerVIPs, ip.String())
	}
	for _, r := range p.LoadBalancerSourceRanges() {
		v.SourceRanges = append(v.SourceRanges, r.String())
	}
	return v
}

func TestNewBaseServicePort(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	local := v1.ServiceInternalTrafficPolicyLocal
	lb := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30000
		s.Spec.Ports[0].NodePort = 31000
		s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
			{IP: "192.0.2.1"},
			{IP: "192.0.2.2", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
			{IP: "192.0.2.3", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
			{IP: "2001:db8::1"},
			{Hostname: "lb.example.com"},
			{IP: "not-an-ip"},
		}
		s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/24 ", "2001:db8::/32", "198.51.100.7/16"}
		// Unparsable and special addresses are dropped, the rest kept.
		s.Spec.ExternalIPs = []string{"198.51.100.1", "2001:db8::2", "bogus", "010.001.002.003",
			"0.0.0.0", "127.0.0.1", "169.254.169.254", "224.0.0.1", "239.1.1.1", "255.255.255.255",
			"::", "::1", "fe80::1", "ff02::1", "ff0e::1", "::ffff:127.0.0.1"}
	}
	tests := []struct {
		name    string
		svc     *v1.Service
		family  v1.IPFamily
		want    portView
		wantErr bool
	}{{
		name:   "plain cluster IP",
		svc:    makeService("ns", "a"),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, UsesCluster: true,
		},
	}, {
		name: "client IP affinity with default and internal policy Local",
		svc: makeService("ns", "a", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameZone)
			s.Spec.Ports[0].Protocol = ""
		}),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityClientIP, StickyMaxAgeSeconds: 10800,
			InternalPolicyLocal: true, TrafficDistribution: "PreferSameZone", UsesLocal: true,
		},
	}, {
		name: "client IP affinity with timeout",
		svc: makeService("ns", "a", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		}),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityClientIP, StickyMaxAgeSeconds: 60, UsesCluster: true,
		},
	}, {
		name:   "load balancer, IPv4 view",
		svc:    makeService("ns", "a", lb),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, NodePort: 31000, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, HealthCheckNodePort: 30000,
			ExternalIPs:         []string{"198.51.100.1", "10.1.2.3"},
			LoadBalancerVIPs:    []string{"192.0.2.1", "192.0.2.3"},
			SourceRanges:        []string{"203.0.113.0/24", "198.51.0.0/16"},
			ExternalPolicyLocal: true, ExternallyAccessible: true, UsesCluster: true, UsesLocal: true,
		},
	}, {
		name:   "load balancer, IPv6 view",
		svc:    makeService("ns", "a", lb),
		family: v1.IPv6Protocol,
		want: portView{
			String: "[fd00::10]:80/TCP", ClusterIP: "fd00::10", Port: 80, NodePort: 31000, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, HealthCheckNodePort: 30000,
			ExternalIPs:         []string{"2001:db8::2"},
			LoadBalancerVIPs:    []string{"2001:db8::1"},
			SourceRanges:        []string{"2001:db8::/32"},
			ExternalPolicyLocal: true, ExternallyAccessible: true, UsesCluster: true, UsesLocal: true,
		},
	}, {
		name: "local external policy without health check node port",
		svc: makeService("ns", "a", lb, func(s *v1.Service) {
			s.Spec.HealthCheckNodePort = 0
			s.Status.LoadBalancer.Ingress = nil
			s.Spec.ExternalIPs = nil
			s.Spec.LoadBalancerSourceRanges = nil
		}),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, NodePort: 31000, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, ExternalPolicyLocal: true, ExternallyAccessible: true,
			UsesCluster: true, UsesLocal: true,
		},
	}, {
		name: "external policy Local on ClusterIP service is ignored",
		svc: makeService("ns", "a", func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, UsesCluster: true,
		},
	}, {
		name: "internal Local but externally accessible uses both",
		svc: makeService("ns", "a", func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
		}),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, InternalPolicyLocal: true, ExternallyAccessible: true,
			UsesCluster: true, UsesLocal: true,
		},
	}, {
		name:   "legacy clusterIP field only, leading zeros",
		svc:    makeService("ns", "a", func(s *v1.Service) { s.Spec.ClusterIPs = nil; s.Spec.ClusterIP = "010.096.000.010" }),
		family: v1.IPv4Protocol,
		want: portView{
			String: "10.96.0.10:80/TCP", ClusterIP: "10.96.0.10", Port: 80, Protocol: v1.ProtocolTCP,
			Affinity: v1.ServiceAffinityNone, UsesCluster: true,
		},
	}, {
		name:    "headless",
		svc:     makeService("ns", "a", withClusterIPs("None")),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		name:    "ExternalName",
		svc:     makeService("ns", "a", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		name:    "no cluster IP",
		svc:     makeService("ns", "a", withClusterIPs()),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		name:    "single-stack IPv4 seen from IPv6",
		svc:     makeService("ns", "a"),
		family:  v1.IPv6Protocol,
		wantErr: true,
	}, {
		name:    "unparsable cluster IP",
		svc:     makeService("ns", "a", withClusterIPs("10.96.0.300")),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		// Dropping the range would open the load balancer to all.
		name:    "unparsable source range",
		svc:     makeService("ns", "a", lb, func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"garbage"} }),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		name:    "invalid namespace",
		svc:     makeService("x\nCOMMIT", "a"),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		name:    "invalid port number",
		svc:     makeService("ns", "a", withPorts(svcPort("http", 70000, v1.ProtocolTCP))),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}, {
		name:    "invalid protocol",
		svc:     makeService("ns", "a", withPorts(svcPort("http", 80, "ICMP"))),
		family:  v1.IPv4Protocol,
		wantErr: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewBaseServicePort(logger, tc.svc, &tc.svc.Spec.Ports[0], tc.family)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("expected an error, got port %s", p)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if diff := cmp.Diff(tc.want, viewPort(p)); diff != "" {
				t.Errorf("port (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewBaseServicePortNil(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	if _, err := NewBaseServicePort(logger, nil, nil, v1.IPv4Protocol); err == nil {
		t.Error("expected an error for a nil service")
	}
}

func TestHealthCheckNodePorts(t *testing.T) {
	tr := NewServiceChangeTracker(v1.IPv4Protocol, nil)
	lb := func(hc int32) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = hc
			s.Spec.Ports = []v1.ServicePort{svcPort("a", 80, v1.ProtocolTCP), svcPort("b", 81, v1.ProtocolUDP)}
		}
	}
	tr.Update(nil, makeService("ns", "local", lb(30001)))
	tr.Update(nil, makeService("ns", "cluster", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeLoadBalancer }))
	tr.Update(nil, makeService("ns", "bad", lb(70000)))
	m := ServicePortMap{}
	m.Update(tr)
	want := map[types.NamespacedName]uint16{{Namespace: "ns", Name: "local"}: 30001}
	if diff := cmp.Diff(want, m.HealthCheckNodePorts()); diff != "" {
		t.Errorf("HealthCheckNodePorts (-want +got):\n%s", diff)
	}
}

func TestServicePortStringFormats(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"10.0.0.1", "10.0.0.1:53/UDP"},
		{"fd00::1", "[fd00::1]:53/UDP"},
	} {
		ip, _ := parseAddr(tc.ip)
		if got := servicePortString(ip, 53, v1.ProtocolUDP); got != tc.want {
			t.Errorf("servicePortString(%s) = %q, want %q", tc.ip, got, tc.want)
		}
	}
	for _, tc := range []struct{ ip, want string }{
		{"10.0.0.1", "10.0.0.1:8080"},
		{"fd00::1", "[fd00::1]:8080"},
	} {
		ip, _ := parseAddr(tc.ip)
		e := NewBaseEndpoint(EndpointInfo{IP: ip, Port: 8080})
		if got := fmt.Sprint(e); got != tc.want {
			t.Errorf("endpoint String = %q, want %q", got, tc.want)
		}
	}
}
