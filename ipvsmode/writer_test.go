package ipvsmode_test

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// The addresses of the translation tests: the node has two interfaces,
// pods on it are in 10.244.1.0/24 and pods elsewhere in 10.244.2.0/24.
var (
	modeCfg = ipvsmode.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: nodeName, ClusterCIDRs: []netip.Prefix{prefix("10.244.0.0/16")}},
		RandomFully: true,
	}
	// modeNodeIPs are the node's addresses in the translation tests'
	// inputs: two interfaces and loopback, which never serves node ports.
	modeNodeIPs = []netip.Addr{addr("192.168.0.10"), addr("10.0.0.10"), addr("127.0.0.1")}
	localPod    = endpoint{ip: "10.244.1.5", local: true}
	remotePod   = endpoint{ip: "10.244.2.7"}
	outsider    = addr("192.168.5.5")  // a client outside the cluster
	otherPod    = addr("10.244.2.9")   // a pod on another node
	nodeAddr    = addr("192.168.0.10") // the node's first address
)

// trace is a packet of a translation case and how it must end.
type trace struct {
	name string
	p    iptablestest.Packet
	want []string
}

func tcpTo(src netip.Addr, dst string) iptablestest.Packet {
	d := netip.MustParseAddrPort(dst)
	return iptablestest.Packet{Protocol: "tcp", Source: src, SourcePort: 40000, Destination: d.Addr(), DestinationPort: d.Port(), InInterface: "eth0"}
}

