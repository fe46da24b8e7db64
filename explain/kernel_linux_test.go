package explain

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// kernelNode is a node namespace with the demo node's address, linked to
// a client namespace.
type kernelNode struct {
	ns, client *kerneltest.NS
	lockFile   string
}

var (
	kernelNodeIP   = netip.MustParseAddr("192.168.10.11")
	kernelClientIP = netip.MustParseAddr("192.168.10.50")
)

func newKernelNode(t *testing.T) *kernelNode {
	t.Helper()
	node, client := kerneltest.NewNS(t), kerneltest.NewNS(t)
	kerneltest.Link(t, node, client, netip.PrefixFrom(kernelNodeIP, 24), netip.PrefixFrom(kernelClientIP, 24))
	// Service addresses are routed out, as on a node.
	node.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), kernelClientIP)
	return &kernelNode{ns: node, client: client, lockFile: filepath.Join(t.TempDir(), "xtables.lock")}
}

func (n *kernelNode) path() string { return "/run/netns/" + n.ns.Name }

// run runs a tool in the node's namespace with input, with a lock file of
// the namespace's own.
func (n *kernelNode) run(t *testing.T, input, name string, args ...string) {
	t.Helper()
	var out strings.Builder
	err := n.ns.Do(func() error {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+n.lockFile)
		cmd.Stdin = strings.NewReader(input)
		cmd.Stdout, cmd.Stderr = &out, &out
		return cmd.Run()
	})
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out.String())
	}
}

// demoRules returns the demo dry run's Ruleset of mode, and what programs
// it into a namespace: iptables-restore input, or nft -f input.
func demoRules(t *testing.T, mode string) (*Ruleset, string) {
	t.Helper()
	data, err := os.ReadFile("testdata/demo." + mode + ".dry-run")
	if err != nil {
		t.Fatal(err)
	}
	sets, err := ParseDryRun(data, "", true)
	if err != nil {
		t.Fatal(err)
	}
	rs := sets[v1.IPv4Protocol]
	if mode == ModeIPTables {
		// The restore input with the jumps from the built-in chains, as
		// the writer and the proxier leave the tables.
		return rs, rs.ipt.Dump()
	}
	_, body, _ := strings.Cut(string(data), "\n")
	return rs, body
}

// gridOfDemo is every demo service address from each source kind.
func gridOfDemo() []Packet {
	var out []Packet
	for _, d := range []string{"10.96.0.10:80", "10.96.0.20:80", "10.96.0.30:443", "10.96.0.40:9100", "10.96.0.50:80", "10.96.0.53:53",
		"192.168.10.11:30080", "192.168.10.11:30443", "198.51.100.7:443", "192.0.2.40:9100"} {
		for _, from := range []Source{FromPod(), FromNode(), FromOutside()} {
			for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
				out = append(out, Packet{From: from, Dest: netip.MustParseAddrPort(d), Protocol: proto})
			}
		}
	}
	return out
}

// brief is an outcome as the kernel tests state it.
type brief struct {
	Verdict  Verdict
	Endpoint string
	Masq     bool
	P        float64
}

func briefs(outs []Outcome) []brief {
	var out []brief
	for _, o := range outs {
		b := brief{Verdict: o.Verdict, Masq: o.Masquerade, P: math.Round(o.Probability*1000) / 1000}
		if o.Endpoint.IsValid() {
			b.Endpoint = o.Endpoint.String()
		}
		out = append(out, b)
	}
	return out
}

