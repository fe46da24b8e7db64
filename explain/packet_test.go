package explain_test

import (
	"bytes"
	"math"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/explain"
	"github.com/proxykit/proxykit/internal/testkit/golden"
)

// The demo cluster's node, as the dry runs in testdata saw it (the
// example proxier's demo, --hostname-override node-a).
var demoNode = explain.Node{
	Addrs:   []netip.Addr{netip.MustParseAddr("192.168.10.11")},
	PodAddr: []netip.Addr{netip.MustParseAddr("10.244.1.99")},
}

// dryRun returns the IPv4 Ruleset of a dry run in testdata.
func dryRun(t *testing.T, name string) *explain.Ruleset {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	sets, err := explain.ParseDryRun(data, "", true)
	if err != nil {
		t.Fatal(err)
	}
	rs := sets[v1.IPv4Protocol]
	if rs == nil || len(sets) != 1 {
		t.Fatalf("dry run %s: Rulesets %v, want IPv4 alone", name, sets)
	}
	return rs
}

// seen is an outcome as a test states it: verdict, endpoint ("" when not
// DNATed), masquerade, probability (rounded), and the part of the
// deciding rule that names the cause.
type seen struct {
	Verdict  explain.Verdict
	Endpoint string
	Masq     bool
	P        float64
	Rule     string
}

func summarize(outs []explain.Outcome, ruleWords []string) []seen {
	var got []seen
	for _, o := range outs {
		s := seen{Verdict: o.Verdict, Masq: o.Masquerade, P: math.Round(o.Probability*1000) / 1000}
		if o.Endpoint.IsValid() {
			s.Endpoint = o.Endpoint.String()
		}
		for _, w := range ruleWords {
			if w != "" && strings.Contains(o.Rule, w) {
				s.Rule = w
			}
		}
		got = append(got, s)
	}
	return got
}

func packet(from explain.Source, dest string, proto v1.Protocol) explain.Packet {
	return explain.Packet{From: from, Dest: netip.MustParseAddrPort(dest), Protocol: proto}
}

// TestTraceDemo traces the demo cluster's services through the rules of
// both modes' dry runs: ClusterIP endpoints with their probabilities, a
// service without endpoints rejected by the rule that says so, a node port
// masqueraded, a load balancer's source ranges, and a Local external
// traffic policy served by the node's own endpoint alone.
func TestTraceDemo(t *testing.T) {
	web := []seen{
		{Verdict: explain.Accept, Endpoint: "10.244.1.10:8080", P: 0.333},
		{Verdict: explain.Accept, Endpoint: "10.244.1.11:8080", P: 0.333},
		{Verdict: explain.Accept, Endpoint: "10.244.2.10:8080", P: 0.333},
	}
	frontend := []seen{
		{Verdict: explain.Accept, Endpoint: "10.244.1.20:8080", Masq: true, P: 0.5},
		{Verdict: explain.Accept, Endpoint: "10.244.2.20:8080", Masq: true, P: 0.5},
	}
	// iptWant is iptables mode's outcomes where they differ.
	iptWant := map[string][]seen{"a port the service does not have": {{Verdict: explain.Accept, P: 1}}}
	for _, tc := range []struct {
		name string
		p    explain.Packet
		// rule, for iptables and for nftables mode: the words of the
		// deciding rule that the test expects.
		rule [2]string
		want []seen
	}{
		{"cluster IP from a pod", packet(explain.FromPod(), "10.96.0.10:80", v1.ProtocolTCP), [2]string{}, web},
		{"cluster IP from the node", packet(explain.FromNode(), "10.96.0.10:80", v1.ProtocolTCP), [2]string{}, web},
		{"UDP cluster IP", packet(explain.FromPod(), "10.96.0.53:53", v1.ProtocolUDP), [2]string{}, []seen{
			{Verdict: explain.Accept, Endpoint: "10.244.1.53:53", P: 0.5},
			{Verdict: explain.Accept, Endpoint: "10.244.2.53:53", P: 0.5},
		}},
		{"no endpoints", packet(explain.FromPod(), "10.96.0.50:80", v1.ProtocolTCP),
			[2]string{`"shop/orders:http has no endpoints"`, "no-endpoint-services element { 10.96.0.50 . tcp . 80 : goto reject-chain }"},
			[]seen{{Verdict: explain.Reject, P: 1}}},
		// nftables mode rejects it, as kube-proxy's; iptables mode lets
		// it through to the cluster IP, which no host has.
		{"a port the service does not have", packet(explain.FromPod(), "10.96.0.10:81", v1.ProtocolTCP), [2]string{"", "cluster-ips-check: ip daddr @cluster-ips reject"},
			[]seen{{Verdict: explain.Reject, P: 1}}},
		{"node port from outside", packet(explain.FromOutside(), "192.168.10.11:30080", v1.ProtocolTCP), [2]string{}, frontend},
		{"load balancer IP from an allowed source, Local policy", packet(explain.FromOutside(), "198.51.100.7:443", v1.ProtocolTCP), [2]string{},
			[]seen{{Verdict: explain.Accept, Endpoint: "10.244.1.30:8443", P: 1}}},
		{"load balancer IP from a source outside its ranges", packet(explain.FromAddr(netip.MustParseAddr("198.18.0.1")), "198.51.100.7:443", v1.ProtocolTCP),
			[2]string{"KUBE-PROXY-FIREWALL", "firewall-check"}, []seen{{Verdict: explain.Drop, P: 1}}},
		{"node port of a Local policy from the node: every endpoint", packet(explain.FromNode(), "192.168.10.11:30443", v1.ProtocolTCP), [2]string{}, []seen{
			{Verdict: explain.Accept, Endpoint: "10.244.1.30:8443", Masq: true, P: 0.5},
			{Verdict: explain.Accept, Endpoint: "10.244.2.30:8443", Masq: true, P: 0.5},
		}},
		{"node port of a Local policy from outside: the local endpoint", packet(explain.FromOutside(), "192.168.10.11:30443", v1.ProtocolTCP), [2]string{}, []seen{
			{Verdict: explain.Accept, Endpoint: "10.244.1.30:8443", P: 1},
		}},
	} {
		for i, file := range []string{"demo.iptables.dry-run", "demo.nftables.dry-run"} {
			rs := dryRun(t, file)
			t.Run(rs.Mode()+"/"+tc.name, func(t *testing.T) {
				ex, err := rs.Trace(tc.p, demoNode)
				if err != nil {
					t.Fatal(err)
				}
				want := tc.want
				if w, ok := iptWant[tc.name]; ok && i == 0 {
					want = w
				}
				if tc.rule[i] != "" {
					want = append([]seen(nil), want...)
					for j := range want {
						want[j].Rule = tc.rule[i]
					}
				}
				if diff := cmp.Diff(want, summarize(ex.Outcomes, []string{tc.rule[i]})); diff != "" {
					t.Errorf("outcomes (-want +got):\n%s", diff)
				}
				if ex.Packet.From.Addr == (netip.Addr{}) {
					t.Errorf("the explanation's packet has no source address: %+v", ex.Packet)
				}
			})
		}
	}
}