var modeCases = []struct {
	name   string
	cfg    func(*ipvsmode.WriterConfig)
	labels map[string]string
	ports  []svcPort
	// wantVS is realServerList of the translation's services.
	wantVS []string
	// wantNoLocal are NoLocalEndpointsInternal and NoLocalEndpointsExternal.
	wantNoLocal [2]int
	traces      []trace
}{{
	name: "clusterip",
	ports: []svcPort{
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{localPod, remotePod}},
		{name: "kube-system/dns", portName: "dns", proto: v1.ProtocolUDP, clusterIP: "10.96.0.53", port: 53, endpoints: []endpoint{{ip: "10.244.2.8", port: 53}}},
	},
	wantVS: []string{
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.53:53/UDP (bound) -> 10.244.2.8:53",
	},
	traces: []trace{
		{"from outside the cluster CIDR: masqueraded", tcpTo(outsider, "10.96.0.10:80"), []string{"ACCEPT local to 10.96.0.10:80 mark=0x4000 p=1"}},
		{"from a pod: not masqueraded", tcpTo(otherPod, "10.96.0.10:80"), []string{"ACCEPT local to 10.96.0.10:80 p=1"}},
		{"another port of the cluster IP: refused", tcpTo(otherPod, "10.96.0.10:22"), []string{"REJECT local to 10.96.0.10:22 with icmp-port-unreachable p=1"}},
		{"the node's own port 22: untouched", tcpTo(otherPod, "192.168.0.10:22"), []string{"ACCEPT local to 192.168.0.10:22 p=1"}},
		// What IPVS sends out after choosing the pod itself.
		{"a local endpoint reaching itself: masqueraded", iptablestest.Packet{Protocol: "tcp", Source: addr("10.244.1.5"), SourcePort: 40000, Destination: addr("10.244.1.5"), DestinationPort: 8080, FromNode: true}, []string{"ACCEPT to 10.244.1.5:8080 masquerade p=1"}},
	},
}, {
	name: "nodeport",
	ports: []svcPort{
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, endpoints: []endpoint{localPod, remotePod}},
		{name: "default/sig", proto: v1.ProtocolSCTP, clusterIP: "10.96.0.20", port: 9000, nodePort: 30900, endpoints: []endpoint{{ip: "10.244.2.7", port: 9000}}},
		{name: "default/syslog", proto: v1.ProtocolUDP, clusterIP: "10.96.0.30", port: 514, nodePort: 30514, endpoints: []endpoint{{ip: "10.244.2.7", port: 514}}},
	},
	// On each address of the node but the loopback one, not bound.
	wantVS: []string{
		"10.0.0.10:30080/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.0.0.10:30514/UDP -> 10.244.2.7:514",
		"10.0.0.10:30900/SCTP -> 10.244.2.7:9000",
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.20:9000/SCTP (bound) -> 10.244.2.7:9000",
		"10.96.0.30:514/UDP (bound) -> 10.244.2.7:514",
		"192.168.0.10:30080/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
		"192.168.0.10:30514/UDP -> 10.244.2.7:514",
		"192.168.0.10:30900/SCTP -> 10.244.2.7:9000",
	},
	traces: []trace{
		{"node port: masqueraded", tcpTo(outsider, "192.168.0.10:30080"), []string{"ACCEPT local to 192.168.0.10:30080 mark=0x4000 p=1"}},
		{"node port on the other address: masqueraded", tcpTo(outsider, "10.0.0.10:30080"), []string{"ACCEPT local to 10.0.0.10:30080 mark=0x4000 p=1"}},
		{"another port of the node: untouched", tcpTo(outsider, "192.168.0.10:30081"), []string{"ACCEPT local to 192.168.0.10:30081 p=1"}},
		{"SCTP node port: masqueraded", iptablestest.Packet{Protocol: "sctp", Source: outsider, SourcePort: 5000, Destination: nodeAddr, DestinationPort: 30900}, []string{"ACCEPT local to 192.168.0.10:30900 mark=0x4000 p=1"}},
		{"the node port number on a cluster IP: refused", tcpTo(otherPod, "10.96.0.10:30080"), []string{"REJECT local to 10.96.0.10:30080 with icmp-port-unreachable mark=0x4000 p=1"}},
	},
}, {
	name: "nodeport-addresses",
	cfg:  func(c *ipvsmode.WriterConfig) { c.Node.NodePortAddresses = []netip.Prefix{prefix("192.168.0.0/24")} },
	ports: []svcPort{
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, endpoints: []endpoint{remotePod}},
	},
	wantVS: []string{
		"10.96.0.10:80/TCP (bound) -> 10.244.2.7:8080",
		"192.168.0.10:30080/TCP -> 10.244.2.7:8080",
	},
	traces: []trace{
		{"node port inside the prefixes: masqueraded", tcpTo(outsider, "192.168.0.10:30080"), []string{"ACCEPT local to 192.168.0.10:30080 mark=0x4000 p=1"}},
		{"node port outside them: not a node port", tcpTo(outsider, "10.0.0.10:30080"), []string{"ACCEPT local to 10.0.0.10:30080 p=1"}},
	},
}, {
	name: "externalip",
	ports: []svcPort{
		// One external IP is the node's own: it is not bound again.
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, externalIPs: []string{"203.0.113.5", "192.168.0.10", "2001:db8::5"}, endpoints: []endpoint{localPod, remotePod}},
		{name: "default/local", clusterIP: "10.96.0.11", port: 80, externalIPs: []string{"203.0.113.6"}, etpLocal: true, endpoints: []endpoint{localPod, remotePod}},
	},
	wantVS: []string{
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.11:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"192.168.0.10:80/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
		"203.0.113.5:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"203.0.113.6:80/TCP (bound) -> 10.244.1.5:8080",
	},
	traces: []trace{
		{"external IP: masqueraded", tcpTo(outsider, "203.0.113.5:80"), []string{"ACCEPT local to 203.0.113.5:80 mark=0x4000 p=1"}},
		{"Local external IP: source kept", tcpTo(outsider, "203.0.113.6:80"), []string{"ACCEPT local to 203.0.113.6:80 p=1"}},
		{"another port of a Local external IP: refused", tcpTo(outsider, "203.0.113.6:81"), []string{"REJECT local to 203.0.113.6:81 with icmp-port-unreachable p=1"}},
	},
}, {
	name: "loadbalancer",
	ports: []svcPort{
		// 192.168.0.0/24 holds the node's address: the node may reach
		// the VIP too.
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"203.0.113.0/24", "192.168.0.0/24"}, endpoints: []endpoint{localPod, remotePod}},
		// A range of length 0 lets everyone in: no firewall.
		{name: "default/open", clusterIP: "10.96.0.11", port: 443, lbVIPs: []string{"198.51.100.11"}, sourceRanges: []string{"0.0.0.0/0"}, endpoints: []endpoint{remotePod}},
	},
	wantVS: []string{
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.11:443/TCP (bound) -> 10.244.2.7:8080",
		"198.51.100.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"198.51.100.11:443/TCP (bound) -> 10.244.2.7:8080",
	},
	traces: []trace{
		{"from a source range: masqueraded", tcpTo(addr("203.0.113.7"), "198.51.100.10:80"), []string{"ACCEPT local to 198.51.100.10:80 mark=0x4000 p=1"}},
		{"from outside the source ranges: dropped", tcpTo(addr("198.18.0.1"), "198.51.100.10:80"), []string{"DROP local to 198.51.100.10:80 mark=0x4000 p=1"}},
		{"from the node, whose address is in a range", iptablestest.Packet{Protocol: "tcp", Source: addr("198.51.100.10"), SourcePort: 40000, Destination: addr("198.51.100.10"), DestinationPort: 80, FromNode: true}, []string{"ACCEPT local to 198.51.100.10:80 masquerade p=1"}},
		{"no source ranges: open", tcpTo(addr("198.18.0.1"), "198.51.100.11:443"), []string{"ACCEPT local to 198.51.100.11:443 mark=0x4000 p=1"}},
	},
}, {
	name: "traffic-policy-local",
	ports: []svcPort{
		{name: "default/lb-local", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, lbVIPs: []string{"198.51.100.10"}, etpLocal: true, hcNodePort: 32000, endpoints: []endpoint{localPod, remotePod}},
		// No endpoint here: external addresses fall back to the
		// cluster's endpoints (kubernetes#97081).
		{name: "default/lb-elsewhere", clusterIP: "10.96.0.11", port: 80, lbVIPs: []string{"198.51.100.11"}, etpLocal: true, hcNodePort: 32001, endpoints: []endpoint{remotePod}},
		{name: "default/itp-local", clusterIP: "10.96.0.12", port: 80, itpLocal: true, endpoints: []endpoint{localPod, remotePod}},
		// No endpoint here: no real server, so the cluster IP refuses.
		{name: "default/itp-elsewhere", clusterIP: "10.96.0.13", port: 80, itpLocal: true, endpoints: []endpoint{remotePod}},
	},
	wantVS: []string{
		"10.0.0.10:30080/TCP -> 10.244.1.5:8080",
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.11:80/TCP (bound) -> 10.244.2.7:8080",
		"10.96.0.12:80/TCP (bound) -> 10.244.1.5:8080",
		"10.96.0.13:80/TCP (bound) ->",
		"192.168.0.10:30080/TCP -> 10.244.1.5:8080",
		"198.51.100.10:80/TCP (bound) -> 10.244.1.5:8080",
		"198.51.100.11:80/TCP (bound) -> 10.244.2.7:8080",
	},
	wantNoLocal: [2]int{1, 1},
	traces: []trace{
		{"Local VIP: source kept", tcpTo(outsider, "198.51.100.10:80"), []string{"ACCEPT local to 198.51.100.10:80 p=1"}},
		{"Local node port: source kept", tcpTo(outsider, "192.168.0.10:30080"), []string{"ACCEPT local to 192.168.0.10:30080 p=1"}},
		{"its cluster IP: masqueraded from outside", tcpTo(outsider, "10.96.0.10:80"), []string{"ACCEPT local to 10.96.0.10:80 mark=0x4000 p=1"}},
		{"health-check node port: accepted", tcpTo(outsider, "192.168.0.10:32000"), []string{"ACCEPT local to 192.168.0.10:32000 p=1"}},
	},
}, {
	name: "affinity",
	ports: []svcPort{
		{name: "default/sticky", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, affinity: 600, endpoints: []endpoint{localPod, remotePod}},
	},
	wantVS: []string{
		"10.0.0.10:30080/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"192.168.0.10:30080/TCP -> 10.244.1.5:8080 10.244.2.7:8080",
	},
}, {
	name: "no-endpoints",
	ports: []svcPort{
		{name: "default/empty", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, externalIPs: []string{"203.0.113.5"}},
		// Endpoints that are neither ready nor serving are no endpoints.
		{name: "default/unready", clusterIP: "10.96.0.11", port: 80, endpoints: []endpoint{{ip: "10.244.2.7", notReady: true}}},
	},
	// Virtual servers with no real server: IPVS answers with ICMP port
	// unreachable.
	wantVS: []string{
		"10.0.0.10:30080/TCP ->",
		"10.96.0.10:80/TCP (bound) ->",
		"10.96.0.11:80/TCP (bound) ->",
		"192.168.0.10:30080/TCP ->",
		"203.0.113.5:80/TCP (bound) ->",
	},
	traces: []trace{
		{"the rules let it reach IPVS", tcpTo(outsider, "10.96.0.10:80"), []string{"ACCEPT local to 10.96.0.10:80 mark=0x4000 p=1"}},
	},
}, {
	name: "terminating",
	ports: []svcPort{
		// No ready endpoint: the serving, terminating ones take the
		// traffic, so that connections drain during a rollout.
		{name: "default/rollout", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{
			{ip: "10.244.1.5", local: true, terminating: true},
			{ip: "10.244.2.7", terminating: true},
			{ip: "10.244.2.8", terminating: true, notServing: true},
		}},
		// A ready endpoint: the terminating ones get nothing.
		{name: "default/mixed", clusterIP: "10.96.0.11", port: 80, endpoints: []endpoint{
			{ip: "10.244.1.5", local: true, terminating: true},
			{ip: "10.244.2.7"},
		}},
	},
	wantVS: []string{
		"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080 10.244.2.7:8080",
		"10.96.0.11:80/TCP (bound) -> 10.244.2.7:8080",
	},
}, {
	name:   "topology",
	labels: map[string]string{v1.LabelTopologyZone: "zone-a"},
	ports: []svcPort{
		{name: "default/zonal", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{
			{ip: "10.244.1.5", local: true, zoneHints: []string{"zone-a"}},
			{ip: "10.244.2.7", zoneHints: []string{"zone-b"}},
		}},
	},
	wantVS: []string{"10.96.0.10:80/TCP (bound) -> 10.244.1.5:8080"},
}, {
	name: "masquerade-all",
	cfg:  func(c *ipvsmode.WriterConfig) { c.Node.MasqueradeAll, c.RandomFully = true, false },
	ports: []svcPort{
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{remotePod}},
	},
	wantVS: []string{"10.96.0.10:80/TCP (bound) -> 10.244.2.7:8080"},
	traces: []trace{
		{"from a pod: masqueraded", tcpTo(otherPod, "10.96.0.10:80"), []string{"ACCEPT local to 10.96.0.10:80 mark=0x4000 p=1"}},
	},
}, {
	// Without the pod network, only what is sent from a service address
	// is masqueraded: the rule matches the set as src,dst, beside the
	// dst,dst match that accepts service traffic.
	name: "no-cluster-cidr",
	cfg: func(c *ipvsmode.WriterConfig) {
		c.Node.ClusterCIDRs = []netip.Prefix{netip.Prefix{}}
		c.Node.MasqueradeBit = ptr.To(0)
		c.Scheduler, c.SchedulerFlags = "mh", ipvs.FlagSched2
	},
	ports: []svcPort{
		{name: "default/web", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{remotePod}},
	},
	wantVS: []string{"10.96.0.10:80/TCP (bound) -> 10.244.2.7:8080"},
	traces: []trace{
		{"from outside: not masqueraded", tcpTo(outsider, "10.96.0.10:80"), []string{"ACCEPT local to 10.96.0.10:80 p=1"}},
		// src,dst reads the source address and the destination port.
		{"from the node, from the cluster IP: masqueraded", iptablestest.Packet{Protocol: "tcp", Source: addr("10.96.0.10"), SourcePort: 40000, Destination: addr("10.96.0.10"), DestinationPort: 80, FromNode: true},
			[]string{"ACCEPT local to 10.96.0.10:80 masquerade p=1"}},
		{"from the node, from its own address: not masqueraded", iptablestest.Packet{Protocol: "tcp", Source: nodeAddr, SourcePort: 40000, Destination: addr("10.96.0.10"), DestinationPort: 80, FromNode: true},
			[]string{"ACCEPT local to 10.96.0.10:80 p=1"}},
	},
}}

