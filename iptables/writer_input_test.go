package iptables_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// skewedPort is a service port whose fields are those of a port the
// tracker made, except the ones set here: what a caller's own
// MakeServicePortFunc or ServicePort implementation can hand the writer,
// whatever the tracker checks.
type skewedPort struct {
	changetracker.ServicePort
	clusterIP                        *netip.Addr
	port, nodePort, healthCheck, age *int
	protocol                         *v1.Protocol
	affinity                         *v1.ServiceAffinity
	externalIPs, vips                []netip.Addr
	ranges                           []netip.Prefix
}

func (p *skewedPort) ClusterIP() netip.Addr { return pick(p.clusterIP, p.ServicePort.ClusterIP) }
func (p *skewedPort) Port() int             { return pick(p.port, p.ServicePort.Port) }
func (p *skewedPort) NodePort() int         { return pick(p.nodePort, p.ServicePort.NodePort) }
func (p *skewedPort) HealthCheckNodePort() int {
	return pick(p.healthCheck, p.ServicePort.HealthCheckNodePort)
}
func (p *skewedPort) StickyMaxAgeSeconds() int   { return pick(p.age, p.ServicePort.StickyMaxAgeSeconds) }
func (p *skewedPort) Protocol() v1.Protocol      { return pick(p.protocol, p.ServicePort.Protocol) }
func (p *skewedPort) ExternallyAccessible() bool { return true }
func (p *skewedPort) SessionAffinityType() v1.ServiceAffinity {
	return pick(p.affinity, p.ServicePort.SessionAffinityType)
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
	if p.ranges != nil {
		return p.ranges
	}
	return p.ServicePort.LoadBalancerSourceRanges()
}

func pick[T any](v *T, base func() T) T {
	if v != nil {
		return *v
	}
	return base()
}

// skewedEndpoint is an endpoint the tracker made with its address or
// port replaced.
type skewedEndpoint struct {
	changetracker.Endpoint
	ip   *netip.Addr
	port *int
}

func (e *skewedEndpoint) IP() netip.Addr { return pick(e.ip, e.Endpoint.IP) }
func (e *skewedEndpoint) Port() int      { return pick(e.port, e.Endpoint.Port) }

func ptrTo[T any](v T) *T { return &v }

// richService is a Service whose one port uses every kind of rule the
// writer writes: node port, health check node port, external IP, load
// balancer with source ranges, session affinity, Local external policy.
func richService(ns, name, clusterIP string, nodePort int32) *v1.Service {
	return makeService(ns, name, clusterIP, withNodePort(nodePort), withExternalIPs("192.0.2.10"),
		withLoadBalancer("192.0.2.20", "203.0.113.0/24"), withExternalLocal(), withHealthCheckNodePort(nodePort+1000),
		withAffinity(60))
}

// badInputCluster is a cluster with a good Service ns/good and the port
// "bad/bad:p", a copy of a good port with the same endpoints that mod
// skews, which the tracker never saw.
func badInputCluster(t *testing.T, mod func(*skewedPort, []changetracker.Endpoint) []changetracker.Endpoint) (*cluster, *proxy.FamilyInput, changetracker.ServicePortName) {
	t.Helper()
	c := newCluster(v1.IPv4Protocol, "node-a")
	c.setService(richService("ns", "good", "10.96.0.1", 30001))
	c.setEndpoints("ns", "good", tcp8080, ep{IP: "10.1.0.1", Node: "node-a"}, ep{IP: "10.1.0.2", Node: "node-b"})
	in := c.input()
	good := svcPortName("ns", "good", "p")
	bad := svcPortName("bad", "bad", "p")
	sp := &skewedPort{ServicePort: c.ServiceMap[good]}
	eps := slices.Clone(c.EndpointsMap[good])
	eps = mod(sp, eps)
	c.ServiceMap[bad] = sp
	c.EndpointsMap[bad] = eps
	writertest.MarkChanged(&in.ServiceChanges, bad)
	return c, in, bad
}

func svcPortName(ns, name, port string) changetracker.ServicePortName {
	return changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: v1.ProtocolTCP}
}

