package ipvsmode_test

import (
	"bytes"
	"context"
	"maps"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// TestTranslateDualStack: one translator per family, both applied with
// one Applier, so that the reconcilers, which own both families' virtual
// servers and sets, see them together.
func TestTranslateDualStack(t *testing.T) {
	ctx := context.Background()
	// Both translators take the node's addresses and node-port prefixes
	// of both families, and use their own.
	nodeIPs := append(slices.Clone(modeNodeIPs), addr("fd00:1::10"), addr("fd00:2::10"), addr("::1"))
	nodePorts := []netip.Prefix{prefix("fd00:1::/64")}
	cfg4 := modeCfg
	cfg4.Node.NodePortAddresses = nodePorts
	cfg6 := ipvsmode.WriterConfig{
		Family: v1.IPv6Protocol,
		Node:   proxy.NodeConfig{Name: nodeName, NodePortAddresses: nodePorts, ClusterCIDRs: []netip.Prefix{prefix("fd00:244::/56")}},
	}
	web4 := svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"203.0.113.0/24"}, endpoints: []endpoint{localPod, remotePod}}
	web6 := svcPort{
		name: "default/web", clusterIP: "fd00:96::10", port: 80, nodePort: 30080, lbVIPs: []string{"2001:db8::10"},
		sourceRanges: []string{"2001:db8:1::/48"}, hcNodePort: 32000, etpLocal: true, affinity: 300,
		endpoints: []endpoint{{ip: "fd00:244:0:1::5", local: true}, {ip: "fd00:244:0:2::7"}},
	}
	t4, t6 := translateWith(t, cfg4, nodeIPs, web4), translateWith(t, cfg6, nodeIPs, web6)

	var out bytes.Buffer
	if _, err := t6.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "mode", "ipv6.golden"), out.Bytes())

	n := newNode(nodeIPs...)
	n.apply(t, t4, t6)
	checkApplied(t, n, t4, t6)
	if diff := cmp.Diff([]string{
		"10.0.0.10:30080/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"192.168.0.10:30080/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
		"198.51.100.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"[2001:db8::10]:80/TCP (bound) -> [fd00:244:0:1::5]:8080",
		"[fd00:1::10]:30080/TCP -> [fd00:244:0:1::5]:8080",
		"[fd00:96::10]:80/TCP (bound) -> [fd00:244:0:1::5]:8080 [fd00:244:0:2::7]:8080",
	}, realServerList(append(t4.Services, t6.Services...))); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	for _, tr := range []trace{
		{"IPv6 cluster IP from outside: masqueraded", tcpTo(addr("2001:db8:9::1"), "[fd00:96::10]:80"), []string{"ACCEPT local to [fd00:96::10]:80 mark=0x4000 p=1"}},
		{"IPv6 cluster IP, another port: refused", tcpTo(addr("2001:db8:9::1"), "[fd00:96::10]:22"), []string{"REJECT local to [fd00:96::10]:22 with icmp6-port-unreachable p=1"}},
		{"IPv6 Local VIP from a source range: source kept", tcpTo(addr("2001:db8:1::7"), "[2001:db8::10]:80"), []string{"ACCEPT local to [2001:db8::10]:80 p=1"}},
		{"IPv6 VIP from elsewhere: dropped", tcpTo(addr("2001:db8:9::1"), "[2001:db8::10]:80"), []string{"DROP local to [2001:db8::10]:80 p=1"}},
		{"IPv4 VIP from elsewhere: dropped", tcpTo(addr("192.0.2.1"), "198.51.100.10:80"), []string{"DROP local to 198.51.100.10:80 mark=0x4000 p=1"}},
	} {
		if diff := cmp.Diff(tr.want, verdicts(n.trace(t, tr.p))); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tr.name, diff)
		}
	}

	// The reconcilers own both families: a family left out of Apply loses
	// its virtual servers, and those of its sets no rule uses. Its
	// ip6tables rules stay, and the sets they match on cannot be
	// destroyed, as in the kernel: a proxier must not leave a family out.
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`--match-set (\S+) `).FindAllStringSubmatch(n.ipt[v1.IPv6Protocol].Dump(), -1) {
		used[m[1]] = true
	}
	if len(used) == 0 {
		t.Fatal("no ip6tables rule matches on a set")
	}
	res := n.apply(t, t4)
	if want := len(t6.Sets) - len(used); res.IPVS.VirtualServersDeleted != 3 || res.IPSets.Destroyed != want {
		t.Errorf("applying IPv4 alone deleted %d virtual servers and %d sets, want 3 and %d", res.IPVS.VirtualServersDeleted, res.IPSets.Destroyed, want)
	}
	if diff := cmp.Diff(slices.Sorted(maps.Keys(used)), slices.Sorted(slices.Values(res.IPSets.InUse))); diff != "" {
		t.Errorf("sets left because rules use them (-want +got):\n%s", diff)
	}
	for name := range used {
		if _, err := n.sets.ListEntries(ctx, name); err != nil {
			t.Errorf("set %s, which ip6tables rules use, was destroyed: %v", name, err)
		}
	}
	if rules := n.ipt[v1.IPv6Protocol].Rules("filter", "KUBE-IPVS-FILTER"); len(rules) == 0 {
		t.Error("ip6tables rules are gone")
	}
	if list, _ := n.ipvs.ListVirtualServers(ctx); len(list) != len(t4.Services) {
		t.Errorf("%d virtual servers left, want IPv4's %d", len(list), len(t4.Services))
	}
}