func TestTranslate(t *testing.T) {
	for _, tc := range modeCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := modeCfg
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			tr, err := ipvsmode.NewWriter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			svcs, eps := portMaps(t, cfg.Family, tc.ports...)
			res := tr.Sync(context.Background(), &proxy.FamilyInput{Services: svcs, Endpoints: eps, NodeLabels: tc.labels, NodeIPs: modeNodeIPs})
			if diff := cmp.Diff(tc.wantVS, realServerList(res.Services)); diff != "" {
				t.Errorf("virtual servers (-want +got):\n%s", diff)
			}
			if got := [2]int{res.NoLocalEndpointsInternal, res.NoLocalEndpointsExternal}; got != tc.wantNoLocal {
				t.Errorf("NoLocalEndpoints internal, external = %v, want %v", got, tc.wantNoLocal)
			}
			if res.ServicePorts != len(tc.ports) || res.SkippedServicePorts != 0 {
				t.Errorf("%d service ports translated, %d skipped; want %d, 0", res.ServicePorts, res.SkippedServicePorts, len(tc.ports))
			}
			var out bytes.Buffer
			if _, err := res.WriteTo(&out); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, filepath.Join("testdata", "mode", tc.name+".golden"), out.Bytes())

			n := newNode(modeNodeIPs...)
			n.apply(t, res)
			checkApplied(t, n, res)
			for _, tr := range tc.traces {
				got := verdicts(n.trace(t, tr.p))
				if diff := cmp.Diff(tr.want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", tr.name, diff)
				}
			}
			// Every sync is a full reconcile: a second one writes nothing.
			again := tr.Sync(context.Background(), &proxy.FamilyInput{Services: svcs, Endpoints: eps, NodeLabels: tc.labels, NodeIPs: modeNodeIPs})
			if r := n.apply(t, again); r.IPVS.Writes != 0 || r.IPSets.Writes != 0 {
				t.Errorf("resync wrote %d IPVS and %d ipset changes, want none", r.IPVS.Writes, r.IPSets.Writes)
			}
		})
	}
}