// TestWriterSkipsBadInput gives the writer, beside a good service port,
// a port with one field iptables-restore would refuse, for every field
// that reaches the payload. The bad port (or, for an address or an
// endpoint, that address or endpoint alone) is left out; the payload
// restores into the strict fake; and a Service added later, in a partial
// sync, gets its rules while the bad port is still there.
func TestWriterSkipsBadInput(t *testing.T) {
	mapped := netip.MustParseAddr("::ffff:10.96.0.9")
	zoned := netip.MustParseAddr("fe80::1%eth0")
	for _, tc := range []struct {
		name string
		mod  func(*skewedPort, []changetracker.Endpoint) []changetracker.Endpoint
		// portKept is true when only part of the port is left out.
		portKept bool
		// absent is text the payload must not hold.
		absent string
	}{
		{name: "cluster IP of the other family", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.clusterIP = ptrTo(netip.MustParseAddr("fd00::1"))
			return e
		}},
		{name: "IPv4-mapped cluster IP", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.clusterIP = &mapped
			return e
		}},
		{name: "invalid cluster IP", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.clusterIP = &netip.Addr{}
			return e
		}},
		{name: "port 0", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint { p.port = ptrTo(0); return e }},
		{name: "port 70000", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.port = ptrTo(70000)
			return e
		}},
		{name: "node port 70000", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.nodePort = ptrTo(70000)
			return e
		}},
		{name: "node port -1", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.nodePort = ptrTo(-1)
			return e
		}},
		{name: "health check node port 65536", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.healthCheck = ptrTo(65536)
			return e
		}},
		{name: "health check node port -5", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.healthCheck = ptrTo(-5)
			return e
		}},
		{name: "affinity timeout 0", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint { p.age = ptrTo(0); return e }},
		{name: "affinity timeout -1", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint { p.age = ptrTo(-1); return e }},
		{name: "affinity timeout over a day", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.age = ptrTo(86401)
			return e
		}},
		{name: "unknown affinity", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.affinity = ptrTo(v1.ServiceAffinity("Sticky"))
			return e
		}},
		{name: "unknown protocol", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.protocol = ptrTo(v1.Protocol("ICMP"))
			return e
		}},
		{name: "IPv4-mapped external IP", portKept: true, absent: "::ffff", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.externalIPs = []netip.Addr{mapped, netip.MustParseAddr("192.0.2.11")}
			return e
		}},
		{name: "zoned and invalid load-balancer VIPs", portKept: true, absent: "%eth0", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.vips = []netip.Addr{zoned, {}, netip.MustParseAddr("192.0.2.21")}
			return e
		}},
		{name: "invalid source range", portKept: true, absent: "invalid", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			p.ranges = []netip.Prefix{{}, netip.MustParsePrefix("198.51.100.0/24")}
			return e
		}},
		{name: "endpoint of the other family", portKept: true, absent: "fd00::5", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			return append(e, &skewedEndpoint{Endpoint: e[0], ip: ptrTo(netip.MustParseAddr("fd00::5"))})
		}},
		{name: "endpoint port 0", portKept: true, absent: ":0 ", mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			return append(e, &skewedEndpoint{Endpoint: e[0], ip: ptrTo(netip.MustParseAddr("10.1.0.9")), port: ptrTo(0)})
		}},
		{name: "nil endpoint", portKept: true, mod: func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
			return append(e, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, in, bad := badInputCluster(t, tc.mod)
			w := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("10.1.0.0/16")}}})
			f := iptablestest.NewFake()
			res := syncFake(t, w, f, in)
			payload := string(res.Payload)
			if tc.absent != "" && strings.Contains(payload, tc.absent) {
				t.Errorf("the payload holds %q:\n%s", tc.absent, payload)
			}
			hasBad := f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(bad)) != nil
			if hasBad != tc.portKept {
				t.Errorf("%s has rules: %v, want %v", bad, hasBad, tc.portKept)
			}
			if f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(svcPortName("ns", "good", "p"))) == nil {
				t.Errorf("the good port has no rules")
			}
			// A Service added while the bad port is there gets its rules in
			// a partial sync.
			c.setService(richService("ns", "later", "10.96.0.3", 30003))
			c.setEndpoints("ns", "later", tcp8080, ep{IP: "10.1.0.3", Node: "node-a"})
			in2 := c.input()
			res = syncFake(t, w, f, in2)
			if res.Full {
				t.Fatalf("the second sync is full")
			}
			if f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(svcPortName("ns", "later", "p"))) == nil {
				t.Errorf("the Service added later has no rules after the partial sync:\n%s", res.Payload)
			}
		})
	}
}

