package nftables_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestNewWriterRefuses checks every configuration NewWriter refuses, each
// error naming the field's value.
func TestNewWriterRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  nftables.WriterConfig
		nft  knftables.Interface
		want string
	}{
		{"unknown family", nftables.WriterConfig{Family: "IPv5"}, nil, "IPv5"},
		{"table name with a space", nftables.WriterConfig{Family: v1.IPv4Protocol, TableName: "kube proxy"}, nil, "kube proxy"},
		{"table name with a quote", nftables.WriterConfig{Family: v1.IPv4Protocol, TableName: `a"b`}, nil, `a\"b`},
		{"table name starting with a digit", nftables.WriterConfig{Family: v1.IPv4Protocol, TableName: "1table"}, nil, "1table"},
		{"masquerade bit 32", nftables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{MasqueradeBit: ptr.To(32)}}, nil, "32"},
		{"two cluster CIDRs of the family", nftables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16"), prefix("fd00::/64"), prefix("10.1.0.0/16")}}}, nil, "10.0.0.0/16 and 10.1.0.0/16"},
		{"Interface for another table", nftables.WriterConfig{Family: v1.IPv4Protocol}, knftables.NewFake(knftables.IPv4Family, "other"), "other"},
		{"Interface for another family", nftables.WriterConfig{Family: v1.IPv6Protocol}, knftables.NewFake(knftables.IPv4Family, "kube-proxy"), "ip6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nft := tc.nft
			if nft == nil {
				nft = knftables.NewFake("", "")
			}
			_, err := nftables.NewWriter(nft, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestWriterCoexists runs two writers with different tables on one Fake:
// each one's syncs, full and partial, and its cleanup leave the other's
// table as it was.
func TestWriterCoexists(t *testing.T) {
	fake := knftables.NewFake("", "")
	mk := func(table, clusterIP string) (*nftables.Writer, *cluster) {
		cfg := baseConfig()
		cfg.TableName = table
		w, err := nftables.NewWriter(fake, cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := newCluster(v1.IPv4Protocol, node)
		c.setService(makeService("ns", "web", clusterIP, withNodePort(30080)))
		c.setEndpoints("ns", "web", tcp8080, local("10.0.1.1"))
		return w, c
	}
	w1, c1 := mk("kube-proxy", "10.96.0.1")
	w2, c2 := mk("proxykit", "10.96.0.2")
	syncFake(t, w1, fake, c1.input())
	syncFake(t, w2, fake, c2.input())
	tableDump := func(table string) string {
		single := knftables.NewFake(knftables.IPv4Family, table)
		single.Tables = map[knftables.Family]map[string]*knftables.FakeTable{knftables.IPv4Family: {table: fake.Tables[knftables.IPv4Family][table]}}
		return single.Dump()
	}
	before := tableDump("kube-proxy")
	c2.setEndpoints("ns", "web", tcp8080, local("10.0.1.2"))
	syncFake(t, w2, fake, c2.input())
	w2.RequestFullSync()
	syncFake(t, w2, fake, c2.input())
	if diff := cmp.Diff(before, tableDump("kube-proxy")); diff != "" {
		t.Errorf("the proxykit writer changed the kube-proxy table (-before +after):\n%s", diff)
	}
	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, "proxykit")
	outs, err := tr.Trace(nftablestest.Packet{Src: addr("10.0.9.9"), Dst: addr("10.96.0.2"), Protocol: v1.ProtocolTCP, DstPort: 80})
	if err != nil || len(outs) != 1 || outs[0].DNAT.String() != "10.0.1.2:8080" {
		t.Errorf("proxykit table's service: %+v, %v; want DNAT to 10.0.1.2:8080", outs, err)
	}
	if err := nftables.Cleanup(context.Background(), "proxykit", func(knftables.Family, string) (knftables.Interface, error) { return fake, nil }); err != nil {
		t.Fatal(err)
	}
	if fake.Tables[knftables.IPv4Family]["proxykit"] != nil || tableDump("kube-proxy") != before {
		t.Errorf("cleanup of proxykit: tables now\n%s", fake.Dump())
	}
}

// TestWriterSharedElement: two Services list the same external IP and
// port. The first (by name) holds the element; when it goes, the other
// takes over in the same partial sync, and the table equals a fresh full
// sync's.
func TestWriterSharedElement(t *testing.T) {
	setup := func(c *cluster, withA bool) {
		if withA {
			c.setService(makeService("ns", "a", "10.96.0.1", withExternalIPs("192.0.2.1")))
			c.setEndpoints("ns", "a", tcp8080, remote("10.0.2.1"))
		}
		c.setService(makeService("ns", "b", "10.96.0.2", withExternalIPs("192.0.2.1")))
		c.setEndpoints("ns", "b", tcp8080, remote("10.0.2.2"))
	}
	c := newCluster(v1.IPv4Protocol, node)
	setup(c, true)
	fake, w := newFake(t, baseConfig())
	syncFake(t, w, fake, c.input())
	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, nftables.DefaultTableName)
	pkt := nftablestest.Packet{Src: addr("198.51.100.1"), Dst: addr("192.0.2.1"), Protocol: v1.ProtocolTCP, DstPort: 80}
	trace := func() string {
		outs, err := tr.Trace(pkt)
		if err != nil || len(outs) != 1 {
			t.Fatalf("trace: %+v, %v", outs, err)
		}
		return outs[0].DNAT.String()
	}
	if got := trace(); got != "10.0.2.1:8080" {
		t.Errorf("external IP goes to %s, want ns/a's endpoint", got)
	}
	c.deleteService("ns", "a")
	c.setEndpoints("ns", "a", tcp8080)
	syncFake(t, w, fake, c.input())
	if got := trace(); got != "10.0.2.2:8080" {
		t.Errorf("after ns/a went, external IP goes to %s, want ns/b's endpoint", got)
	}
	freshC := newCluster(v1.IPv4Protocol, node)
	setup(freshC, false)
	freshFake, fresh := newFake(t, baseConfig())
	syncFake(t, fresh, freshFake, freshC.input())
	if diff := cmp.Diff(normalDump(freshFake), normalDump(fake)); diff != "" {
		t.Errorf("(-fresh +partial):\n%s", diff)
	}
}

// TestWriterNodePortAddresses: with NodePortAddresses, node ports answer
// on local addresses inside the prefixes only, never on loopback.
func TestWriterNodePortAddresses(t *testing.T) {
	cfg := baseConfig()
	nodeIPs := []netip.Addr{addr("192.168.0.10"), addr("172.16.0.10")}
	cfg.Node.NodePortAddresses = []netip.Prefix{prefix("192.168.0.0/24"), prefix("127.0.0.0/8")}
	c := newCluster(v1.IPv4Protocol, node)
	c.NodeIPs = nodeIPs
	c.setService(makeService("ns", "web", "10.96.0.1", withNodePort(30080)))
	c.setEndpoints("ns", "web", tcp8080, remote("10.0.2.1"))
	fake, w := newFake(t, cfg)
	syncFake(t, w, fake, c.input())
	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, nftables.DefaultTableName, nodeIPs...)
	for _, tc := range []struct {
		dst  string
		dnat bool
	}{{"192.168.0.10", true}, {"172.16.0.10", false}, {"127.0.0.1", false}, {"192.168.0.99", false}} {
		p := nftablestest.Packet{Src: addr("198.51.100.1"), Dst: addr(tc.dst), Protocol: v1.ProtocolTCP, DstPort: 30080}
		if tc.dst == "127.0.0.1" {
			p.Src, p.Output = addr("127.0.0.1"), true
		}
		outs, err := tr.Trace(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(outs) == 1 && outs[0].DNAT.IsValid(); got != tc.dnat {
			t.Errorf("node port on %s: %+v, want DNAT %v", tc.dst, outs, tc.dnat)
		}
	}
}

// TestWriterFullSyncTriggers: node label changes, FullSyncPeriod and
// RequestFullSync make a sync full; nothing else does.
func TestWriterFullSyncTriggers(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	cfg := baseConfig()
	cfg.FullSyncPeriod = time.Hour
	cfg.Clock = clk
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "web", "10.96.0.1"))
	fake, w := newFake(t, cfg)
	steps := []struct {
		name string
		do   func()
		full bool
	}{
		{"first", func() {}, true},
		{"nothing changed", func() {}, false},
		{"node labels changed", func() { c.NodeLabels = map[string]string{v1.LabelTopologyZone: "z"} }, true},
		{"half the period", func() { clk.SetTime(clk.Now().Add(30 * time.Minute)) }, false},
		{"the period", func() { clk.SetTime(clk.Now().Add(30 * time.Minute)) }, true},
		{"requested", w.RequestFullSync, true},
		{"after the request", func() {}, false},
	}
	for _, s := range steps {
		s.do()
		if res := syncFake(t, w, fake, c.input()); res.Full != s.full {
			t.Errorf("%s: full=%v, want %v", s.name, res.Full, s.full)
		}
	}
}

