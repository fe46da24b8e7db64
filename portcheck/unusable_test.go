package portcheck_test

import (
	"bytes"
	"net/netip"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/portcheck"
)

// port is a caller's own ServicePort: a tracker-made one with other
// addresses.
type port struct {
	changetracker.ServicePort
	clusterIP         netip.Addr
	externalIPs, vips []netip.Addr
}

func (p *port) ClusterIP() netip.Addr          { return p.clusterIP }
func (p *port) ExternalIPs() []netip.Addr      { return p.externalIPs }
func (p *port) LoadBalancerVIPs() []netip.Addr { return p.vips }

// endpoint is a caller's own Endpoint with another address.
type endpoint struct {
	changetracker.Endpoint
	ip netip.Addr
}

func (e *endpoint) IP() netip.Addr { return e.ip }
func (e *endpoint) Port() int      { return 8080 }

func basePort(t *testing.T) changetracker.ServicePort {
	t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIPs: []string{"10.96.0.1"},
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	p, err := changetracker.NewBaseServicePort(klog.Background(), svc, &svc.Spec.Ports[0], v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUnusableAddresses(t *testing.T) {
	a := netip.MustParseAddr
	node := a("192.168.0.10")
	for _, tc := range []struct {
		name        string
		clusterIP   netip.Addr
		externalIPs []netip.Addr
		vips        []netip.Addr
		wantValue   any // nil: usable
	}{
		{name: "good", clusterIP: a("10.96.0.1"), externalIPs: []netip.Addr{a("192.0.2.1")}, vips: []netip.Addr{a("192.0.2.2")}},
		{name: "node address as external and LB IP", clusterIP: a("10.96.0.1"), externalIPs: []netip.Addr{node}, vips: []netip.Addr{node}},
		{name: "special addresses of the other family are not this writer's", clusterIP: a("10.96.0.1"),
			externalIPs: []netip.Addr{a("::1")}, vips: []netip.Addr{a("fe80::1")}},
		{name: "cluster IP of the node", clusterIP: node, wantValue: node},
		{name: "cluster IP loopback", clusterIP: a("127.0.0.1"), wantValue: a("127.0.0.1")},
		{name: "cluster IP unspecified", clusterIP: a("0.0.0.0"), wantValue: a("0.0.0.0")},
		{name: "cluster IP broadcast", clusterIP: a("255.255.255.255"), wantValue: a("255.255.255.255")},
		{name: "cluster IP multicast", clusterIP: a("239.0.0.1"), wantValue: a("239.0.0.1")},
		{name: "cluster IP link-local", clusterIP: a("169.254.0.1"), wantValue: a("169.254.0.1")},
		{name: "cluster IP IPv4-mapped", clusterIP: a("::ffff:10.0.0.1"), wantValue: a("::ffff:10.0.0.1")},
		{name: "external IP loopback", clusterIP: a("10.96.0.1"), externalIPs: []netip.Addr{a("192.0.2.1"), a("127.0.0.2")}, wantValue: a("127.0.0.2")},
		{name: "LB IP multicast", clusterIP: a("10.96.0.1"), vips: []netip.Addr{a("224.0.0.1")}, wantValue: a("224.0.0.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &port{ServicePort: basePort(t), clusterIP: tc.clusterIP, externalIPs: tc.externalIPs, vips: tc.vips}
			reason, value := portcheck.New(v1.IPv4Protocol, netip.MustParseAddr("::ffff:192.168.0.10")).Unusable(p)
			if (reason == "") != (tc.wantValue == nil) {
				t.Errorf("reason %q, want one: %v", reason, tc.wantValue != nil)
			}
			if diff := cmp.Diff(tc.wantValue, value, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("offending value (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLogLinesCannotBeForged checks that a port name, an offending value
// and an endpoint address carrying line breaks and carriage returns
// print escaped: every line of the log is one klog wrote.
func TestLogLinesCannotBeForged(t *testing.T) {
	const forged = "\nE1127 00:00:00.000000       1 forged.go:1] \"forged\"\r"
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
	c := portcheck.New(v1.IPv4Protocol)
	name := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns" + forged, Name: "a" + forged},
		Port: "p" + forged, Protocol: v1.Protocol("TCP" + forged)}
	p := &port{ServicePort: basePort(t), clusterIP: netip.MustParseAddr("fe80::1").WithZone("eth0" + forged)}
	c.Usable(logger, name, p, "", nil)
	c.Usable(logger, name, basePort(t), "the writer's own check", "value"+forged)
	c.UsableEndpoints(logger, name, []changetracker.Endpoint{&endpoint{ip: netip.MustParseAddr("fe80::2").WithZone("eth0" + forged)}})
	header := regexp.MustCompile(`^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ [^ :]+:\d+\] `)
	lines := regexp.MustCompile(`\r\n|\n|\r`).Split(buf.String(), -1)
	lines = lines[:len(lines)-1] // after the last line break
	if len(lines) != 3 {
		t.Errorf("%d log lines, want 3:\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		if !header.MatchString(l) || regexp.MustCompile(`^E1127 00:00:00`).MatchString(l) {
			t.Errorf("line %d is not a klog line (forged or split): %q", i+1, l)
		}
	}
}

// TestServiceCIDRs checks that a cluster IP outside every known
// ServiceCIDR of the family is refused, and that unknown ranges (none, or
// only ones of the other family or not valid) check nothing.
func TestServiceCIDRs(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	for _, tc := range []struct {
		name      string
		family    v1.IPFamily
		cidrs     []netip.Prefix
		clusterIP netip.Addr
		refused   bool
	}{
		{name: "unknown", family: v1.IPv4Protocol, clusterIP: a("10.97.0.1")},
		{name: "inside", family: v1.IPv4Protocol, cidrs: []netip.Prefix{p("10.96.0.0/16")}, clusterIP: a("10.96.3.4")},
		{name: "outside", family: v1.IPv4Protocol, cidrs: []netip.Prefix{p("10.96.0.0/16")}, clusterIP: a("10.97.0.1"), refused: true},
		{name: "inside the second of nested ranges", family: v1.IPv4Protocol,
			cidrs: []netip.Prefix{p("10.96.0.0/20"), p("10.96.0.0/12")}, clusterIP: a("10.100.0.1")},
		{name: "IPv4-mapped range, inside", family: v1.IPv4Protocol, cidrs: []netip.Prefix{p("::ffff:10.96.0.0/112")}, clusterIP: a("10.96.0.1")},
		{name: "IPv4-mapped range, outside", family: v1.IPv4Protocol, cidrs: []netip.Prefix{p("::ffff:10.96.0.0/112")},
			clusterIP: a("10.97.0.1"), refused: true},
		{name: "unmasked range", family: v1.IPv4Protocol, cidrs: []netip.Prefix{p("10.96.1.1/16")}, clusterIP: a("10.96.200.1")},
		{name: "only ranges of the other family: unknown", family: v1.IPv4Protocol,
			cidrs: []netip.Prefix{p("fd00::/108"), {}}, clusterIP: a("10.97.0.1")},
		{name: "IPv6 outside", family: v1.IPv6Protocol, cidrs: []netip.Prefix{p("10.97.0.0/16"), p("fd00::/108")},
			clusterIP: a("fd00:1::1"), refused: true},
		{name: "IPv6 inside", family: v1.IPv6Protocol, cidrs: []netip.Prefix{p("fd00::/108")}, clusterIP: a("fd00::1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := &port{ServicePort: basePort(t), clusterIP: tc.clusterIP}
			c := portcheck.New(tc.family)
			reason, value := c.WithServiceCIDRs(tc.cidrs).Unusable(port)
			want := ""
			if tc.refused {
				want = "cluster IP is outside the ServiceCIDRs"
			}
			if reason != want {
				t.Errorf("reason %q (value %v), want %q", reason, value, want)
			}
			// The original checks nothing against them.
			if reason, _ := c.Unusable(port); reason != "" {
				t.Errorf("WithServiceCIDRs changed its receiver: %q", reason)
			}
		})
	}
}