// TestWriterAllowAllSourceRanges checks that a loadBalancerSourceRanges
// list holding a range of length 0 of the writer's family allows every
// source, as in kube-proxy: no KUBE-FW- chain and no firewall rule. Ranges
// of the other family restrict nothing in this one.
func TestWriterAllowAllSourceRanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		family v1.IPFamily
		vip    string
		ranges []string
		wantFW bool
	}{
		{name: "a range", family: v1.IPv4Protocol, vip: "192.0.2.20", ranges: []string{"203.0.113.0/24"}, wantFW: true},
		{name: "0.0.0.0/0", family: v1.IPv4Protocol, vip: "192.0.2.20", ranges: []string{"0.0.0.0/0"}},
		{name: "0.0.0.0/0 among others", family: v1.IPv4Protocol, vip: "192.0.2.20", ranges: []string{"203.0.113.0/24", "0.0.0.0/0"}},
		{name: "::/0 in an IPv4 writer", family: v1.IPv4Protocol, vip: "192.0.2.20", ranges: []string{"203.0.113.0/24", "::/0"}, wantFW: true},
		{name: "IPv6 ranges alone in an IPv4 writer", family: v1.IPv4Protocol, vip: "192.0.2.20", ranges: []string{"2001:db8::/64"}},
		{name: "::/0", family: v1.IPv6Protocol, vip: "2001:db8::20", ranges: []string{"2001:db8:1::/64", "::/0"}},
		{name: "an IPv6 range", family: v1.IPv6Protocol, vip: "2001:db8::20", ranges: []string{"2001:db8:1::/64"}, wantFW: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, f, clusterIP, epIP := familyCluster(tc.family)
			svc := makeService("ns", "lb", clusterIP, withLoadBalancer(tc.vip))
			// The tracker keeps both families' ranges; the writer decides.
			svc.Spec.LoadBalancerSourceRanges = tc.ranges
			c.setService(svc)
			c.setEndpoints("ns", "lb", tcp8080, ep{IP: epIP, Node: "node-a"})
			w := mustWriter(t, iptables.WriterConfig{Family: tc.family, Node: proxy.NodeConfig{Name: "node-a"}})
			syncFake(t, w, f, c.input())
			name := svcPortName("ns", "lb", "p")
			hasFW := f.Rules(iptables.TableNAT, kubeChains.ServiceFirewall(name)) != nil
			dropRules := len(f.Rules(iptables.TableFilter, iptables.KubeProxyFirewallChain))
			if hasFW != tc.wantFW || (dropRules > 0) != tc.wantFW {
				t.Errorf("KUBE-FW chain: %v, KUBE-PROXY-FIREWALL rules: %d; want a firewall: %v\n%s", hasFW, dropRules, tc.wantFW, f.Dump())
			}
		})
	}
}

// foreignState is a node's tables before the proxy: another program's
// chain and rules in built-in chains, a DROP policy.
const foreignState = `*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:OTHER - [0:0]
-A INPUT -j OTHER
-A OTHER -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:OTHER-NAT - [0:0]
-A POSTROUTING -j OTHER-NAT
COMMIT
`

// FuzzWriterNames gives the writer a service port whose namespace, name
// and port name are any bytes, with every kind of rule that carries the
// name in a comment, through a full sync and a partial one. Every payload
// must restore into the strict fake, and afterwards the built-in chains
// hold what they held plus the writer's jump rules, other programs'
// chains are untouched, and every other chain is the writer's. A name the
// writer accepts reaches the kernel intact: its cluster-IP rule carries
// the comment it was meant to.
func FuzzWriterNames(f *testing.F) {
	for _, seed := range [][3]string{
		{"default", "kubernetes", "https"},
		{"x\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-F INPUT\nCOMMIT\n*nat\n#", "svc", "p"},
		{"ns", "a\" -j ACCEPT\n-A INPUT -j ACCEPT\n#", "p"},
		{"ns", "svc", "p\\\" -j ACCEPT -m comment --comment \""},
		{"ns\x00", "svc", "p"},
		{"-t", "!", "--comment"},
		{"", "", ""},
		{"a b", "c\td", "e\rf"},
		{"ns", strings.Repeat("x", 600), "p"},
		{"ns", strings.Repeat("\"", 300), "p"},
		{"ns", "svc", strings.Repeat("y", 10300)},
		{"'", "\\", "\"\""},
		// "ns/name:port" of exactly MaxRestoreText bytes, and one more.
		{strings.Repeat("a", 255), strings.Repeat("b", 254), "c"},
		{strings.Repeat("a", 255), strings.Repeat("b", 255), "c"},
		{strings.Repeat("a", 255), strings.Repeat("b", 256), ""},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, ns, name, port string) {
		c := newCluster(v1.IPv4Protocol, "node-a")
		c.setService(richService("ns", "good", "10.96.0.1", 30001))
		c.setEndpoints("ns", "good", tcp8080, ep{IP: "10.1.0.1", Node: "node-a"}, ep{IP: "10.1.0.2", Node: "node-b"})
		in := c.input()
		good := svcPortName("ns", "good", "p")
		fuzzed := svcPortName(ns, name, port)
		if fuzzed == good {
			return
		}
		c.ServiceMap[fuzzed] = &skewedPort{ServicePort: c.ServiceMap[good], clusterIP: ptrTo(netip.MustParseAddr("10.96.0.2"))}
		c.EndpointsMap[fuzzed] = slices.Clone(c.EndpointsMap[good])
		writertest.MarkChanged(&in.ServiceChanges, fuzzed)

		fake := iptablestest.NewFake()
		if err := fake.ParseDump(foreignState); err != nil {
			t.Fatal(err)
		}
		w := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("10.1.0.0/16")}}})
		syncFake(t, w, fake, in)
		checkOwnership(t, fake)

		// A partial sync that changes the port's endpoints and top-level
		// rules: "-D" of the rules written before must match them.
		c.EndpointsMap[fuzzed] = c.EndpointsMap[fuzzed][:1]
		c.ServiceMap[fuzzed] = &skewedPort{ServicePort: c.ServiceMap[good], clusterIP: ptrTo(netip.MustParseAddr("10.96.0.2")), nodePort: ptrTo(30009)}
		in2 := &proxy.FamilyInput{
			Services: c.ServiceMap, Endpoints: c.EndpointsMap,
			ServiceChanges:  changetracker.UpdateServiceMapResult{UpdatedServices: sets.New(fuzzed.NamespacedName), DeletedUDPClusterIPs: sets.New[netip.Addr]()},
			EndpointChanges: c.EndpointsMap.Update(c.EndpointTracker),
		}
		res := syncFake(t, w, fake, in2)
		if res.Full {
			t.Fatal("the second sync is full")
		}
		checkOwnership(t, fake)

		svcChain := kubeChains.ServiceCluster(fuzzed)
		rules := fake.Rules(iptables.TableNAT, svcChain)
		accepted := rules != nil
		text := fuzzed.String()
		wantAccepted := len(text) <= iptables.MaxRestoreText && !strings.ContainsAny(text, "\x00\n")
		if accepted != wantAccepted {
			t.Fatalf("port %q has rules: %v, want %v", text, accepted, wantAccepted)
		}
		if !accepted {
			return
		}
		comment := text + " cluster IP"
		if len(comment) > 255 {
			// The kernel keeps the first 255 bytes of a comment.
			comment = comment[:255]
		}
		want := "-m comment --comment" + saveQuoted(comment) + " "
		found := false
		for _, r := range rules {
			found = found || strings.Contains(r, want)
		}
		if !found {
			t.Errorf("no rule of %s has the comment %q:\n%s", svcChain, want, strings.Join(rules, "\n"))
		}
	})
}