// TestWriterRecreatesBaseChains: a base chain left with another priority
// (by another version) is recreated by the first sync, since "add" does
// not change a base chain's hook or priority.
func TestWriterRecreatesBaseChains(t *testing.T) {
	fake, w := newFake(t, baseConfig())
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "nat-prerouting", Type: ptr.To(knftables.NATType), Hook: ptr.To(knftables.PreroutingHook), Priority: ptr.To(knftables.BaseChainPriority("0"))})
	tx.Add(&knftables.Rule{Chain: "nat-prerouting", Rule: "accept"})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	c := newCluster(v1.IPv4Protocol, node)
	syncFake(t, w, fake, c.input())
	ch := fake.Table.Chains["nat-prerouting"]
	if got := *ch.Priority; got != knftables.DNATPriority {
		t.Errorf("nat-prerouting priority %s, want %s", got, knftables.DNATPriority)
	}
	if len(ch.Rules) != 1 || ch.Rules[0].Rule != "jump services" {
		t.Errorf("nat-prerouting rules %v, want only the jump to services", ch.Rules)
	}
}

// TestWriterSplitFirstLoad: with SplitFirstLoad, a full sync into a
// missing table leaves the elements ApplyElements sends out of the
// transaction, and the two together make the same table as one
// transaction; a full sync into an existing table, and a partial one, are
// not split.
func TestWriterSplitFirstLoad(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "web", "10.96.0.10", withNodePort(30080), withExternalIPs("192.0.2.10")))
	c.setEndpoints("ns", "web", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	c.setService(makeService("ns", "empty", "10.96.0.11"))
	in := c.input()

	plainFake, plain := newFake(t, baseConfig())
	syncFake(t, plain, plainFake, in)

	cfg := baseConfig()
	cfg.SplitFirstLoad = true
	fake, w := newFake(t, cfg)
	res := w.Sync(context.Background(), in)
	if len(res.Elements) == 0 {
		t.Fatal("first full sync into a missing table was not split")
	}
	text := res.Transaction.String()
	for _, el := range res.Elements {
		line := "add element ip kube-proxy " + el.Set + el.Map + " { " + strings.Join(el.Key, " . ") + " "
		if strings.Contains(text, line) {
			t.Errorf("element both split off and in the transaction: %s", line)
		}
	}
	if !strings.Contains(text, "add element ip kube-proxy no-endpoint-services") {
		t.Error("commented no-endpoint elements are not in the transaction")
	}
	tx := fake.NewTransaction()
	for _, el := range res.Elements {
		tx.Add(el)
	}
	err := fake.Run(context.Background(), res.Transaction)
	if err == nil {
		err = fake.Run(context.Background(), tx)
	}
	w.Applied(err)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(normalDump(plainFake), normalDump(fake)); diff != "" {
		t.Errorf("split load differs from one transaction (-one +split):\n%s", diff)
	}

	w.RequestFullSync()
	if res := syncFake(t, w, fake, c.input()); !res.Full || len(res.Elements) != 0 {
		t.Errorf("full sync into an existing table: full=%v, %d elements split off; want full and none", res.Full, len(res.Elements))
	}
	c.setEndpoints("ns", "web", tcp8080, remote("10.0.2.1"))
	if res := syncFake(t, w, fake, c.input()); res.Full || len(res.Elements) != 0 {
		t.Errorf("partial sync: full=%v, %d elements split off; want partial and none", res.Full, len(res.Elements))
	}
}