// checkApplied checks that the fakes hold what trs say: their virtual
// servers, bound addresses and set members.
func checkApplied(t *testing.T, n *node, trs ...ipvsmode.SyncResult) {
	t.Helper()
	ctx := context.Background()
	var got []ipvs.Service
	bound := map[netip.Addr]bool{}
	list, err := n.ipvs.ListVirtualServers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := n.binder.Addresses(ctx, ipvs.DummyDevice)
	for _, a := range addrs {
		bound[a] = true
	}
	for _, vs := range list {
		rss, err := n.ipvs.ListRealServers(ctx, vs)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ipvs.Service{VirtualServer: vs, RealServers: rss, Bind: bound[vs.Address]})
	}
	var want []ipvs.Service
	for _, tr := range trs {
		want = append(want, tr.Services...)
	}
	if diff := cmp.Diff(realServerList(want), realServerList(got)); diff != "" {
		t.Errorf("virtual servers in the fake (-translation +fake):\n%s", diff)
	}
	for _, d := range setsOf(trs) {
		members, err := n.sets.ListEntries(ctx, d.Set.Name)
		if err != nil {
			t.Errorf("set %s: %v", d.Set.Name, err)
			continue
		}
		want := slices.Clone(d.Entries)
		slices.SortFunc(want, ipset.Entry.Compare)
		want = slices.Compact(want)
		if diff := cmp.Diff(entryStrings(want), entryStrings(members)); diff != "" {
			t.Errorf("members of %s (-translation +fake):\n%s", d.Set.Name, diff)
		}
	}
}