// oddPort is a ServicePort with values the API would refuse, for the
// bad-input test; a nil or zero override keeps the base value.
type oddPort struct {
	*changetracker.BaseServicePort
	clusterIP   *netip.Addr
	proto       v1.Protocol
	port        *int
	nodePort    *int
	sticky      *int
	externalIPs []netip.Addr
	vips        []netip.Addr
	ranges      []netip.Prefix
}

func (p oddPort) ClusterIP() netip.Addr {
	if p.clusterIP != nil {
		return *p.clusterIP
	}
	return p.BaseServicePort.ClusterIP()
}

func (p oddPort) Protocol() v1.Protocol { return cmpOr(p.proto, p.BaseServicePort.Protocol()) }
func (p oddPort) Port() int             { return *cmpOr(p.port, ptr.To(p.BaseServicePort.Port())) }
func (p oddPort) NodePort() int         { return *cmpOr(p.nodePort, ptr.To(p.BaseServicePort.NodePort())) }

func (p oddPort) SessionAffinityType() v1.ServiceAffinity {
	if p.sticky != nil {
		return v1.ServiceAffinityClientIP
	}
	return p.BaseServicePort.SessionAffinityType()
}

func (p oddPort) StickyMaxAgeSeconds() int {
	return *cmpOr(p.sticky, ptr.To(p.BaseServicePort.StickyMaxAgeSeconds()))
}

func (p oddPort) ExternalIPs() []netip.Addr {
	return append(p.BaseServicePort.ExternalIPs(), p.externalIPs...)
}

func (p oddPort) LoadBalancerVIPs() []netip.Addr {
	return append(p.BaseServicePort.LoadBalancerVIPs(), p.vips...)
}

func (p oddPort) LoadBalancerSourceRanges() []netip.Prefix {
	return append(p.BaseServicePort.LoadBalancerSourceRanges(), p.ranges...)
}

// oddEndpoint is an Endpoint with an address or port the API would refuse.
type oddEndpoint struct {
	changetracker.Endpoint
	ip   netip.Addr
	port int
}

func (e oddEndpoint) IP() netip.Addr { return e.ip }
func (e oddEndpoint) Port() int      { return e.port }

