package explain

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
)

const svcThisNode = "node-a"

var svcNodeA = NodeInfo{
	Name:      svcThisNode,
	Labels:    map[string]string{v1.LabelTopologyZone: "zone-1"},
	Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.1")},
}

func svcTestService(mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			Selector:   map[string]string{"app": "web"},
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

// ep is a slice endpoint: address, node, and conditions as "r" (ready),
// "t" (terminating, serving), "tn" (terminating, not serving), "u"
// (not ready, not serving).
func svcEP(addr, node, cond string, zoneHints ...string) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr.To(node)}
	switch cond {
	case "r":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	case "t":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	case "tn":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	case "u":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	}
	if len(zoneHints) > 0 {
		e.Hints = &discoveryv1.EndpointHints{}
		for _, z := range zoneHints {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
	return e
}

func svcTestSlice(name, portName string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

func svcWithSlice(s *discoveryv1.EndpointSlice, m func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	m(s)
	return s
}

// svcRow is one endpoint's verdicts in a report, compactly: "used",
// "used/fallback" or the reason, with the detail when the case asks.
type svcRow struct {
	Port, Family, Endpoint string
	Internal, External     string
}

func svcVerdictString(v *EndpointVerdict, detail bool) string {
	if v == nil {
		return "-"
	}
	s := string(v.Reason)
	switch {
	case v.Used && v.Fallback:
		s = "used/fallback"
	case v.Used:
		s = "used"
	}
	if detail && v.Detail != "" {
		s += ": " + v.Detail
	}
	return s
}

func svcRows(r *ServiceReport, detail bool) []svcRow {
	var out []svcRow
	for _, p := range r.Ports {
		for _, e := range p.Endpoints {
			out = append(out, svcRow{
				Port: p.Name, Family: string(p.Family), Endpoint: e.Address + ":" + strconv.Itoa(int(e.Port)),
				Internal: svcVerdictString(&e.Internal, detail), External: svcVerdictString(e.External, detail),
			})
		}
	}
	return out
}

type svcCase struct {
	name   string
	in     ServiceInput
	detail bool
	want   []svcRow
	// wantNotProxied, when set, is the report's NotProxied.
	wantNotProxied []string
	// wantSlices, when set, is the report's slices as "name: reason".
	wantSlices []string
	// wantPorts, when set, is the report's ports as "name/family".
	wantPorts []string
}

func svcCases() []svcCase {
	r := func(ep, internal string) svcRow { return svcRow{"http", "IPv4", ep, internal, "-"} }
	re := func(ep, internal, external string) svcRow { return svcRow{"http", "IPv4", ep, internal, external} }
	// oneSlice is the usual input: the Service and one slice of its port.
	oneSlice := func(eps ...discoveryv1.Endpoint) ServiceInput {
		return ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{svcTestSlice("web-1", "http", eps...)}}
	}
	nodePortLocal := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	return []svcCase{{
		name:       "healthy",
		in:         oneSlice(svcEP("10.244.1.10", svcThisNode, "r"), svcEP("10.244.2.10", "node-b", "r")),
		want:       []svcRow{r("10.244.1.10:8080", "used"), r("10.244.2.10:8080", "used")},
		wantSlices: []string{"web-1: used"},
	}, {
		name:   "pods not ready",
		in:     oneSlice(svcEP("10.244.1.10", svcThisNode, "u"), svcEP("10.244.2.10", "node-b", "u")),
		detail: true,
		want: []svcRow{
			r("10.244.1.10:8080", "NotReady: not ready and not serving"),
			r("10.244.2.10:8080", "NotReady: not ready and not serving"),
		},
	}, {
		name: "slice port name differs from the Service port name",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "web", svcEP("10.244.1.10", svcThisNode, "r")),
		}},
		detail: true,
		want:   []svcRow{r("10.244.1.10:0", `PortNameMismatch: the slice has no port named "http" with protocol TCP; its ports: "web" 8080/TCP`)},
	}, {
		name: "slice without the service-name label",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcWithSlice(svcTestSlice("web-abcde", "http", svcEP("10.244.1.10", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) { s.Labels = nil }),
			// Another Service's slice is not looked at.
			svcWithSlice(svcTestSlice("api-1", "http", svcEP("10.244.9.9", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelServiceName] = "api" }),
		}},
		detail:     true,
		want:       []svcRow{r("10.244.1.10:8080", `SliceWithoutServiceName: Ignoring invalid endpoint slice: endpoint slice "web-abcde" in namespace "shop": invalid: no kubernetes.io/service-name label`)},
		wantSlices: []string{"web-abcde: SliceWithoutServiceName"},
	}, {
		name: "Service owned by another proxy",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) {
			s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "cilium"}
		}), Slices: []*discoveryv1.EndpointSlice{svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"))}},
		want:           []svcRow{r("10.244.1.10:8080", "ServiceNotProxied")},
		wantNotProxied: []string{"owned by another proxy: labelled service.kubernetes.io/service-proxy-name=cilium, and this proxy serves only Services without the label"},
	}, {
		name: "Service of this proxy by its service-proxy-name",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) {
			s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "mine"}
		}), Proxy: ProxySettings{ServiceProxyName: "mine"}, Slices: []*discoveryv1.EndpointSlice{svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"))}},
		want: []svcRow{r("10.244.1.10:8080", "used")},
	}, {
		name: "headless Service",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		}),
			Slices: []*discoveryv1.EndpointSlice{svcWithSlice(svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) { s.Labels[v1.IsHeadlessService] = "" })}},
		want:           []svcRow{r("10.244.1.10:8080", "SliceHeadless")},
		wantNotProxied: []string{"headless (clusterIP None): served by DNS, not by the proxy"},
		wantSlices:     []string{"web-1: SliceHeadless"},
	}, {
		name: "ExternalName Service",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) {
			s.Spec = v1.ServiceSpec{Type: v1.ServiceTypeExternalName, ExternalName: "example.com", Ports: s.Spec.Ports}
		})},
		wantNotProxied: []string{"Skipping service for this IP family (ExternalName service)"},
	}, {
		name:   "terminating endpoints used as fallback when none is ready",
		in:     oneSlice(svcEP("10.244.1.10", svcThisNode, "t"), svcEP("10.244.2.10", "node-b", "tn")),
		detail: true,
		want: []svcRow{
			r("10.244.1.10:8080", "used/fallback: terminating but serving, and used as a fallback: no endpoint is ready in the cluster"),
			r("10.244.2.10:8080", "TerminatingNotServing: terminating and not serving"),
		},
	}, {
		name:   "terminating endpoint not used when one is ready",
		in:     oneSlice(svcEP("10.244.1.10", svcThisNode, "t"), svcEP("10.244.2.10", "node-b", "r")),
		detail: true,
		want: []svcRow{
			r("10.244.1.10:8080", "Terminating: terminating but serving; not used as a fallback, because endpoints are ready in the cluster"),
			r("10.244.2.10:8080", "used"),
		},
	}, {
		name:   "topology hints for another zone",
		in:     oneSlice(svcEP("10.244.1.10", svcThisNode, "r", "zone-1"), svcEP("10.244.2.10", "node-b", "r", "zone-2")),
		detail: true,
		want: []svcRow{
			r("10.244.1.10:8080", "used"),
			r("10.244.2.10:8080", "TopologyHints: hinted for zone(s) zone-2; every ready endpoint has zone hints, so this node, in zone zone-1, uses those hinted for its zone"),
		},
	}, {
		name: "not local under externalTrafficPolicy Local",
		in: ServiceInput{Service: svcTestService(nodePortLocal), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"), svcEP("10.244.2.10", "node-b", "r")),
		}},
		detail: true,
		want: []svcRow{
			re("10.244.1.10:8080", "used", "used"),
			re("10.244.2.10:8080", "used", "NotLocal: on node node-b, and policy Local uses only the endpoints on this node"),
		},
	}, {
		name: "not local under internalTrafficPolicy Local",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal) }), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"), svcEP("10.244.2.10", "node-b", "r")),
		}},
		want: []svcRow{r("10.244.1.10:8080", "used"), r("10.244.2.10:8080", "NotLocal")},
	}, {
		name: "invalid Service refused with its field",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) { s.Spec.Ports[0].Name = "Http" }), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "Http", svcEP("10.244.1.10", svcThisNode, "r")),
		}},
		want: []svcRow{{"Http", "IPv4", "10.244.1.10:8080", "SliceRefused", "-"}},
		wantNotProxied: []string{
			`Ignoring invalid service: invalid: port name "Http": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`,
		},
		wantSlices: []string{"web-1: SliceRefused"},
	}, {
		name:   "invalid endpoint address refused with the reason",
		in:     oneSlice(svcEP("127.0.0.1", svcThisNode, "r"), svcEP("10.244.2.10", "node-b", "r")),
		detail: true,
		want: []svcRow{
			r("127.0.0.1:8080", "EndpointRefused: Ignoring endpoint that cannot be a backend (loopback address)"),
			r("10.244.2.10:8080", "used"),
		},
	}, {
		name: "invalid cluster IP refused with the field",
		in: ServiceInput{Service: svcTestService(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "192.168.0.1", []string{"192.168.0.1"} }), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")),
		}},
		detail: true,
		want: []svcRow{
			r("10.244.1.10:8080", `ServiceNotProxied: Ignoring invalid service: invalid: cluster IP "192.168.0.1": an address of this node`),
		},
		wantNotProxied: []string{`Ignoring invalid service: invalid: cluster IP "192.168.0.1": an address of this node`},
	}, {
		name: "endpoints of another family",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")),
			svcWithSlice(svcTestSlice("web-2", "http", svcEP("fd00::10", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) { s.AddressType = discoveryv1.AddressTypeIPv6 }),
		}},
		want:       []svcRow{r("10.244.1.10:8080", "used"), r("fd00::10:8080", "OtherFamily")},
		wantSlices: []string{"web-1: used", "web-2: OtherFamily"},
	}, {
		name: "dual-stack Service on a dual-stack node",
		in: ServiceInput{
			Service: svcTestService(func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			}),
			Proxy: ProxySettings{Families: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}},
			Slices: []*discoveryv1.EndpointSlice{
				svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")),
				svcWithSlice(svcTestSlice("web-2", "http", svcEP("fd00::10", svcThisNode, "u")), func(s *discoveryv1.EndpointSlice) { s.AddressType = discoveryv1.AddressTypeIPv6 }),
			}},
		want:      []svcRow{r("10.244.1.10:8080", "used"), {"http", "IPv6", "fd00::10:8080", "NotReady", "-"}},
		wantPorts: []string{"http/IPv4", "http/IPv6"},
	}, {
		name: "single-stack Service on a dual-stack node",
		in: ServiceInput{
			Service: svcTestService(),
			Proxy:   ProxySettings{Families: []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}},
			Slices:  []*discoveryv1.EndpointSlice{svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"))},
		},
		want:      []svcRow{r("10.244.1.10:8080", "used")},
		wantPorts: []string{"http/IPv4"},
	}, {
		name: "IPv6 Service on an IPv4 proxy",
		in: ServiceInput{
			Service: svcTestService(func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "fd00:96::10", []string{"fd00:96::10"}, []v1.IPFamily{v1.IPv6Protocol}
			}),
			Slices: []*discoveryv1.EndpointSlice{svcWithSlice(svcTestSlice("web-1", "http", svcEP("fd00::10", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) { s.AddressType = discoveryv1.AddressTypeIPv6 })},
		},
		want:           []svcRow{{"http", "IPv6", "fd00::10:8080", "ServiceNotProxied", "-"}},
		wantNotProxied: []string{"the proxy runs IPv4 only and the Service is IPv6 only"},
	}, {
		name: "node hints for another node",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcWithSlice(svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"), svcEP("10.244.2.10", "node-b", "r")), func(s *discoveryv1.EndpointSlice) {
				for i, n := range []string{svcThisNode, "node-b"} {
					s.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: n}}}
				}
			}),
		}},
		detail: true,
		want: []svcRow{
			r("10.244.1.10:8080", "used"),
			r("10.244.2.10:8080", "TopologyHints: hinted for node(s) node-b; every ready endpoint has node hints, so this node (node-a) uses those hinted for it"),
		},
	}, {
		name: "the same endpoint alike in two slices",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")),
			svcTestSlice("web-2", "http", svcEP("10.244.1.10", svcThisNode, "r")),
		}},
		want: []svcRow{r("10.244.1.10:8080", "used"), r("10.244.1.10:8080", "Duplicate")},
	}, {
		name: "an address with leading zeros, as old API servers allowed",
		in:   oneSlice(svcEP("010.244.001.010", svcThisNode, "r")),
		want: []svcRow{r("010.244.001.010:8080", "used")},
	}, {
		name: "invalid slice refused with its field",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcWithSlice(svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) {
				s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To("Metrics"), Port: ptr.To[int32](9090)})
			}),
		}},
		detail: true,
		want:   []svcRow{r("10.244.1.10:8080", `SliceRefused: Ignoring invalid endpoint slice: invalid: port name "Metrics": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`)},
	}, {
		name: "slice port without a number",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcWithSlice(svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r")), func(s *discoveryv1.EndpointSlice) { s.Ports[0].Port = nil }),
		}},
		detail: true,
		want:   []svcRow{r("10.244.1.10:0", "SliceRefused: Ignoring endpoint slice port without a number")},
	}, {
		name:   "an IPv6 address in an IPv4 slice",
		in:     oneSlice(svcEP("fd00::10", svcThisNode, "r"), svcEP("10.244.1.10", svcThisNode, "r")),
		detail: true,
		want: []svcRow{
			r("fd00::10:8080", "OtherFamily: Ignoring endpoint of the other IP family"),
			r("10.244.1.10:8080", "used"),
		},
	}, {
		name:           "Service without ports",
		in:             ServiceInput{Service: svcTestService(func(s *v1.Service) { s.Spec.Ports = nil })},
		wantNotProxied: []string{"the Service has no ports"},
	}, {
		name: "the same address in two slices",
		in: ServiceInput{Service: svcTestService(), Slices: []*discoveryv1.EndpointSlice{
			svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "t")),
			svcTestSlice("web-2", "http", svcEP("10.244.1.10", svcThisNode, "r")),
		}},
		want: []svcRow{r("10.244.1.10:8080", "Duplicate"), r("10.244.1.10:8080", "used")},
	}}
}

