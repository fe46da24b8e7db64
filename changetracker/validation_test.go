package changetracker

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// injection is a namespace that, written raw, would end the nat
// table in iptables-restore input and flush the node's INPUT chain.
const injection = "x\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-F INPUT\nCOMMIT\n*nat\n#"

// bufferedLogger returns a test logger that also keeps its entries.
func bufferedLogger(t *testing.T) klog.Logger {
	return ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
}

// defaultLogs returns the log entries written at the default verbosity
// that name obj under key, as "message portName" strings.
func defaultLogs(logger klog.Logger, key, obj string) []string {
	var out []string
	for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		if e.Verbosity != 0 {
			continue
		}
		named, port := false, ""
		for i := 0; i+1 < len(e.ParameterKVList); i += 2 {
			switch e.ParameterKVList[i] {
			case key:
				// Compare the raw names: the log escapes them.
				if ref, ok := e.ParameterKVList[i+1].(logsafe.ObjectRef); ok {
					named = (ref.Namespace == "" && ref.Name == obj) || ref.Namespace+"/"+ref.Name == obj
				}
			case "portName":
				port = fmt.Sprint(e.ParameterKVList[i+1])
			}
		}
		if named {
			out = append(out, strings.TrimSpace(e.Message+" "+port))
		}
	}
	return out
}