// TestWriterNodeIPs checks that the node's addresses come with each input:
// a change of those of the writer's family makes the sync full, with the
// table a fresh writer writes for the new ones, while a change of the
// other family's alone leaves the sync partial. A load balancer whose
// source ranges hold a node address admits its own VIP as a source.
func TestWriterNodeIPs(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "lb", "10.96.0.20", withLoadBalancer("203.0.113.5", "192.168.0.10/32")))
	c.setEndpoints("ns", "lb", tcp8080, local("10.0.1.1"))
	c.NodeIPs = []netip.Addr{addr("192.168.0.10")}
	fake, w := newFake(t, baseConfig())
	syncFake(t, w, fake, c.input())
	admitsVIP := func() bool { return strings.Contains(normalDump(fake), "203.0.113.5 . tcp . 80 . 203.0.113.5") }
	if !admitsVIP() {
		t.Fatalf("the VIP is not admitted while a node address is in the source range:\n%s", normalDump(fake))
	}
	for _, step := range []struct {
		name     string
		nodeIPs  []netip.Addr
		wantFull bool
	}{
		{"same addresses in another order, with one of the other family", []netip.Addr{addr("fd00:1::10"), addr("192.168.0.10")}, false},
		{"an address of the writer's family more", []netip.Addr{addr("192.168.0.10"), addr("192.168.0.11")}, true},
		{"the first one gone", []netip.Addr{addr("192.168.0.11")}, true},
	} {
		c.NodeIPs = step.nodeIPs
		res := syncFake(t, w, fake, c.input())
		if res.Full != step.wantFull {
			t.Errorf("%s: sync full=%v, want %v", step.name, res.Full, step.wantFull)
		}
		freshFake, fresh := newFake(t, baseConfig())
		syncFake(t, fresh, freshFake, c.input())
		if diff := cmp.Diff(normalDump(freshFake), normalDump(fake)); diff != "" {
			t.Errorf("%s: table differs from a fresh writer's (-fresh +got):\n%s", step.name, diff)
		}
	}
	if admitsVIP() {
		t.Errorf("the VIP is still admitted after the node address in the source range went:\n%s", normalDump(fake))
	}
}