// saveQuoted is a string as iptables-save prints it (xtables_save_string).
func saveQuoted(s string) string {
	bare := s != ""
	for i := 0; i < len(s) && bare; i++ {
		c := s[i]
		bare = c == '_' || c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
	}
	if bare {
		return " " + s
	}
	r := strings.NewReplacer(`"`, `\"`, `\`, `\\`, `'`, `\'`)
	return ` "` + r.Replace(s) + `"`
}

// checkOwnership checks the fake against foreignState: built-in chains
// keep their policies and rules, plus the writer's jump rules; OTHER and
// OTHER-NAT are unchanged; every other chain is the writer's.
func checkOwnership(t *testing.T, fake *iptablestest.Fake) {
	t.Helper()
	before, err := foreignWithJumps()
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableNAT} {
		for _, chain := range fake.Chains(table) {
			switch {
			case chain == "OTHER" || chain == "OTHER-NAT" || isBuiltin(chain):
				got, want := fake.Rules(table, chain), before.Rules(table, chain)
				if !slices.Equal(got, want) {
					t.Errorf("%s %s: rules %q, want %q", table, chain, got, want)
				}
			case !kubeChains.IsWriterChain(table, chain):
				t.Errorf("%s %s is not the writer's chain", table, chain)
			}
		}
	}
	for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableNAT} {
		got, want := policies(fake.Dump(), table), policies(before.Dump(), table)
		if got != want {
			t.Errorf("%s policies: %s, want %s", table, got, want)
		}
	}
}

// foreignWithJumps is foreignState with the writer's jump rules added,
// made once: the fuzz target compares against it at every run.
var foreignWithJumps = sync.OnceValues(func() (*iptablestest.Fake, error) {
	f := iptablestest.NewFake()
	if err := f.ParseDump(foreignState); err != nil {
		return nil, err
	}
	w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol})
	if err != nil {
		return nil, err
	}
	return f, w.EnsureJumpRules(context.Background(), f)
})

func isBuiltin(c iptables.Chain) bool {
	switch c {
	case iptables.ChainInput, iptables.ChainForward, iptables.ChainOutput, iptables.ChainPrerouting, iptables.ChainPostrouting:
		return true
	}
	return false
}

// policies returns the built-in chains' declaration lines of table in
// dump.
func policies(dump string, table iptables.Table) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(dump, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			in = line == "*"+string(table)
		case in && strings.HasPrefix(line, ":") && !strings.Contains(line, " - "):
			fmt.Fprintln(&b, line)
		}
	}
	return b.String()
}
