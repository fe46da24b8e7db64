package explain_test

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/explain"
)

// demoGrid are packets to every address of the demo cluster's services,
// from each kind of source, in both protocols.
func demoGrid() []explain.Packet {
	var out []explain.Packet
	for _, d := range []string{"10.96.0.10:80", "10.96.0.20:80", "10.96.0.30:443", "10.96.0.40:9100", "10.96.0.50:80", "10.96.0.53:53",
		"192.168.10.11:30080", "192.168.10.11:30443", "198.51.100.7:443", "192.0.2.40:9100"} {
		for _, from := range []explain.Source{explain.FromPod(), explain.FromNode(), explain.FromOutside()} {
			for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
				out = append(out, packet(from, d, proto))
			}
		}
	}
	return out
}

// kernelOutput is the demo's dry-run input as a kernel printed it back
// (testdata/demo.iptables-save from iptables-legacy-save, demo.nft-list
// from nft list table), edited by edit.
func kernelOutput(t *testing.T, mode string, edit func(string) string) *explain.Ruleset {
	t.Helper()
	file := map[string]string{explain.ModeIPTables: "demo.iptables-save", explain.ModeNFTables: "demo.nft-list"}[mode]
	data, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if edit != nil {
		text = edit(text)
	}
	var rs *explain.Ruleset
	if mode == explain.ModeIPTables {
		rs, err = explain.IPTablesRuleset(v1.IPv4Protocol, []byte(text), "")
	} else {
		rs, err = explain.NFTablesRuleset(v1.IPv4Protocol, explain.DefaultTable, []byte(text))
	}
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func replace(old, new string) func(string) string {
	return func(s string) string {
		if !strings.Contains(s, old) {
			panic("the test's edit does not apply: no " + old)
		}
		return strings.Replace(s, old, new, 1)
	}
}

// TestCompareKernelOutput reads what the kernel printed of the demo's
// rules, as is and with hand-made drift, and compares it with the dry
// run's rules: as is, nothing differs over the whole grid (the readers
// agree with the writers); a deleted endpoint, a rule added by hand and a
// deleted jump are each found, as the packets they change and the rules or
// elements missing and extra.
func TestCompareKernelOutput(t *testing.T) {
	type drift struct {
		// Packets are the packets that differ, as "proto dest from".
		Packets        []string
		Missing, Extra []string
	}
	for _, tc := range []struct {
		name, mode string
		edit       func(string) string
		want       drift
	}{
		{name: "iptables as written", mode: explain.ModeIPTables},
		{name: "nftables as written", mode: explain.ModeNFTables},
		{
			// As a proxier with kube-proxy's nfacct counters leaves them,
			// which a dry run does not render.
			name: "iptables with packet counters",
			mode: explain.ModeIPTables,
			edit: func(s string) string {
				s = replace("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
					"-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP")(s)
				return replace(`-A KUBE-NODEPORTS -p tcp -m comment --comment "shop/shop-frontend:http" -m tcp --dport 30080 -j KUBE-EXT-TCV54TU65AKWGMA2`,
					`-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "shop/shop-frontend:http" -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT-TCV54TU65AKWGMA2`+
						"\n"+`-A KUBE-NODEPORTS -p tcp -m comment --comment "shop/shop-frontend:http" -m tcp --dport 30080 -j KUBE-EXT-TCV54TU65AKWGMA2`)(s)
			},
		},
		{
			name: "iptables: a rule added by hand drops one DNS endpoint",
			mode: explain.ModeIPTables,
			edit: replace("-A KUBE-SERVICES -d 10.96.0.50/32", "-A KUBE-SERVICES -d 10.244.1.53/32 -p udp -j DROP\n-A KUBE-SERVICES -d 10.96.0.50/32"),
			want: drift{
				Packets: []string{"udp 10.96.0.53:53 pod", "udp 10.96.0.53:53 node", "udp 10.96.0.53:53 outside"},
				Extra:   []string{"-t filter -A KUBE-SERVICES -d 10.244.1.53/32 -p udp -j DROP"},
			},
		},
		{
			name: "iptables: an endpoint's rule deleted",
			mode: explain.ModeIPTables,
			edit: replace("-A KUBE-SVC-2KKYJRIGYGQNRODB -m comment --comment \"kube-system/dns:dns -> 10.244.1.53:53\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-FOVVATSJWM3ZDQHB\n", ""),
			want: drift{
				Packets: []string{"udp 10.96.0.53:53 pod", "udp 10.96.0.53:53 node", "udp 10.96.0.53:53 outside"},
				Missing: []string{`-t nat -A KUBE-SVC-2KKYJRIGYGQNRODB -m comment --comment "kube-system/dns:dns -> 10.244.1.53:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-FOVVATSJWM3ZDQHB`},
			},
		},
		{
			name: "nftables: an endpoint's element deleted",
			mode: explain.ModeNFTables,
			edit: replace(",\n\t\t\t     10.96.0.10 . tcp . 80 . 2 : 10.244.2.10 . 8080", ""),
			want: drift{
				Packets: []string{"tcp 10.96.0.10:80 pod", "tcp 10.96.0.10:80 node", "tcp 10.96.0.10:80 outside"},
				Missing: []string{"element endpoints { 10.96.0.10 . tcp . 80 . 2 : 10.244.2.10 . 8080 }"},
			},
		},
		{
			name: "nftables: a rule added by hand",
			mode: explain.ModeNFTables,
			edit: replace("\tchain services {\n", "\tchain services {\n\t\tip daddr 10.96.0.20 tcp dport 80 counter packets 3 bytes 180 drop\n"),
			want: drift{
				Packets: []string{"tcp 10.96.0.20:80 pod", "tcp 10.96.0.20:80 node", "tcp 10.96.0.20:80 outside"},
				Extra:   []string{"rule services: ip daddr 10.96.0.20 tcp dport 80 drop"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := dryRun(t, "demo."+tc.mode+".dry-run")
			live := kernelOutput(t, tc.mode, tc.edit)
			d, err := explain.Compare(live, want, demoGrid(), demoNode)
			if err != nil {
				t.Fatal(err)
			}
			got := drift{Missing: d.Missing, Extra: d.Extra}
			for _, p := range d.Packets {
				got.Packets = append(got.Packets, strings.ToLower(string(p.Packet.Protocol))+" "+p.Packet.Dest.String()+" "+string(p.Packet.From.Kind))
			}
			if tc.want.Missing == nil {
				tc.want.Missing = []string{}
			}
			if tc.want.Extra == nil {
				tc.want.Extra = []string{}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("drift (-want +got):\n%s", diff)
			}
			if d.Traced != len(demoGrid()) {
				t.Errorf("traced %d packets, want %d", d.Traced, len(demoGrid()))
			}
		})
	}
}

// TestCompareRefusesOtherModes: rules of two modes are not compared.
func TestCompareRefusesOtherModes(t *testing.T) {
	if _, err := explain.Compare(dryRun(t, "demo.iptables.dry-run"), dryRun(t, "demo.nftables.dry-run"), nil, demoNode); err == nil {
		t.Error("Compare of iptables with nftables rules: no error")
	}
}

// TestReadErrors: a listing the readers cannot read, or whose rules the
// tracers cannot interpret, is an error naming the line or the rule.
func TestReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		edit       func(string) string
		// readErr is part of the reader's error; traceErr, when the read
		// succeeds, of the trace's.
		readErr, traceErr string
	}{
		{name: "another table", mode: explain.ModeNFTables, edit: replace("table ip kube-proxy {", "table ip other {"), readErr: `"table ip other {" is not "table ip kube-proxy {"`},
		{name: "a truncated listing", mode: explain.ModeNFTables, edit: func(s string) string { return s[:len(s)/2] }, readErr: "the listing ends inside"},
		{name: "a flowtable", mode: explain.ModeNFTables, edit: replace("\tchain services {", "\tflowtable f {\n\t}\n\tchain services {"), readErr: "only chains, sets and maps are read"},
		{name: "a drop policy", mode: explain.ModeNFTables, edit: replace("type nat hook prerouting priority dstnat; policy accept;", "type nat hook prerouting priority dstnat; policy drop;"),
			traceErr: "policy drop is not interpreted"},
		{name: "a rule the tracer does not know", mode: explain.ModeNFTables, edit: replace("\tchain services {\n", "\tchain services {\n\t\toifname \"eth0\" drop\n"),
			traceErr: `rule "oifname \"eth0\" drop"`},
		{name: "an unknown iptables match", mode: explain.ModeIPTables, edit: replace("-A KUBE-SERVICES ", "-A KUBE-SERVICES -m frobnicate --frob 1 -j DROP\n-A KUBE-SERVICES "), readErr: "frobnicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := map[string]string{explain.ModeIPTables: "demo.iptables-save", explain.ModeNFTables: "demo.nft-list"}[tc.mode]
			data, err := os.ReadFile("testdata/" + file)
			if err != nil {
				t.Fatal(err)
			}
			text := tc.edit(string(data))
			var rs *explain.Ruleset
			if tc.mode == explain.ModeIPTables {
				rs, err = explain.IPTablesRuleset(v1.IPv4Protocol, []byte(text), "")
			} else {
				rs, err = explain.NFTablesRuleset(v1.IPv4Protocol, explain.DefaultTable, []byte(text))
			}
			if tc.readErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.readErr) {
					t.Fatalf("read: %v, want an error containing %q", err, tc.readErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = rs.Trace(packet(explain.FromPod(), "10.96.0.10:80", v1.ProtocolTCP), demoNode)
			if err == nil || !strings.Contains(err.Error(), tc.traceErr) {
				t.Errorf("trace: %v, want an error containing %q", err, tc.traceErr)
			}
		})
	}
}