// TestTraceRefuses: packets Trace cannot follow are errors that say why.
func TestTraceRefuses(t *testing.T) {
	rs := dryRun(t, "demo.iptables.dry-run")
	for _, tc := range []struct {
		name string
		p    explain.Packet
		node explain.Node
		want string
	}{
		{"IPv6 destination", packet(explain.FromNode(), "[fd00::1]:80", v1.ProtocolTCP), demoNode, "not an IPv4 address"},
		{"pod without a pod address", packet(explain.FromPod(), "10.96.0.10:80", v1.ProtocolTCP), explain.Node{Addrs: demoNode.Addrs}, "no IPv4 pod address"},
		{"node without an address", packet(explain.FromNode(), "10.96.0.10:80", v1.ProtocolTCP), explain.Node{}, "the node has no IPv4 address"},
		{"source of another family", packet(explain.FromAddr(netip.MustParseAddr("fd00::1")), "10.96.0.10:80", v1.ProtocolTCP), demoNode, "not an IPv4 address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex, err := rs.Trace(tc.p, tc.node)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Trace: %v, %v; want an error containing %q", ex, err, tc.want)
			}
		})
	}
}

// TestExplanationOutput keeps the text and JSON of two explanations as
// golden files, which the README shows.
func TestExplanationOutput(t *testing.T) {
	for _, file := range []string{"demo.iptables.dry-run", "demo.nftables.dry-run"} {
		rs := dryRun(t, file)
		for _, tc := range []struct {
			name string
			p    explain.Packet
		}{
			{"reject", packet(explain.FromPod(), "10.96.0.50:80", v1.ProtocolTCP)},
			{"clusterip", packet(explain.FromPod(), "10.96.0.53:53", v1.ProtocolUDP)},
		} {
			ex, err := rs.Trace(tc.p, demoNode)
			if err != nil {
				t.Fatal(err)
			}
			var text, js bytes.Buffer
			if err := ex.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if err := ex.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, "testdata/"+rs.Mode()+"-"+tc.name+".txt", text.Bytes())
			golden.Check(t, "testdata/"+rs.Mode()+"-"+tc.name+".json", js.Bytes())
		}
	}
}

func TestParseDest(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  string
		proto v1.Protocol
		err   bool
	}{
		{in: "10.96.0.10:53/udp", want: "10.96.0.10:53", proto: v1.ProtocolUDP},
		{in: "10.96.0.10:80", want: "10.96.0.10:80", proto: v1.ProtocolTCP},
		{in: "[fd00::10]:443/TCP", want: "[fd00::10]:443", proto: v1.ProtocolTCP},
		{in: "10.96.0.10:9/Sctp", want: "10.96.0.10:9", proto: v1.ProtocolSCTP},
		{in: "10.96.0.10/udp", err: true},
		{in: "10.96.0.10:0/udp", err: true},
		{in: "10.96.0.10:80/icmp", err: true},
		{in: "my-service:80", err: true},
	} {
		ap, proto, err := explain.ParseDest(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseDest(%q): error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if !tc.err && (ap.String() != tc.want || proto != tc.proto) {
			t.Errorf("ParseDest(%q) = %s %s, want %s %s", tc.in, ap, proto, tc.want, tc.proto)
		}
	}
}

func TestParseSource(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want explain.Source
		err  bool
	}{
		{in: "node", want: explain.FromNode()},
		{in: "pod", want: explain.FromPod()},
		{in: "outside", want: explain.FromOutside()},
		{in: "10.1.2.3", want: explain.FromAddr(netip.MustParseAddr("10.1.2.3"))},
		{in: "::ffff:10.1.2.3", want: explain.FromAddr(netip.MustParseAddr("10.1.2.3"))},
		{in: "addr", err: true},
		{in: "a-pod", err: true},
	} {
		got, err := explain.ParseSource(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseSource(%q): error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseSource(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
