package nftables_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables"
)

// skewedPort is a tracker-made service port with some fields replaced:
// what a caller's own ServicePort implementation can hand the writer.
type skewedPort struct {
	changetracker.ServicePort
	clusterIP *netip.Addr
	port      *int
	protocol  *v1.Protocol
	age       *int
	nodePort  *int
	hcPort    *int
	affinity  *v1.ServiceAffinity
	// externalIPs, vips and sources replace the lists when not nil.
	externalIPs, vips []netip.Addr
	sources           []netip.Prefix
}

func (p *skewedPort) ExternalIPs() []netip.Addr {
	if p.externalIPs != nil {
		return p.externalIPs
	}
	return p.ServicePort.ExternalIPs()
}

func (p *skewedPort) LoadBalancerVIPs() []netip.Addr {
	if p.vips != nil {
		return p.vips
	}
	return p.ServicePort.LoadBalancerVIPs()
}

func (p *skewedPort) LoadBalancerSourceRanges() []netip.Prefix {
	if p.sources != nil {
		return p.sources
	}
	return p.ServicePort.LoadBalancerSourceRanges()
}

func (p *skewedPort) NodePort() int {
	if p.nodePort != nil {
		return *p.nodePort
	}
	return p.ServicePort.NodePort()
}

func (p *skewedPort) HealthCheckNodePort() int {
	if p.hcPort != nil {
		return *p.hcPort
	}
	return p.ServicePort.HealthCheckNodePort()
}

func (p *skewedPort) SessionAffinityType() v1.ServiceAffinity {
	if p.affinity != nil {
		return *p.affinity
	}
	return p.ServicePort.SessionAffinityType()
}

func (p *skewedPort) ClusterIP() netip.Addr {
	if p.clusterIP != nil {
		return *p.clusterIP
	}
	return p.ServicePort.ClusterIP()
}

func (p *skewedPort) Port() int {
	if p.port != nil {
		return *p.port
	}
	return p.ServicePort.Port()
}

func (p *skewedPort) Protocol() v1.Protocol {
	if p.protocol != nil {
		return *p.protocol
	}
	return p.ServicePort.Protocol()
}

func (p *skewedPort) StickyMaxAgeSeconds() int {
	if p.age != nil {
		return *p.age
	}
	return p.ServicePort.StickyMaxAgeSeconds()
}

func ptrTo[T any](v T) *T { return &v }

// TestWriterSkipsBadInput gives the writer, beside a good service, a port
// with one field nft would refuse (or that would reach the transaction
// unescaped); the bad port alone is left out, and the transaction runs.
func TestWriterSkipsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		port changetracker.ServicePortName
		mod  func(*skewedPort)
	}{
		{"namespace with a space", svcPortName("bad ns", "x", "p"), nil},
		{"name with a quote", svcPortName("bad", `x"y`, "p"), nil},
		{"port name with a brace", svcPortName("bad", "x", "p}"), nil},
		{"uppercase name", svcPortName("bad", "X", "p"), nil},
		{"cluster IP of the other family", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.clusterIP = ptrTo(addr("fd00::1")) }},
		{"zoned cluster IP", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.clusterIP = ptrTo(addr("fe80::1%eth0")) }},
		{"port 0", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.port = ptrTo(0) }},
		{"unknown protocol", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.protocol = ptrTo(v1.Protocol("ICMP")) }},
		{"protocol other than the name's", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.protocol = ptrTo(v1.ProtocolUDP) }},
		{"port beyond 65535", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.port = ptrTo(65536) }},
		{"node port beyond 65535", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.nodePort = ptrTo(70000) }},
		{"negative health check node port", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.hcPort = ptrTo(-1) }},
		{"affinity timeout 0", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.age = ptrTo(0) }},
		{"affinity timeout beyond a day", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.age = ptrTo(86401) }},
		{"unknown session affinity", svcPortName("bad", "x", "p"), func(p *skewedPort) { p.affinity = ptrTo(v1.ServiceAffinity("Cookie")) }},
		{"name's protocol unknown", changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bad", Name: "x"}, Port: "p", Protocol: "tcp } ; flush ruleset"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			c.setService(makeService("ns", "good", "10.96.0.1", withAffinity(100)))
			c.setEndpoints("ns", "good", tcp8080, local("10.0.1.1"))
			in := c.input()
			good := svcPortName("ns", "good", "p")
			sp := &skewedPort{ServicePort: c.ServiceMap[good]}
			if tc.mod != nil {
				tc.mod(sp)
			}
			in.Services[tc.port] = sp
			in.Endpoints[tc.port] = in.Endpoints[good]
			fake, w := newFake(t, baseConfig())
			res := syncFake(t, w, fake, in)
			if res.ServicePorts != 1 {
				t.Errorf("%d service ports programmed, want 1 (the good one)", res.ServicePorts)
			}
			if d := fake.Dump(); strings.Contains(d, "bad") {
				t.Errorf("the bad port reached the table:\n%s", d)
			}
		})
	}
}

