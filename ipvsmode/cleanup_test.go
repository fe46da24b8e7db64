package ipvsmode_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// TestCleanup: Cleanup removes every trace of IPVS mode in both families
// and leaves other programs' rules, sets, virtual servers and links alone.
func TestCleanup(t *testing.T) {
	ctx := context.Background()
	n := newNode(modeNodeIPs...)
	cfg6 := ipvsmode.WriterConfig{Family: v1.IPv6Protocol}
	n.apply(t,
		translate(t, modeCfg, svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"203.0.113.0/24"}, hcNodePort: 32000, etpLocal: true, endpoints: []endpoint{localPod}}),
		translate(t, cfg6, svcPort{name: "default/web", clusterIP: "fd00:96::10", port: 80, endpoints: []endpoint{{ip: "fd00:244::5"}}}),
	)

	// Other programs' state.
	const foreignRules = `*filter
:INPUT ACCEPT [0:0]
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
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
COMMIT
`
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		rules := foreignRules
		if fam == v1.IPv6Protocol {
			rules = strings.ReplaceAll(rules, "172.17.0.0/16", "fd00:17::/64")
		}
		if err := n.ipt[fam].RestoreAll(ctx, []byte(rules), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
			t.Fatal(err)
		}
	}
	other := ipset.Set{Name: "calico-things", Type: ipset.HashIP}
	if err := n.sets.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	kept := ipvs.VirtualServer{Address: addr("10.250.0.1"), Protocol: v1.ProtocolTCP, Port: 80}
	if err := n.ipvs.AddVirtualServer(ctx, kept); err != nil {
		t.Fatal(err)
	}
	n.binder.AddOtherLink("eth0")

	cfg := ipvsmode.CleanupConfig{
		IPTables:     []iptables.Interface{n.ipt[v1.IPv4Protocol], n.ipt[v1.IPv6Protocol]},
		IPSets:       n.sets,
		IPVS:         n.ipvs,
		ExcludeCIDRs: []netip.Prefix{prefix("10.250.0.0/16")},
		Binder:       n.binder,
	}
	for i := range 2 { // the second finds nothing to do
		if err := ipvsmode.Cleanup(ctx, cfg); err != nil {
			t.Fatalf("Cleanup #%d: %v", i+1, err)
		}
	}

	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		f := iptablestest.NewFake()
		if fam == v1.IPv6Protocol {
			f = iptablestest.NewIPv6Fake()
		}
		rules := foreignRules
		if fam == v1.IPv6Protocol {
			rules = strings.ReplaceAll(rules, "172.17.0.0/16", "fd00:17::/64")
		}
		if err := f.RestoreAll(ctx, []byte(rules), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(f.Dump(), n.ipt[fam].Dump()); diff != "" {
			t.Errorf("%s rules after Cleanup (-want +got):\n%s", fam, diff)
		}
	}
	infos, _ := n.sets.ListSets(ctx)
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	if diff := cmp.Diff([]string{"calico-things"}, names); diff != "" {
		t.Errorf("sets after Cleanup (-want +got):\n%s", diff)
	}
	list, _ := n.ipvs.ListVirtualServers(ctx)
	if diff := cmp.Diff([]string{kept.String()}, vsStrings(list)); diff != "" {
		t.Errorf("virtual servers after Cleanup (-want +got):\n%s", diff)
	}
	if _, err := n.binder.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
		t.Errorf("%s after Cleanup: %v, want it gone", ipvs.DummyDevice, err)
	}
	// EnsureDevice refuses a link of the name that is not a dummy one:
	// eth0 is still there.
	if _, err := n.binder.EnsureDevice(ctx, "eth0"); err == nil {
		t.Error("eth0 is gone after Cleanup")
	}
}