// TestReadKernel programs the demo cluster's rules, as the writers render
// them, into a node namespace with iptables-legacy, iptables-nft and nft,
// reads them back with ReadKernel and checks:
//
//   - the rules read trace as the rules written over every service
//     address and source, and nothing is missing or extra (a reader that
//     lost or garbled a rule, element or priority fails here);
//   - packets are explained: a ClusterIP's endpoints with their
//     probabilities, a service without endpoints rejected by the rule
//     that says so (and the kernel refuses the node's connection), a node
//     port masqueraded, a Local policy's load balancer;
//   - drift made by hand in the namespace is found: a rule inserted with
//     iptables or nft, an element deleted with nft.
func TestReadKernel(t *testing.T) {
	kerneltest.Require(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save", "nft")
	node := Node{Addrs: []netip.Addr{kernelNodeIP}, PodAddr: []netip.Addr{netip.MustParseAddr("10.244.1.99")}}
	for _, tc := range []struct {
		name    string
		mode    string
		backend iptables.Backend
		// program loads the rules; drift makes hand-made drift and says
		// what Compare must then report.
		program     func(t *testing.T, n *kernelNode, input string)
		drift       func(t *testing.T, n *kernelNode)
		driftDest   string
		driftProto  v1.Protocol
		driftChange []string // Missing, then Extra, as "missing: X" / "extra: X"
	}{
		{
			name: "iptables-legacy", mode: ModeIPTables, backend: iptables.BackendLegacy,
			program: func(t *testing.T, n *kernelNode, input string) { n.run(t, input, "iptables-legacy-restore") },
			drift: func(t *testing.T, n *kernelNode) {
				n.run(t, "", "iptables-legacy", "-t", "filter", "-I", "KUBE-SERVICES", "-d", "10.244.1.53/32", "-p", "udp", "-j", "DROP")
			},
			driftDest: "10.96.0.53:53", driftProto: v1.ProtocolUDP,
			driftChange: []string{"extra: -t filter -A KUBE-SERVICES -d 10.244.1.53/32 -p udp -j DROP"},
		},
		{
			name: "iptables-nft", mode: ModeIPTables, backend: iptables.BackendNFT,
			program: func(t *testing.T, n *kernelNode, input string) { n.run(t, input, "iptables-nft-restore") },
			drift: func(t *testing.T, n *kernelNode) {
				n.run(t, "", "iptables-nft", "-t", "filter", "-I", "KUBE-SERVICES", "-d", "10.244.1.53/32", "-p", "udp", "-j", "DROP")
			},
			driftDest: "10.96.0.53:53", driftProto: v1.ProtocolUDP,
			driftChange: []string{"extra: -t filter -A KUBE-SERVICES -d 10.244.1.53/32 -p udp -j DROP"},
		},
		{
			name: "nftables", mode: ModeNFTables,
			program: func(t *testing.T, n *kernelNode, input string) { n.run(t, input, "nft", "-f", "-") },
			drift: func(t *testing.T, n *kernelNode) {
				n.run(t, "", "nft", "delete", "element", "ip", "kube-proxy", "endpoints", "{ 10.96.0.10 . tcp . 80 . 2 }")
				n.run(t, "", "nft", "insert", "rule", "ip", "kube-proxy", "services", "ip", "daddr", "10.96.0.53", "udp", "dport", "53", "counter", "drop")
			},
			driftDest: "10.96.0.53:53", driftProto: v1.ProtocolUDP,
			driftChange: []string{
				"missing: element endpoints { 10.96.0.10 . tcp . 80 . 2 : 10.244.2.10 . 8080 }",
				"extra: rule services: ip daddr 10.96.0.53 udp dport 53 drop",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			n := newKernelNode(t)
			want, input := demoRules(t, tc.mode)
			target := Target{Mode: tc.mode, Backend: tc.backend, NetNS: n.path()}

			// Nothing programmed yet: the error names what is missing.
			missing := map[string]string{ModeNFTables: "nftables table ip kube-proxy", ModeIPTables: "no chain KUBE-SERVICES in the nat table"}[tc.mode]
			if _, err := ReadKernel(ctx, target, v1.IPv4Protocol); err == nil || !strings.Contains(err.Error(), missing) {
				t.Errorf("ReadKernel before the rules are there: %v, want an error containing %q", err, missing)
			}

			tc.program(t, n, input)
			live, err := ReadKernel(ctx, target, v1.IPv4Protocol)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Compare(live, want, gridOfDemo(), node)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Empty() {
				var b strings.Builder
				_ = d.WriteText(&b)
				t.Fatalf("the rules read differ from those written:\n%s", b.String())
			}

			for _, x := range []struct {
				name string
				p    Packet
				want []brief
			}{
				{"cluster IP", Packet{FromPod(), netip.MustParseAddrPort("10.96.0.10:80"), v1.ProtocolTCP}, []brief{
					{Accept, "10.244.1.10:8080", false, 0.333}, {Accept, "10.244.1.11:8080", false, 0.333}, {Accept, "10.244.2.10:8080", false, 0.333}}},
				{"no endpoints", Packet{FromNode(), netip.MustParseAddrPort("10.96.0.50:80"), v1.ProtocolTCP}, []brief{{Reject, "", false, 1}}},
				{"node port", Packet{FromOutside(), netip.MustParseAddrPort("192.168.10.11:30080"), v1.ProtocolTCP}, []brief{
					{Accept, "10.244.1.20:8080", true, 0.5}, {Accept, "10.244.2.20:8080", true, 0.5}}},
				{"Local policy, from outside", Packet{FromOutside(), netip.MustParseAddrPort("192.168.10.11:30443"), v1.ProtocolTCP}, []brief{
					{Accept, "10.244.1.30:8443", false, 1}}},
			} {
				ex, err := live.Trace(x.p, node)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(x.want, briefs(ex.Outcomes)); diff != "" {
					t.Errorf("%s: outcomes (-want +got):\n%s", x.name, diff)
				}
				if x.want[0].Verdict == Reject && !strings.Contains(ex.Outcomes[0].Rule, "10.96.0.50") {
					t.Errorf("%s: rejected by %q, want the rule or element of 10.96.0.50", x.name, ex.Outcomes[0].Rule)
				}
			}
			// The kernel agrees: the node's connection is refused.
			if _, err := kerneltest.DialFrom(n.ns, "tcp", kernelNodeIP, netip.MustParseAddrPort("10.96.0.50:80"), 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("the node's connection to the service without endpoints: %v, want refused", err)
			}

			tc.drift(t, n)
			live, err = ReadKernel(ctx, target, v1.IPv4Protocol)
			if err != nil {
				t.Fatal(err)
			}
			d, err = Compare(live, want, gridOfDemo(), node)
			if err != nil {
				t.Fatal(err)
			}
			var changes []string
			for _, m := range d.Missing {
				changes = append(changes, "missing: "+m)
			}
			for _, x := range d.Extra {
				changes = append(changes, "extra: "+x)
			}
			if diff := cmp.Diff(tc.driftChange, changes); diff != "" {
				t.Errorf("drift's missing and extra (-want +got):\n%s", diff)
			}
			found := false
			for _, p := range d.Packets {
				if p.Packet.Dest.String() == tc.driftDest && p.Packet.Protocol == tc.driftProto {
					found = true
					dropped := false
					for _, o := range p.Live {
						dropped = dropped || o.Verdict == Drop
					}
					if !dropped {
						t.Errorf("drift of %s: live outcomes %+v, want the hand-made drop among them", tc.driftDest, p.Live)
					}
				}
			}
			if !found {
				t.Errorf("drift: no packet to %s/%s differs; packets %+v", tc.driftDest, tc.driftProto, d.Packets)
			}
		})
	}
}