// TestWriterSkipsBadAddresses gives the writer a load-balancer port whose
// external IPs, load-balancer VIPs and source ranges each mix a good
// address with a zoned one, one of the other family and an invalid one:
// the bad addresses alone are left out, and the port is programmed with
// the good ones.
func TestWriterSkipsBadAddresses(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "lb", "10.96.0.1", withLoadBalancer("192.0.2.10", "198.51.100.0/24")))
	c.setEndpoints("ns", "lb", tcp8080, local("10.0.1.1"))
	in := c.input()
	name := svcPortName("ns", "lb", "p")
	in.Services[name] = &skewedPort{ServicePort: c.ServiceMap[name],
		externalIPs: []netip.Addr{addr("fe80::1%eth0"), addr("2001:db8::7"), {}, addr("192.0.2.7")},
		vips:        []netip.Addr{addr("fe80::2%eth0"), addr("2001:db8::10"), {}, addr("192.0.2.10")},
		sources:     []netip.Prefix{prefix("2001:db8::/64"), {}, prefix("198.51.100.0/24")},
	}
	fake, w := newFake(t, baseConfig())
	res := syncFake(t, w, fake, in)
	if res.ServicePorts != 1 {
		t.Errorf("%d service ports programmed, want 1", res.ServicePorts)
	}
	d := fake.Dump()
	for _, want := range []string{"192.0.2.7 . tcp . 80", "192.0.2.10 . tcp . 80", "198.51.100.0/24"} {
		if !strings.Contains(d, want) {
			t.Errorf("the table lacks %q:\n%s", want, d)
		}
	}
	for _, bad := range []string{"%eth0", "fe80", "2001:db8", "invalid"} {
		if strings.Contains(d, bad) {
			t.Errorf("a bad address (%q) reached the table:\n%s", bad, d)
		}
	}
}

// skewedEndpoint is a tracker-made endpoint with another address and
// port: what a caller's own Endpoint implementation can hand the writer.
type skewedEndpoint struct {
	changetracker.Endpoint
	ip   netip.Addr
	port int
}

func (e *skewedEndpoint) IP() netip.Addr { return e.ip }
func (e *skewedEndpoint) Port() int      { return e.port }

// TestWriterSkipsBadEndpoints gives the writer, beside a good endpoint,
// endpoints nft would refuse; they alone are left out, and the port keeps
// its good endpoint.
func TestWriterSkipsBadEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		ip   string
		port int
	}{
		{"address of the other family", "fd00::9", 8080},
		{"zoned address", "fe80::9%eth0", 8080},
		{"port 0", "10.0.1.9", 0},
		{"port beyond 65535", "10.0.1.9", 65536},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			c.setService(makeService("ns", "good", "10.96.0.1"))
			c.setEndpoints("ns", "good", tcp8080, local("10.0.1.1"))
			in := c.input()
			good := svcPortName("ns", "good", "p")
			eps := in.Endpoints[good]
			in.Endpoints[good] = append(slices.Clip(eps), &skewedEndpoint{Endpoint: eps[0], ip: addr(tc.ip), port: tc.port})
			fake, w := newFake(t, baseConfig())
			res := syncFake(t, w, fake, in)
			if res.ServicePorts != 1 {
				t.Errorf("%d service ports programmed, want 1", res.ServicePorts)
			}
			d := fake.Dump()
			if !strings.Contains(d, "10.0.1.1") {
				t.Errorf("the good endpoint is missing:\n%s", d)
			}
			for _, bad := range []string{"fd00::9", "fe80::9", "10.0.1.9"} {
				if strings.Contains(d, bad) {
					t.Errorf("the bad endpoint %s reached the table:\n%s", bad, d)
				}
			}
		})
	}
}

func svcPortName(ns, name, port string) changetracker.ServicePortName {
	return changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: v1.ProtocolTCP}
}

