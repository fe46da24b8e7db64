package changetracker

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
)

// TestServiceSpecialAddresses feeds Services whose cluster IP, external IP
// or load-balancer ingress IP is one the API server never hands out or
// accepts, or an address of the node, through trackers of both families
// that know the node's addresses, beside a good Service. A bad cluster IP
// refuses the Service (in both families) with one log line naming it; a
// bad external or ingress IP is dropped alone; an external or ingress IP
// equal to a node address is kept, as the API server and kube-proxy keep
// it.
func TestServiceSpecialAddresses(t *testing.T) {
	nodeIPs := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}
	good := makeService("ns", "good", withClusterIPs("10.96.0.20", "fd00::20"))
	lb := func(ips ...string) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			for _, ip := range ips {
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
			}
		}
	}
	external := func(ips ...string) func(*v1.Service) {
		return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
	}
	type port struct {
		Str                 string
		ExternalIPs, LBVIPs []string
	}
	type testCase struct {
		name string
		svc  *v1.Service
		// want4 and want6 are the bad Service's ports in each family's map.
		want4, want6 map[string]port
		// wantLogs are the log lines at the default verbosity naming
		// ns/bad, from each tracker: a refused Service is refused by both.
		wantLogs []string
	}
	tests := []testCase{{
		name:  "good",
		svc:   makeService("ns", "bad", withClusterIPs("10.96.0.10", "fd00::10")),
		want4: map[string]port{"ns/bad:http/TCP": {Str: "10.96.0.10:80/TCP"}},
		want6: map[string]port{"ns/bad:http/TCP": {Str: "[fd00::10]:80/TCP"}},
	}, {
		name:  "external IPs: special ones dropped, the node's kept",
		svc:   makeService("ns", "bad", external("127.0.0.1", "0.0.0.0", "255.255.255.255", "224.0.0.1", "::ffff:127.0.0.1", "192.0.2.10", "203.0.113.1")),
		want4: map[string]port{"ns/bad:http/TCP": {Str: "10.96.0.10:80/TCP", ExternalIPs: []string{"192.0.2.10", "203.0.113.1"}}},
		wantLogs: []string{"Ignoring invalid external IP", "Ignoring invalid external IP", "Ignoring invalid external IP",
			"Ignoring invalid external IP", "Ignoring invalid external IP"},
	}, {
		name:  "load-balancer IPs: special ones dropped, the node's kept",
		svc:   makeService("ns", "bad", lb("127.0.0.1", "0.0.0.0", "255.255.255.255", "ff02::1", "169.254.1.1", "192.0.2.10", "203.0.113.1")),
		want4: map[string]port{"ns/bad:http/TCP": {Str: "10.96.0.10:80/TCP", LBVIPs: []string{"192.0.2.10", "203.0.113.1"}}},
		wantLogs: []string{"Ignoring invalid load-balancer ingress IP", "Ignoring invalid load-balancer ingress IP",
			"Ignoring invalid load-balancer ingress IP", "Ignoring invalid load-balancer ingress IP",
			"Ignoring invalid load-balancer ingress IP"},
	}}
	// Cluster IPs that refuse the Service, in both families.
	for _, ips := range [][]string{
		{"127.0.0.1"}, {"::1"}, {"0.0.0.0"}, {"::"}, {"255.255.255.255"},
		{"239.1.1.1"}, {"ff05::1"}, {"169.254.169.254"}, {"fe80::1"},
		{"::ffff:10.0.0.1"},            // IPv4-mapped
		{"192.0.2.10"},                 // the node's
		{"10.96.0.10", "2001:db8::10"}, // the node's, in the other family
		{"127.0.0.1", "fd00::10"},      // loopback, in the other family
	} {
		tests = append(tests, testCase{
			name:     "cluster IPs " + strings.Join(ips, ","),
			svc:      makeService("ns", "bad", withClusterIPs(ips...)),
			wantLogs: []string{"Ignoring invalid service"},
		})
	}
	describe := func(m ServicePortMap) map[string]port {
		out := map[string]port{}
		for name, p := range m {
			if name.Name == "good" {
				continue
			}
			d := port{Str: p.String()}
			for _, ip := range p.ExternalIPs() {
				d.ExternalIPs = append(d.ExternalIPs, ip.String())
			}
			for _, ip := range p.LoadBalancerVIPs() {
				d.LBVIPs = append(d.LBVIPs, ip.String())
			}
			out[name.String()+"/"+string(name.Protocol)] = d
		}
		return out
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				want := tc.want4
				if family == v1.IPv6Protocol {
					want = tc.want6
				}
				if want == nil {
					want = map[string]port{}
				}
				logger := bufferedLogger(t)
				tr := NewServiceChangeTracker(family, nil, WithLogger(logger), WithNodeIPs(nodeIPs...))
				tr.Update(nil, tc.svc)
				tr.Update(nil, good)
				m := ServicePortMap{}
				m.Update(tr)
				if diff := cmp.Diff(want, describe(m)); diff != "" {
					t.Errorf("%s: ports of ns/bad (-want +got):\n%s", family, diff)
				}
				wantLogs := tc.wantLogs
				if family == v1.IPv6Protocol && tc.want4 != nil {
					// A Service kept in IPv4 only is not looked at
					// further by the IPv6 tracker.
					wantLogs = nil
				}
				if diff := cmp.Diff(wantLogs, defaultLogs(logger, "service", "ns/bad")); diff != "" {
					t.Errorf("%s: log lines naming ns/bad (-want +got):\n%s", family, diff)
				}
				if len(m) == 0 {
					t.Errorf("%s: the good Service is missing", family)
				}
			}
		})
	}
}