// TestCleanupReportsWhatItCannotRemove: a chain another program's rules
// jump to stays, and the error names it; the rest is removed.
func TestCleanupReportsWhatItCannotRemove(t *testing.T) {
	ctx := context.Background()
	n := newNode(modeNodeIPs...)
	n.apply(t, translate(t, modeCfg, svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{remotePod}}))
	ipt := n.ipt[v1.IPv4Protocol]
	// What the iptables mode's endpoint chains do.
	if err := ipt.RestoreAll(ctx, []byte("*nat\n:KUBE-SEP-XYZ - [0:0]\n-A KUBE-SEP-XYZ -j KUBE-MARK-MASQ\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	err := ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{IPTables: []iptables.Interface{ipt}, IPSets: n.sets, IPVS: n.ipvs, Binder: n.binder})
	if err == nil || !strings.Contains(err.Error(), "KUBE-MARK-MASQ (used by KUBE-SEP-XYZ)") {
		t.Errorf("Cleanup: %v, want an error naming KUBE-MARK-MASQ and KUBE-SEP-XYZ", err)
	}
	if got := ipt.Chains(iptables.TableNAT); !cmp.Equal(got, []iptables.Chain{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "KUBE-MARK-MASQ", "KUBE-SEP-XYZ"}) {
		t.Errorf("nat chains after Cleanup: %v", got)
	}
	// The kept chain still marks: flushing it would silently stop the
	// masquerading that KUBE-SEP-XYZ relies on.
	if got := ipt.Rules(iptables.TableNAT, iptables.KubeMarkMasqChain); len(got) != 1 {
		t.Errorf("KUBE-MARK-MASQ after Cleanup holds %q, want its one rule", got)
	}
	if list, _ := n.ipvs.ListVirtualServers(ctx); len(list) != 0 {
		t.Errorf("virtual servers left: %v", list)
	}

	// A set something still matches on cannot be destroyed.
	if err := n.sets.Create(ctx, ipset.Set{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort}); err != nil {
		t.Fatal(err)
	}
	if err := n.sets.Reference("KUBE-CLUSTER-IP"); err != nil {
		t.Fatal(err)
	}
	err = ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{IPSets: n.sets})
	if !errors.Is(err, ipset.ErrInUse) || !strings.Contains(err.Error(), "KUBE-CLUSTER-IP") {
		t.Errorf("Cleanup of a referenced set: %v", err)
	}
}

func vsStrings(list []ipvs.VirtualServer) []string {
	var s []string
	for _, vs := range list {
		s = append(s, vs.String())
	}
	return s
}

// TestFindLeftovers: the chains of each mode are told apart by those only
// it makes, with the iptables mode's rules written by the real rule writer.
func TestFindLeftovers(t *testing.T) {
	ctx := context.Background()
	web := svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, endpoints: []endpoint{remotePod}}
	ipvsMode := func(t *testing.T, n *node) { n.apply(t, translate(t, modeCfg, web)) }
	iptablesMode := func(t *testing.T, n *node) {
		t.Helper()
		ipt := n.ipt[v1.IPv4Protocol]
		w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: nodeName}})
		if err != nil {
			t.Fatal(err)
		}
		svcs, eps := portMaps(t, v1.IPv4Protocol, web)
		res := w.Sync(ctx, &proxy.FamilyInput{Services: svcs, Endpoints: eps})
		if err := w.EnsureJumpRules(ctx, ipt); err != nil {
			t.Fatal(err)
		}
		if err := ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		setup []func(*testing.T, *node)
		want  ipvsmode.Leftovers
	}{
		{name: "clean node"},
		{name: "IPVS mode", setup: []func(*testing.T, *node){ipvsMode}, want: ipvsmode.Leftovers{IPVSMode: true}},
		{name: "iptables mode", setup: []func(*testing.T, *node){iptablesMode}, want: ipvsmode.Leftovers{IPTablesMode: true}},
		{name: "both", setup: []func(*testing.T, *node){ipvsMode, iptablesMode}, want: ipvsmode.Leftovers{IPVSMode: true, IPTablesMode: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(modeNodeIPs...)
			for _, f := range tc.setup {
				f(t, n)
			}
			got, err := ipvsmode.DefaultNames().FindLeftovers(ctx, n.ipt[v1.IPv4Protocol])
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("FindLeftovers = %+v, want %+v", got, tc.want)
			}
			// Each mode's cleanup removes what makes it found.
			if got.IPVSMode && !got.IPTablesMode {
				if err := ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{IPTables: []iptables.Interface{n.ipt[v1.IPv4Protocol]}}); err != nil {
					t.Fatal(err)
				}
			}
			if got.IPTablesMode && !got.IPVSMode {
				if _, err := iptables.DefaultChainNames().Cleanup(ctx, n.ipt[v1.IPv4Protocol]); err != nil {
					t.Fatal(err)
				}
			}
			if !got.IPVSMode || !got.IPTablesMode {
				if after, _ := ipvsmode.DefaultNames().FindLeftovers(ctx, n.ipt[v1.IPv4Protocol]); after != (ipvsmode.Leftovers{}) {
					t.Errorf("after the cleanup: %+v", after)
				}
			}
		})
	}
}