func TestExplainService(t *testing.T) {
	for _, tc := range svcCases() {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Node = svcNodeA
			r, err := ExplainService(in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, svcRows(r, tc.detail)); diff != "" {
				t.Errorf("verdicts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNotProxied, r.NotProxied); diff != "" {
				t.Errorf("NotProxied (-want +got):\n%s", diff)
			}
			if r.Proxied != (len(tc.wantNotProxied) == 0) {
				t.Errorf("Proxied = %t with NotProxied %q", r.Proxied, r.NotProxied)
			}
			if tc.wantPorts != nil {
				var got []string
				for _, p := range r.Ports {
					got = append(got, p.Name+"/"+string(p.Family))
				}
				if diff := cmp.Diff(tc.wantPorts, got); diff != "" {
					t.Errorf("ports (-want +got):\n%s", diff)
				}
			}
			if tc.wantSlices != nil {
				var got []string
				for _, s := range r.Slices {
					w := string(s.Reason)
					if s.Used {
						w = "used"
					}
					got = append(got, s.Name+": "+w)
				}
				if diff := cmp.Diff(tc.wantSlices, got); diff != "" {
					t.Errorf("slices (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestExplainServiceAgreesWithTrackers feeds the objects of every case to
// trackers of their own, as a proxier does, and checks that the report
// calls used exactly the endpoints CategorizeEndpoints gives each kind of
// traffic, so that the view cannot drift from what the proxy programs.
func TestExplainServiceAgreesWithTrackers(t *testing.T) {
	for _, tc := range svcCases() {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Node = svcNodeA
			r, err := ExplainService(in)
			if err != nil {
				t.Fatal(err)
			}
			for _, family := range proxyFamilies(in.Proxy.Families, svcNodeA.Addresses) {
				st := changetracker.NewServiceChangeTracker(family, nil, changetracker.WithNodeIPs(svcNodeA.Addresses...))
				et := changetracker.NewEndpointsChangeTracker(family, svcThisNode, nil)
				svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
				if !slices.ContainsFunc(r.NotProxied, func(s string) bool { return strings.HasPrefix(s, "owned by") || strings.HasPrefix(s, "headless") }) {
					st.Update(nil, in.Service)
				}
				for _, s := range in.Slices {
					if _, headless := s.Labels[v1.IsHeadlessService]; !headless {
						et.EndpointSliceUpdate(s, false)
					}
				}
				svcMap.Update(st)
				epMap.Update(et)
				for name, sp := range svcMap {
					cluster, local, _, _ := changetracker.CategorizeEndpoints(epMap[name], sp, svcThisNode, svcNodeA.Labels)
					internal, external := cluster, cluster
					if sp.InternalPolicyLocal() {
						internal = local
					}
					if sp.ExternalPolicyLocal() {
						external = local
					}
					if !sp.ExternallyAccessible() {
						external = nil
					}
					gotInternal, gotExternal := svcUsedIn(r, name, family)
					if diff := cmp.Diff(svcEndpointStrings(internal), gotInternal); diff != "" {
						t.Errorf("%s %s internal endpoints (-trackers +report):\n%s", name, family, diff)
					}
					if diff := cmp.Diff(svcEndpointStrings(external), gotExternal); diff != "" {
						t.Errorf("%s %s external endpoints (-trackers +report):\n%s", name, family, diff)
					}
				}
				// A port the trackers do not hold uses no endpoint.
				for _, p := range r.Ports {
					name := changetracker.ServicePortName{Port: p.Name, Protocol: p.Protocol}
					name.Namespace, name.Name = r.Namespace, r.Name
					if _, ok := svcMap[name]; ok || p.Family != family {
						continue
					}
					if i, e := svcUsedIn(r, name, family); len(i) > 0 || len(e) > 0 {
						t.Errorf("%s %s: the report uses %q %q, the trackers hold no such port", name, family, i, e)
					}
				}
			}
		})
	}
}

func svcEndpointStrings(eps []changetracker.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		out = append(out, ep.String())
	}
	slices.Sort(out)
	return out
}

// svcUsedIn returns the "ip:port" of the endpoints the report calls used
// for internal and external traffic of one port and family, sorted.
func svcUsedIn(r *ServiceReport, name changetracker.ServicePortName, family v1.IPFamily) (internal, external []string) {
	for _, p := range r.Ports {
		if p.Name != name.Port || p.Protocol != name.Protocol || p.Family != family {
			continue
		}
		for _, e := range p.Endpoints {
			ip, _ := changetracker.ParseAddr(e.Address)
			s := netip.AddrPortFrom(ip, uint16(e.Port)).String()
			if e.Internal.Used {
				internal = append(internal, s)
			}
			if e.External != nil && e.External.Used {
				external = append(external, s)
			}
		}
	}
	slices.Sort(internal)
	slices.Sort(external)
	return internal, external
}

func TestExplainServiceWaysIn(t *testing.T) {
	svc := svcTestService(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"203.0.113.7"}
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 31000
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.9"}}
	})
	r, err := ExplainService(ServiceInput{Service: svc, Node: svcNodeA, Slices: []*discoveryv1.EndpointSlice{
		svcTestSlice("web-1", "http", svcEP("10.244.1.10", svcThisNode, "r"), svcEP("10.244.2.10", "node-b", "r")),
	}})
	if err != nil {
		t.Fatal(err)
	}
	all, local := []string{"10.244.1.10:8080", "10.244.2.10:8080"}, []string{"10.244.1.10:8080"}
	want := []WayIn{
		{Kind: WayClusterIP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP, Policy: "Cluster", Endpoints: all},
		{Kind: WayNodePort, Port: 30080, Protocol: v1.ProtocolTCP, Policy: "Local", Endpoints: local},
		{Kind: WayExternalIP, IP: netip.MustParseAddr("203.0.113.7"), Port: 80, Protocol: v1.ProtocolTCP, Policy: "Local", Endpoints: local},
		{Kind: WayLoadBalancer, IP: netip.MustParseAddr("198.51.100.9"), Port: 80, Protocol: v1.ProtocolTCP, Policy: "Local", Endpoints: local},
	}
	if diff := cmp.Diff(want, r.Ports[0].WaysIn, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("ways in (-want +got):\n%s", diff)
	}
}

func TestExplainServicePort(t *testing.T) {
	svc := svcTestService(func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "metrics", Port: 9090, Protocol: v1.ProtocolTCP})
	})
	for _, tc := range []struct {
		port string
		want []string
	}{{"", []string{"http", "metrics"}}, {"metrics", []string{"metrics"}}, {"80", []string{"http"}}} {
		r, err := ExplainService(ServiceInput{Service: svc, Node: svcNodeA, Port: tc.port})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range r.Ports {
			got = append(got, p.Name)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("port %q (-want +got):\n%s", tc.port, diff)
		}
	}
	if _, err := ExplainService(ServiceInput{Service: svc, Node: svcNodeA, Port: "nope"}); err == nil {
		t.Error("port nope: no error")
	}
}