// TestGrid: every address and port of each service, from each source.
func TestGrid(t *testing.T) {
	svc := func(name string, spec v1.ServiceSpec, ingress ...string) *v1.Service {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: spec}
		for _, ip := range ingress {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	services := []*v1.Service{
		svc("lb", v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.1", "fd00::1"}, ExternalIPs: []string{"192.0.2.1"},
			Ports: []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}, {Port: 53, Protocol: v1.ProtocolUDP}}}, "198.51.100.1"),
		svc("headless", v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Port: 80}}}),
		svc("name", v1.ServiceSpec{Type: v1.ServiceTypeExternalName, ExternalName: "example.com"}),
		svc("old", v1.ServiceSpec{ClusterIP: "10.96.0.2", Ports: []v1.ServicePort{{Port: 81}}}),
	}
	node := explain.Node{Addrs: []netip.Addr{netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("fd01::1")}}
	var got []string
	for _, p := range explain.Grid(services, v1.IPv4Protocol, node) {
		got = append(got, p.String())
	}
	var want []string
	for _, d := range []string{"tcp %s -> 10.96.0.1:80", "tcp %s -> 192.0.2.1:80", "tcp %s -> 198.51.100.1:80", "tcp %s -> 192.168.0.1:30080",
		"udp %s -> 10.96.0.1:53", "udp %s -> 192.0.2.1:53", "udp %s -> 198.51.100.1:53", "tcp %s -> 10.96.0.2:81"} {
		for _, from := range []string{"node", "outside"} {
			want = append(want, strings.Replace(d, "%s", from, 1))
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("grid without a pod address (-want +got):\n%s", diff)
	}
	node.PodAddr = []netip.Addr{netip.MustParseAddr("10.244.0.5")}
	if g := explain.Grid(services, v1.IPv4Protocol, node); len(g) != 3*len(want)/2 || g[0].From.Kind != explain.SourcePod {
		t.Errorf("grid with a pod address: %d packets, first %v; want %d, from a pod first", len(g), g[0], 3*len(want)/2)
	}
}

// TestReadKernelNames: ReadKernel's errors say what it could not read.
func TestReadKernelNames(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := explain.ReadKernel(t.Context(), explain.Target{Mode: explain.ModeNFTables}, v1.IPv4Protocol)
	if !errors.Is(err, explain.ErrToolMissing) || !strings.Contains(err.Error(), "nft") {
		t.Errorf("ReadKernel without nft: %v, want ErrToolMissing naming nft", err)
	}
	_, err = explain.ReadKernel(t.Context(), explain.Target{Mode: explain.ModeIPTables, Backend: "legacy"}, v1.IPv6Protocol)
	if !errors.Is(err, explain.ErrToolMissing) || !strings.Contains(err.Error(), "ip6tables-legacy-save") {
		t.Errorf("ReadKernel without ip6tables-legacy-save: %v, want ErrToolMissing naming it", err)
	}
	if _, err = explain.ReadKernel(t.Context(), explain.Target{Mode: "ipvs"}, v1.IPv4Protocol); err == nil || !strings.Contains(err.Error(), `mode "ipvs"`) {
		t.Errorf("ReadKernel of IPVS mode: %v, want an error naming the mode", err)
	}
}