// TestTranslateBadInput: bad values are logged and skipped for their
// service port alone, never panicking, and what is translated is valid:
// the reconcilers and iptables apply it without error.
func TestTranslateBadInput(t *testing.T) {
	good := svcPort{name: "default/good", clusterIP: "10.96.0.1", port: 80, lbVIPs: []string{"198.51.100.1"}, sourceRanges: []string{"203.0.113.0/24"}, endpoints: []endpoint{remotePod}}
	wantGood := []string{
		"10.96.0.1:80/TCP (bound) -> 10.244.2.7:8080",
		"198.51.100.1:80/TCP (bound) -> 10.244.2.7:8080",
	}
	v6 := addr("fd00::1")
	for _, tc := range []struct {
		name string
		// odd changes the bad port, default/odd with cluster IP
		// 10.96.0.2:80, and moreEndpoints its one endpoint.
		odd           func(p *oddPort)
		moreEndpoints func(eps []changetracker.Endpoint) []changetracker.Endpoint
		nilPort       bool
		// wantBad is what remains of default/odd, if anything.
		wantBad []string
		skipped int
		// errors is how many errors are logged.
		errors int
	}{
		{name: "cluster IP of the other family", odd: func(p *oddPort) { p.clusterIP = &v6 }, skipped: 1, errors: 1},
		{name: "no cluster IP", odd: func(p *oddPort) { p.clusterIP = &netip.Addr{} }, skipped: 1, errors: 1},
		{name: "unknown protocol", odd: func(p *oddPort) { p.proto = "ICMP" }, skipped: 1, errors: 1},
		{name: "port 0", odd: func(p *oddPort) { p.port = ptr.To(0) }, skipped: 1, errors: 1},
		{name: "port beyond 65535", odd: func(p *oddPort) { p.port = ptr.To(70000) }, skipped: 1, errors: 1},
		{name: "node port beyond 65535", odd: func(p *oddPort) { p.nodePort = ptr.To(70000) }, skipped: 1, errors: 1},
		{name: "affinity without a timeout", odd: func(p *oddPort) { p.sticky = ptr.To(0) }, skipped: 1, errors: 1},
		{name: "nil service port", nilPort: true, skipped: 1},
		{name: "addresses of the other family or invalid are left out", odd: func(p *oddPort) {
			p.externalIPs = []netip.Addr{v6, {}, netip.MustParseAddr("::ffff:203.0.113.9")}
			p.vips = []netip.Addr{v6, {}}
			p.ranges = []netip.Prefix{prefix("fd00::/64"), {}, prefix("::ffff:203.0.113.0/120")}
		}, wantBad: []string{
			"10.96.0.2:80/TCP (bound) -> 10.244.2.8:8080",
			// The IPv4-mapped external IP is taken as the IPv4 address.
			"203.0.113.9:80/TCP (bound) -> 10.244.2.8:8080",
		}},
		{name: "endpoints of the other family or port are left out", moreEndpoints: func(eps []changetracker.Endpoint) []changetracker.Endpoint {
			return append(eps,
				oddEndpoint{Endpoint: eps[0], ip: v6, port: 8080},
				oddEndpoint{Endpoint: eps[0], ip: addr("10.244.2.9"), port: 0},
				oddEndpoint{Endpoint: eps[0], ip: addr("10.244.2.9"), port: 65536},
				oddEndpoint{Endpoint: eps[0], ip: netip.Addr{}, port: 8080},
				// A repeat is listed once.
				eps[0])
		}, wantBad: []string{"10.96.0.2:80/TCP (bound) -> 10.244.2.8:8080"}, errors: 4},
		{name: "a virtual server another port has", odd: func(p *oddPort) { p.vips = []netip.Addr{addr("198.51.100.1")} }, wantBad: []string{"10.96.0.2:80/TCP (bound) -> 10.244.2.8:8080"}, errors: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			bad := svcPort{name: "default/odd", clusterIP: "10.96.0.2", port: 80, endpoints: []endpoint{{ip: "10.244.2.8"}}}
			svcs, eps := portMaps(t, v1.IPv4Protocol, good, bad)
			name := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "odd"}, Protocol: v1.ProtocolTCP}
			if tc.nilPort {
				svcs[name] = nil
			} else {
				p := oddPort{BaseServicePort: svcs[name].(*changetracker.BaseServicePort)}
				if tc.odd != nil {
					tc.odd(&p)
				}
				if tc.moreEndpoints != nil {
					eps[name] = tc.moreEndpoints(eps[name])
				}
				svcs[name] = p
			}
			tr, err := ipvsmode.NewWriter(modeCfg)
			if err != nil {
				t.Fatal(err)
			}
			res := tr.Sync(ctx, &proxy.FamilyInput{Services: svcs, Endpoints: eps, NodeIPs: modeNodeIPs})
			want := append(append([]string(nil), wantGood...), tc.wantBad...)
			if diff := cmp.Diff(want, realServerList(res.Services), cmpSorted); diff != "" {
				t.Errorf("virtual servers (-want +got):\n%s", diff)
			}
			if res.SkippedServicePorts != tc.skipped || res.ServicePorts != 2-tc.skipped {
				t.Errorf("%d translated, %d skipped; want %d, %d", res.ServicePorts, res.SkippedServicePorts, 2-tc.skipped, tc.skipped)
			}
			var logged []string
			for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
				if e.Type == ktesting.LogError {
					logged = append(logged, e.Message)
				}
			}
			if len(logged) != tc.errors {
				t.Errorf("%d errors logged, want %d: %q", len(logged), tc.errors, logged)
			}
			// What is left is valid: every step applies it without error.
			n := newNode(modeNodeIPs...)
			n.apply(t, res)
			checkApplied(t, n, res)
		})
	}
}

var cmpSorted = cmpopts.SortSlices(func(a, b string) bool { return a < b })

func TestNewTranslatorErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ipvsmode.WriterConfig
		want string
	}{
		{"no family", ipvsmode.WriterConfig{}, `unknown IP family ""`},
		{"masquerade bit", ipvsmode.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{MasqueradeBit: ptr.To(32)}}, "masquerade bit 32"},
		{"scheduler", ipvsmode.WriterConfig{Family: v1.IPv4Protocol, Scheduler: "fastest"}, `scheduler "fastest"`},
		{"persistence flag", ipvsmode.WriterConfig{Family: v1.IPv4Protocol, SchedulerFlags: ipvs.FlagPersistent}, "session affinity"},
		{"two cluster CIDRs of the family", ipvsmode.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16"), prefix("fd00::/64"), prefix("10.1.0.0/16")}}}, "10.0.0.0/16 and 10.1.0.0/16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ipvsmode.NewWriter(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewTranslator: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestNodeIPsFollowInput: node ports follow the node's addresses from one
// sync to the next, and an invalid one among them is left out.
func TestNodeIPsFollowInput(t *testing.T) {
	tr, err := ipvsmode.NewWriter(modeCfg)
	if err != nil {
		t.Fatal(err)
	}
	svcs, eps := portMaps(t, v1.IPv4Protocol, svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, externalIPs: []string{"192.168.7.7"}, endpoints: []endpoint{remotePod}})
	in := &proxy.FamilyInput{Services: svcs, Endpoints: eps, NodeIPs: modeNodeIPs}
	want := func(lines ...string) []string {
		return append([]string{"10.96.0.10:80/TCP (bound) -> 10.244.2.7:8080"}, lines...)
	}
	if diff := cmp.Diff(want(
		"10.0.0.10:30080/TCP -> 10.244.2.7:8080",
		"192.168.0.10:30080/TCP -> 10.244.2.7:8080",
		"192.168.7.7:80/TCP (bound) -> 10.244.2.7:8080",
	), realServerList(tr.Sync(context.Background(), in).Services), cmpSorted); diff != "" {
		t.Errorf("before (-want +got):\n%s", diff)
	}
	// The external IP is now the node's own: no longer bound.
	in.NodeIPs = []netip.Addr{addr("192.168.7.7"), addr("fd00::1"), addr("192.168.7.7")}
	after := want(
		"192.168.7.7:30080/TCP -> 10.244.2.7:8080",
		"192.168.7.7:80/TCP -> 10.244.2.7:8080",
	)
	if diff := cmp.Diff(after, realServerList(tr.Sync(context.Background(), in).Services), cmpSorted); diff != "" {
		t.Errorf("after the node's addresses changed (-want +got):\n%s", diff)
	}
	// An invalid address among them is left out.
	in.NodeIPs = append(slices.Clone(in.NodeIPs), netip.Addr{})
	if diff := cmp.Diff(after, realServerList(tr.Sync(context.Background(), in).Services), cmpSorted); diff != "" {
		t.Errorf("with an invalid node address (-want +got):\n%s", diff)
	}
}

// TestNodePortPrimaryFollowsInput: with NodePortPrimary, node ports are
// served on the node's own addresses as each input gives them, and a node
// without one serves none, whatever NodePortAddresses says.
func TestNodePortPrimaryFollowsInput(t *testing.T) {
	cfg := modeCfg
	cfg.Node.NodePortPrimary = true
	cfg.Node.NodePortAddresses = []netip.Prefix{prefix("10.0.0.10/32")}
	tr, err := ipvsmode.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svcs, eps := portMaps(t, v1.IPv4Protocol, svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, endpoints: []endpoint{remotePod}})
	in := &proxy.FamilyInput{Services: svcs, Endpoints: eps}
	for _, step := range []struct {
		nodeIPs []netip.Addr
		want    []string
	}{
		{[]netip.Addr{addr("192.168.0.10")}, []string{"192.168.0.10:30080/TCP -> 10.244.2.7:8080"}},
		{[]netip.Addr{addr("192.168.0.11"), addr("fd00::1")}, []string{"192.168.0.11:30080/TCP -> 10.244.2.7:8080"}},
		{nil, nil},
	} {
		in.NodeIPs = step.nodeIPs
		want := append([]string{"10.96.0.10:80/TCP (bound) -> 10.244.2.7:8080"}, step.want...)
		if diff := cmp.Diff(want, realServerList(tr.Sync(context.Background(), in).Services), cmpSorted); diff != "" {
			t.Errorf("node IPs %v (-want +got):\n%s", step.nodeIPs, diff)
		}
	}
}