func entryStrings(entries []ipset.Entry) []string {
	s := []string{}
	for _, e := range entries {
		s = append(s, e.String())
	}
	return s
}

func setsOf(trs []ipvsmode.SyncResult) []ipset.Desired {
	var sets []ipset.Desired
	for _, tr := range trs {
		sets = append(sets, tr.Sets...)
	}
	return sets
}

// TestApplierErrors: a failed step is reported, naming it, and does not
// stop the others.
func TestApplierErrors(t *testing.T) {
	ctx := context.Background()
	n := newNode(modeNodeIPs...)
	web := svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{remotePod}}
	t4 := translate(t, modeCfg, web)
	t6 := translate(t, ipvsmode.WriterConfig{Family: v1.IPv6Protocol}, svcPort{name: "default/web", clusterIP: "fd00:96::10", port: 80})

	// No ip6tables: the IPv6 rules cannot be applied; the rest is.
	a := ipvsmode.NewApplier(ipvs.NewReconciler(n.ipvs, n.binder), ipset.NewReconciler(n.sets, ipvsmode.SetPrefix), n.ipt[v1.IPv4Protocol])
	res, err := a.Apply(ctx, t4, t6)
	if err == nil || !strings.Contains(err.Error(), "IPVS mode: no iptables for IPv6") {
		t.Errorf("Apply without ip6tables: %v", err)
	}
	checkApplied(t, n, t4, t6)
	if rules := n.ipt[v1.IPv4Protocol].Rules(iptables.TableFilter, "KUBE-IPVS-FILTER"); len(rules) == 0 {
		t.Error("the IPv4 rules were not applied")
	}
	if len(res.RestoreFailed) != 0 {
		t.Errorf("RestoreFailed = %v: no restore was run", res.RestoreFailed)
	}

	// A payload the kernel refuses: the error names the family's rules,
	// and the virtual servers are still reconciled.
	bad := translate(t, modeCfg, web, svcPort{name: "default/api", clusterIP: "10.96.0.1", port: 443, endpoints: []endpoint{remotePod}})
	bad.Payload = []byte("*nat\n-A NO-SUCH-CHAIN -j ACCEPT\nCOMMIT\n")
	res, err = n.applier.Apply(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "IPVS mode: IPv4 rules") {
		t.Errorf("Apply of a bad payload: %v", err)
	}
	if diff := cmp.Diff([]v1.IPFamily{v1.IPv4Protocol}, res.RestoreFailed); diff != "" {
		t.Errorf("RestoreFailed (-want +got):\n%s", diff)
	}
	if list, _ := n.ipvs.ListVirtualServers(ctx); len(list) != 2 {
		t.Errorf("%d virtual servers after the failed restore, want 2", len(list))
	}
}