// FuzzWriterNames gives the writer service ports with arbitrary names
// and checks that whatever it writes parses back in the Fake (its Dump
// read by ParseDump gives the same Dump), holds one line per operation
// (nothing broke out of a name or comment), and touches only the
// writer's table.
func FuzzWriterNames(f *testing.F) {
	for _, s := range [][3]string{
		{"ns", "web", "http"},
		{"ns", "web", ""},
		{"a b", "c\nd", "e;f"},
		{"ns", `x" ; flush ruleset ; "`, "p"},
		{"ns", "x } ; delete table ip other ; {", "p"},
		{strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63)},
		{"ns", "web", "@set"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, ns, name, port string) {
		c := newCluster(v1.IPv4Protocol, node)
		c.setService(makeService("ns", "good", "10.96.0.1"))
		c.setEndpoints("ns", "good", tcp8080, local("10.0.1.1"))
		in := c.input()
		good := svcPortName("ns", "good", "p")
		fuzzed := svcPortName(ns, name, port)
		in.Services[fuzzed] = c.ServiceMap[good]
		in.Endpoints[fuzzed] = in.Endpoints[good]
		writertest.MarkChanged(&in.ServiceChanges, fuzzed)

		fake := knftables.NewFake("", "")
		// Another table, which the writer must leave alone.
		tx := fake.NewTransaction()
		tx.Add(&knftables.Table{Family: knftables.IPv4Family, Name: "other"})
		tx.Add(&knftables.Chain{Family: knftables.IPv4Family, Table: "other", Name: "keep"})
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		w, err := nftables.NewWriter(fake, baseConfig())
		if err != nil {
			t.Fatal(err)
		}
		ctx := klog.NewContext(context.Background(), klog.Background().V(10))
		for range 2 { // a full sync, then a partial one
			res := w.Sync(ctx, in)
			text := res.Transaction.String()
			if strings.Contains(text, "# ERROR") {
				t.Fatalf("invalid transaction:\n%s", text)
			}
			if n := strings.Count(text, "\n"); n != res.Transaction.NumOperations() {
				t.Fatalf("%d lines for %d operations:\n%s", n, res.Transaction.NumOperations(), text)
			}
			lines := strings.Split(strings.TrimSpace(text), "\n")
			if text == "" {
				lines = nil // a partial sync of a port whose elements stand
			}
			for _, line := range lines {
				if !strings.Contains(line, " ip kube-proxy") {
					t.Fatalf("operation outside the writer's table: %q", line)
				}
			}
			err := fake.Run(ctx, res.Transaction)
			w.Applied(err)
			if err != nil {
				t.Fatalf("transaction failed: %v\n%s", err, text)
			}
			writertest.MarkChanged(&in.ServiceChanges, fuzzed)
		}
		if fake.Tables[knftables.IPv4Family]["other"].Chains["keep"] == nil {
			t.Fatal("the other table's chain is gone")
		}
		dump := fake.Dump()
		again := knftables.NewFake("", "")
		if err := again.ParseDump(dump); err != nil {
			t.Fatalf("the table does not parse back: %v\n%s", err, dump)
		}
		if got := again.Dump(); got != dump {
			t.Fatalf("the table parses back differently:\n%s\nvs\n%s", dump, got)
		}
	})
}

// TestCleanup deletes the table of both families and leaves others.
func TestCleanup(t *testing.T) {
	fakes := map[knftables.Family]*knftables.Fake{}
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		fake := knftables.NewFake("", "")
		tx := fake.NewTransaction()
		tx.Add(&knftables.Table{Family: family, Name: "kube-proxy"})
		tx.Add(&knftables.Table{Family: family, Name: "other"})
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		fakes[family] = fake
	}
	newFake := func(f knftables.Family, _ string) (knftables.Interface, error) { return fakes[f], nil }
	if err := nftables.Cleanup(context.Background(), "", newFake); err != nil {
		t.Fatal(err)
	}
	for family, fake := range fakes {
		if fake.Tables[family]["kube-proxy"] != nil || fake.Tables[family]["other"] == nil {
			t.Errorf("%s: tables after cleanup:\n%s", family, fake.Dump())
		}
	}
	// Nothing left to delete is not an error.
	if err := nftables.Cleanup(context.Background(), "", newFake); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
	if err := nftables.Cleanup(context.Background(), "bad name", newFake); err == nil {
		t.Error("cleanup accepted a table name with a space")
	}
}

// TestWriterDuplicateEndpoint: an endpoint that a caller's EndpointsMap
// lists twice gets one index in the endpoints map, in a full sync as in a
// partial one, so that the two agree.
func TestWriterDuplicateEndpoint(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "web", "10.96.0.10"))
	c.setEndpoints("ns", "web", tcp8080, remote("10.0.2.1"), remote("10.0.2.2"))
	in := c.input()
	name := svcPortName("ns", "web", "p")
	in.Endpoints[name] = append(slices.Clip(in.Endpoints[name]), in.Endpoints[name][0])
	fake, w := newFake(t, baseConfig())
	syncFake(t, w, fake, in)
	dump := fake.Dump()
	if !strings.Contains(dump, "10.96.0.10 . tcp . 80 : goto lb-2 }") || strings.Contains(dump, ". 80 . 2 :") {
		t.Errorf("endpoint listed twice: want 2 indexes and lb-2:\n%s", dump)
	}
}