// TestWriterReadsItsFamilyOfNodeConfig checks that one NodeConfig serves
// both families: the writer renders from the prefixes of its own family
// exactly what it renders when given those alone.
func TestWriterReadsItsFamilyOfNodeConfig(t *testing.T) {
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), func(t *testing.T) {
			v4 := proxy.NodeConfig{Name: node, ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}, NodePortAddresses: []netip.Prefix{prefix("192.168.0.0/24")}}
			v6 := proxy.NodeConfig{Name: node, ClusterCIDRs: []netip.Prefix{prefix("fd00:10::/64")}, NodePortAddresses: []netip.Prefix{prefix("fd00:1::/64")}}
			both := proxy.NodeConfig{Name: node,
				ClusterCIDRs:      append(slices.Clone(v4.ClusterCIDRs), v6.ClusterCIDRs...),
				NodePortAddresses: append(slices.Clone(v6.NodePortAddresses), v4.NodePortAddresses...)}
			alone, svcIP, podIP := v4, "10.96.0.10", "10.0.1.1"
			if family == v1.IPv6Protocol {
				alone, svcIP, podIP = v6, "fd00:96::10", "fd00:10::1"
			}
			c := newCluster(family, node)
			c.setService(makeService("ns", "web", svcIP, withNodePort(30080), withExternalLocal()))
			c.setEndpoints("ns", "web", tcp8080, local(podIP))
			in := c.input()
			fa, wa := newFake(t, nftables.WriterConfig{Family: family, Node: alone})
			fb, wb := newFake(t, nftables.WriterConfig{Family: family, Node: both})
			syncFake(t, wa, fa, in)
			syncFake(t, wb, fb, in)
			if diff := cmp.Diff(normalDump(fa), normalDump(fb)); diff != "" {
				t.Errorf("(-own family alone +both families):\n%s", diff)
			}
			if !strings.Contains(normalDump(fa), alone.NodePortAddresses[0].String()) {
				t.Errorf("the node-port prefix %s is not in the table:\n%s", alone.NodePortAddresses[0], normalDump(fa))
			}
		})
	}
}

// TestWriterNodePortPrimary checks that node ports on the node's own
// addresses (kube-proxy's "primary") follow the addresses each input
// gives, and that a node without one serves none rather than all.
func TestWriterNodePortPrimary(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "np", "10.96.0.30", withNodePort(30080)))
	c.setEndpoints("ns", "np", tcp8080, local("10.0.1.1"))
	cfg := baseConfig()
	cfg.Node.NodePortPrimary = true
	cfg.Node.NodePortAddresses = []netip.Prefix{prefix("192.168.0.10/32")}
	fake, w := newFake(t, cfg)
	for _, step := range []struct {
		nodeIPs []netip.Addr
		want    string
	}{
		{[]netip.Addr{addr("192.168.0.10")}, "192.168.0.10"},
		{[]netip.Addr{addr("192.168.0.11"), addr("fd00:1::11")}, "192.168.0.11"},
		{nil, ""},
	} {
		c.NodeIPs = step.nodeIPs
		syncFake(t, w, fake, c.input())
		var got []string
		for _, line := range strings.Split(normalDump(fake), "\n") {
			if strings.Contains(line, "@nodeport-ips") {
				continue
			}
			if strings.Contains(line, "nodeport-ips") && strings.Contains(line, "element") {
				got = append(got, line)
			}
		}
		joined := strings.Join(got, "\n")
		if step.want == "" && joined != "" || step.want != "" && (len(got) != 1 || !strings.Contains(joined, step.want)) {
			t.Errorf("node IPs %v: node-port addresses %q, want %q alone", step.nodeIPs, joined, step.want)
		}
		freshFake, fresh := newFake(t, cfg)
		syncFake(t, fresh, freshFake, c.input())
		if diff := cmp.Diff(normalDump(freshFake), normalDump(fake)); diff != "" {
			t.Errorf("node IPs %v: table differs from a fresh writer's (-fresh +got):\n%s", step.nodeIPs, diff)
		}
	}
}