// TestServiceReportEscapes checks that API text with control characters
// reaches neither the text nor the JSON output raw, and that the JSON
// still decodes to the text as it was.
func TestServiceReportEscapes(t *testing.T) {
	evil := "web\x1b[31m\u009b2J\u202e\nx"
	svc := svcTestService(func(s *v1.Service) { s.Name = evil })
	sl := svcTestSlice("web-1\x1b]0;pwned\a", "http", svcEP("10.244.1.10", "node\x1b[2J", "r"))
	sl.Labels[discoveryv1.LabelServiceName] = evil
	r, err := ExplainService(ServiceInput{Service: svc, Node: svcNodeA, Slices: []*discoveryv1.EndpointSlice{sl}})
	if err != nil {
		t.Fatal(err)
	}
	var text, js bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string][]byte{"text": text.Bytes(), "json": js.Bytes()} {
		for i, c := range out {
			if (c < 0x20 && c != '\n') || c >= 0x7f {
				t.Errorf("%s output has byte %#x at %d:\n%s", name, c, i, out)
				break
			}
		}
	}
	if !strings.Contains(text.String(), `"web\x1b[31m\u009b2J\u202e\nx"`) {
		t.Errorf("text output does not name the Service escaped:\n%s", text.String())
	}
	var back ServiceReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Name != evil || back.Slices[0].Name != sl.Name {
		t.Errorf("JSON decodes to %q, %q; want %q, %q", back.Name, back.Slices[0].Name, evil, sl.Name)
	}
}