// TestServiceValidation feeds one Service with one bad field, beside a good
// Service, through a tracker. Every field that reaches a kernel payload is
// covered: names (namespace, name, port name), numbers (port, nodePort,
// targetPort, the affinity timeout), the protocol and the addresses. The
// bad Service, or only its bad port, is left out with one log line at the
// default verbosity naming it; the good Service is always synced.
func TestServiceValidation(t *testing.T) {
	good := makeService("ns", "good", withClusterIPs("10.96.0.20"))
	goodPorts := map[string]string{"ns/good:http/TCP": "10.96.0.20:80/TCP"}
	twoPorts := func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{svcPort("http", 80, v1.ProtocolTCP), svcPort("dns", 53, v1.ProtocolUDP)}
	}
	affinity := func(seconds int32) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(seconds)}}
		}
	}
	withPort := func(f func(*v1.ServicePort)) func(*v1.Service) {
		return func(s *v1.Service) { f(&s.Spec.Ports[0]) }
	}
	// The bad Service keeps the name "ns/bad" where its name is not the bad
	// field, so that the log lines can be found.
	tests := []struct {
		name string
		svc  *v1.Service
		// obj is the name the log names the Service by ("ns/bad" unless
		// the namespace or name is the bad field).
		obj      string
		want     map[string]string // bad Service's ports in the map
		wantLogs []string
		// check, when set, looks at the bad Service's stored ports.
		check func(t *testing.T, p ServicePort)
	}{{
		name: "valid, two ports",
		svc:  makeService("ns", "bad", twoPorts),
		want: map[string]string{"ns/bad:http/TCP": "10.96.0.10:80/TCP", "ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
	}, {
		name: "name starting with a digit (RelaxedServiceNameValidation, GA in 1.37)",
		svc:  makeService("ns", "1st"),
		obj:  "ns/1st",
		want: map[string]string{"ns/1st:http/TCP": "10.96.0.10:80/TCP"},
	}, {
		name:     "namespace injecting iptables-restore commands",
		svc:      makeService(injection, "bad"),
		obj:      injection + "/bad",
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "namespace not a label (dots)",
		svc:      makeService("a.b", "bad"),
		obj:      "a.b/bad",
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "empty namespace",
		svc:      makeService("", "bad"),
		obj:      "bad",
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "name injecting",
		svc:      makeService("ns", "bad\nCOMMIT"),
		obj:      "ns/bad\nCOMMIT",
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "name with upper case",
		svc:      makeService("ns", "Bad"),
		obj:      "ns/Bad",
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "name longer than 63",
		svc:      makeService("ns", strings.Repeat("a", 64)),
		obj:      "ns/" + strings.Repeat("a", 64),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "port name injecting refuses the whole service",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.Name = "http\" -j ACCEPT" })),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "port name with upper case",
		svc:      makeService("ns", "bad", withPort(func(p *v1.ServicePort) { p.Name = "HTTP" })),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "port 0",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.Port = 0 })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring invalid service port http"},
	}, {
		name:     "port 70000",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.Port = 70000 })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring invalid service port http"},
	}, {
		name:     "nodePort 70000",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.NodePort = 70000 })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring invalid service port http"},
	}, {
		name:     "nodePort -1",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.NodePort = -1 })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring invalid service port http"},
	}, {
		name:     "targetPort 70000",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.TargetPort = intstr.FromInt32(70000) })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring invalid service port http"},
	}, {
		name:     "targetPort name not an IANA service name",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.TargetPort = intstr.FromString("not a name") })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring invalid service port http"},
	}, {
		name: "targetPort by name and nodePort in range",
		svc: makeService("ns", "bad", withPort(func(p *v1.ServicePort) {
			p.TargetPort = intstr.FromString("web")
			p.NodePort = 30080
		})),
		want: map[string]string{"ns/bad:http/TCP": "10.96.0.10:80/TCP"},
	}, {
		name:     "unknown protocol",
		svc:      makeService("ns", "bad", twoPorts, withPort(func(p *v1.ServicePort) { p.Protocol = "ICMP" })),
		want:     map[string]string{"ns/bad:dns/UDP": "10.96.0.10:53/UDP"},
		wantLogs: []string{"Ignoring service port with unknown protocol http"},
	}, {
		name:     "affinity timeout 0",
		svc:      makeService("ns", "bad", affinity(0)),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "affinity timeout negative",
		svc:      makeService("ns", "bad", affinity(-5)),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "affinity timeout over a day",
		svc:      makeService("ns", "bad", affinity(86401)),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name: "affinity timeout of a day",
		svc:  makeService("ns", "bad", affinity(86400)),
		want: map[string]string{"ns/bad:http/TCP": "10.96.0.10:80/TCP"},
	}, {
		name:     "unknown affinity",
		svc:      makeService("ns", "bad", func(s *v1.Service) { s.Spec.SessionAffinity = "Cookie" }),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name:     "unparsable cluster IP",
		svc:      makeService("ns", "bad", withClusterIPs("10.96.0.300")),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name: "unparsable source range",
		svc: makeService("ns", "bad", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "203.0.113.0/24\n-j ACCEPT"}
		}),
		wantLogs: []string{"Ignoring invalid service"},
	}, {
		name: "special external IPs are dropped, the service kept",
		svc: makeService("ns", "bad", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.251", "255.255.255.255"}
		}),
		want: map[string]string{"ns/bad:http/TCP": "10.96.0.10:80/TCP"},
		wantLogs: []string{"Ignoring invalid external IP", "Ignoring invalid external IP", "Ignoring invalid external IP",
			"Ignoring invalid external IP", "Ignoring invalid external IP"},
	}, {
		name: "unparsable load-balancer ingress IPs are dropped, the service kept",
		svc: makeService("ns", "bad", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.1\n-j ACCEPT"}, {IP: "192.0.2.300"}, {IP: "192.0.2.1"}}
		}),
		want:     map[string]string{"ns/bad:http/TCP": "10.96.0.10:80/TCP"},
		wantLogs: []string{"Ignoring unparsable load-balancer ingress IP", "Ignoring unparsable load-balancer ingress IP"},
		check: func(t *testing.T, p ServicePort) {
			if diff := cmp.Diff([]netip.Addr{netip.MustParseAddr("192.0.2.1")}, p.LoadBalancerVIPs(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("load-balancer VIPs (-want +got):\n%s", diff)
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger := bufferedLogger(t)
			tr := NewServiceChangeTracker(v1.IPv4Protocol, nil, WithLogger(logger))
			tr.Update(nil, tc.svc)
			tr.Update(nil, good)
			m := ServicePortMap{}
			m.Update(tr)
			want := map[string]string{}
			for k, v := range goodPorts {
				want[k] = v
			}
			for k, v := range tc.want {
				want[k] = v
			}
			if diff := cmp.Diff(want, describeServicePortMap(m)); diff != "" {
				t.Errorf("service port map (-want +got):\n%s", diff)
			}
			obj := tc.obj
			if obj == "" {
				obj = "ns/bad"
			}
			if diff := cmp.Diff(tc.wantLogs, defaultLogs(logger, "service", obj)); diff != "" {
				t.Errorf("log lines naming %q at the default verbosity (-want +got):\n%s", obj, diff)
			}
			for name, p := range m {
				if tc.check != nil && name.Name != "good" {
					tc.check(t, p)
				}
			}
		})
	}
}

// TestServiceBecomesInvalid checks that a Service updated to something the
// API server would refuse is removed, not kept as it was, and that the log
// names it once.
func TestServiceBecomesInvalid(t *testing.T) {
	logger := bufferedLogger(t)
	tr := NewServiceChangeTracker(v1.IPv4Protocol, nil, WithLogger(logger))
	m := ServicePortMap{}
	before := makeService("ns", "bad")
	tr.Update(nil, before)
	m.Update(tr)
	after := makeService("ns", "bad", withPorts(svcPort("HTTP", 80, v1.ProtocolTCP)))
	tr.Update(before, after)
	r := m.Update(tr)
	if diff := cmp.Diff(map[string]string{}, describeServicePortMap(m)); diff != "" {
		t.Errorf("map after an invalid update (-want +got):\n%s", diff)
	}
	if !r.UpdatedServices.Has(types.NamespacedName{Namespace: "ns", Name: "bad"}) {
		t.Errorf("UpdatedServices = %v, want it to hold ns/bad", r.UpdatedServices)
	}
	// Deleting the refused Service logs nothing more.
	tr.Update(after, nil)
	m.Update(tr)
	if diff := cmp.Diff([]string{"Ignoring invalid service"}, defaultLogs(logger, "service", "ns/bad")); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

// TestEndpointSliceValidation feeds one bad slice, beside a good one, through
// a tracker: every slice field that reaches a payload (names, the service
// label, port names and protocols, addresses) is covered.
func TestEndpointSliceValidation(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	good := makeSlice("ns", "good", "good-1", v4, http, readyEP("10.1.0.1", ""))
	goodEPs := map[string][]string{"ns/good:http/TCP": {"10.1.0.1:8080 ready serving"}}
	tests := []struct {
		name     string
		slice    *discoveryv1.EndpointSlice
		obj      string // the slice as the log names it; "ns/bad-1" when empty
		want     map[string][]string
		wantLogs []string
	}{{
		name:  "valid",
		slice: makeSlice("ns", "bad", "bad-1", v4, http, readyEP("10.0.0.1", "")),
		want:  map[string][]string{"ns/bad:http/TCP": {"10.0.0.1:8080 ready serving"}},
	}, {
		name:  "namespace injecting",
		slice: makeSlice(injection, "bad", "bad-1", v4, http, readyEP("10.0.0.1", "")),
		obj:   "-",
	}, {
		name:  "slice name not a subdomain",
		slice: makeSlice("ns", "bad", "bad_1", v4, http, readyEP("10.0.0.1", "")),
		obj:   "-",
	}, {
		name:  "service label injecting",
		slice: makeSlice("ns", "bad\n-j ACCEPT", "bad-1", v4, http, readyEP("10.0.0.1", "")),
		obj:   "-",
	}, {
		name:  "service label a valid label value but no service name",
		slice: makeSlice("ns", "bad.svc", "bad-1", v4, http, readyEP("10.0.0.1", "")),
		obj:   "-",
	}, {
		name:     "port name injecting",
		slice:    makeSlice("ns", "bad", "bad-1", v4, []port{namedPort("http\nCOMMIT", 8080, v1.ProtocolTCP)}, readyEP("10.0.0.1", "")),
		wantLogs: []string{"Ignoring invalid endpoint slice"},
	}, {
		name: "port number out of range skips that port",
		slice: makeSlice("ns", "bad", "bad-1", v4, []port{namedPort("http", 70000, v1.ProtocolTCP), namedPort("dns", 53, v1.ProtocolUDP)},
			readyEP("10.0.0.1", "")),
		want:     map[string][]string{"ns/bad:dns/UDP": {"10.0.0.1:53 ready serving"}},
		wantLogs: []string{"Ignoring invalid endpoint slice port http"},
	}, {
		name:     "unknown protocol",
		slice:    makeSlice("ns", "bad", "bad-1", v4, []port{namedPort("http", 8080, "ICMP")}, readyEP("10.0.0.1", "")),
		wantLogs: []string{"Ignoring invalid endpoint slice"},
	}, {
		name: "addresses that cannot be backends are skipped",
		slice: makeSlice("ns", "bad", "bad-1", v4, http,
			readyEP("0.0.0.0", ""), readyEP("127.0.0.1", ""), readyEP("169.254.0.5", ""),
			readyEP("224.0.0.1", ""), readyEP("239.255.0.1", ""), readyEP("255.255.255.255", ""),
			readyEP("10.0.0.1", "")),
		want:     map[string][]string{"ns/bad:http/TCP": {"10.0.0.1:8080 ready serving"}},
		wantLogs: slices.Repeat([]string{"Ignoring endpoint that cannot be a backend"}, 6),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger := bufferedLogger(t)
			tr := NewEndpointsChangeTracker(v1.IPv4Protocol, "", nil, WithLogger(logger))
			tr.EndpointSliceUpdate(tc.slice, false)
			tr.EndpointSliceUpdate(good, false)
			m := EndpointsMap{}
			m.Update(tr)
			want := map[string][]string{}
			for k, v := range goodEPs {
				want[k] = v
			}
			for k, v := range tc.want {
				want[k] = v
			}
			if diff := cmp.Diff(want, describeEndpointsMap(m)); diff != "" {
				t.Errorf("endpoints map (-want +got):\n%s", diff)
			}
			if tc.obj == "-" {
				// Not attributable: one error line without the slice
				// key, whose error names the slice.
				entries := logger.GetSink().(ktesting.Underlier).GetBuffer().Data()
				var lines []string
				for _, e := range entries {
					if e.Verbosity == 0 {
						lines = append(lines, e.Message)
						if e.Err == nil || !strings.Contains(e.Err.Error(), fmt.Sprintf("%q", tc.slice.Name)) {
							t.Errorf("error %v does not name the slice %q", e.Err, tc.slice.Name)
						}
					}
				}
				if diff := cmp.Diff([]string{"Ignoring invalid endpoint slice"}, lines); diff != "" {
					t.Errorf("log lines (-want +got):\n%s", diff)
				}
				return
			}
			obj := tc.obj
			if obj == "" {
				obj = "ns/bad-1"
			}
			if diff := cmp.Diff(tc.wantLogs, defaultLogs(logger, "endpointSlice", obj)); diff != "" {
				t.Errorf("log lines naming %q (-want +got):\n%s", obj, diff)
			}
		})
	}
}

// TestEndpointSliceBecomesInvalid checks that a slice updated to something
// the API server would refuse stops contributing endpoints.
func TestEndpointSliceBecomesInvalid(t *testing.T) {
	logger := bufferedLogger(t)
	tr := NewEndpointsChangeTracker(v1.IPv4Protocol, "", nil, WithLogger(logger))
	m := EndpointsMap{}
	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	before := makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.1", ""))
	tr.EndpointSliceUpdate(before, false)
	m.Update(tr)
	after := makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, []port{namedPort("HTTP", 8080, v1.ProtocolTCP)}, readyEP("10.0.0.1", ""))
	if !tr.EndpointSliceUpdate(after, false) {
		t.Error("an invalid update of an applied slice did not ask for a sync")
	}
	m.Update(tr)
	if diff := cmp.Diff(map[string][]string{}, describeEndpointsMap(m)); diff != "" {
		t.Errorf("map after an invalid update (-want +got):\n%s", diff)
	}
}

// TestEndpointOrder checks that endpoint lists come in kube-proxy's order,
// by "ip:port" string, for one slice and merged from several.
func TestEndpointOrder(t *testing.T) {
	http := []port{namedPort("http", 80, v1.ProtocolTCP)}
	two := []port{namedPort("http", 80, v1.ProtocolTCP), namedPort("dns", 53, v1.ProtocolUDP)}
	tests := []struct {
		name   string
		family v1.IPFamily
		slices []*discoveryv1.EndpointSlice
		want   map[string][]string
	}{{
		name:   "one slice",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, http,
			readyEP("10.0.0.2", ""), readyEP("10.0.0.10", ""), readyEP("10.0.0.1", ""), readyEP("9.0.0.1", ""))},
		want: map[string][]string{"ns/a:http/TCP": {"10.0.0.10:80", "10.0.0.1:80", "10.0.0.2:80", "9.0.0.1:80"}},
	}, {
		name:   "one slice, two ports",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, two,
			readyEP("10.0.0.2", ""), readyEP("10.0.0.10", ""), readyEP("10.0.0.1", ""))},
		want: map[string][]string{
			"ns/a:http/TCP": {"10.0.0.10:80", "10.0.0.1:80", "10.0.0.2:80"},
			"ns/a:dns/UDP":  {"10.0.0.10:53", "10.0.0.1:53", "10.0.0.2:53"},
		},
	}, {
		name:   "merged from slices with different port numbers",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, []port{namedPort("http", 8080, v1.ProtocolTCP)}, readyEP("10.0.0.1", ""), readyEP("10.0.0.3", "")),
			makeSlice("ns", "a", "a-2", discoveryv1.AddressTypeIPv4, []port{namedPort("http", 9, v1.ProtocolTCP)}, readyEP("10.0.0.1", ""), readyEP("10.0.0.20", "")),
		},
		want: map[string][]string{"ns/a:http/TCP": {"10.0.0.1:8080", "10.0.0.1:9", "10.0.0.20:9", "10.0.0.3:8080"}},
	}, {
		name:   "IPv6",
		family: v1.IPv6Protocol,
		slices: []*discoveryv1.EndpointSlice{makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv6, http,
			readyEP("fd00::a", ""), readyEP("fd00::", ""), readyEP("fd00::1:0", ""), readyEP("fd00::9", ""))},
		want: map[string][]string{"ns/a:http/TCP": {"[fd00::1:0]:80", "[fd00::9]:80", "[fd00::]:80", "[fd00::a]:80"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewEndpointsChangeTracker(tc.family, "", nil)
			for _, s := range tc.slices {
				tr.EndpointSliceUpdate(s, false)
			}
			m := EndpointsMap{}
			m.Update(tr)
			got := map[string][]string{}
			for name, eps := range m {
				got[fmt.Sprintf("%s/%s", name, name.Protocol)] = describeEndpoints(eps)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCompareHostPort checks the comparison against the strings it stands
// for, over addresses chosen to share prefixes.
func TestCompareHostPort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var addrs []netip.Addr
	for range 200 {
		if rng.IntN(2) == 0 {
			addrs = append(addrs, netip.AddrFrom4([4]byte{10, byte(rng.IntN(3)), byte(rng.IntN(12)), byte(rng.IntN(120))}))
		} else {
			var b [16]byte
			b[0], b[1] = 0xfd, 0
			b[14], b[15] = byte(rng.IntN(3)), byte(rng.IntN(20))
			if rng.IntN(3) == 0 {
				b[8] = byte(rng.IntN(2))
			}
			addrs = append(addrs, netip.AddrFrom16(b))
		}
	}
	ports := []int{0, 1, 9, 10, 53, 80, 8080, 65535}
	sign := func(n int) int { return max(-1, min(1, n)) }
	for i := range 5000 {
		a, b := addrs[rng.IntN(len(addrs))], addrs[rng.IntN(len(addrs))]
		if i%2 == 0 && a.Is4() != b.Is4() {
			continue
		}
		ap, bp := ports[rng.IntN(len(ports))], ports[rng.IntN(len(ports))]
		want := strings.Compare(endpointString(a, ap), endpointString(b, bp))
		if got := sign(CompareHostPort(a, ap, b, bp)); got != want {
			t.Fatalf("CompareHostPort(%s, %d, %s, %d) = %d, want %d", a, ap, b, bp, got, want)
		}
	}
}
