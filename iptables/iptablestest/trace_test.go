package iptablestest

import (
	"context"
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/iptables"
)

// serviceRules is a small kube-proxy style ruleset: a ClusterIP service
// with two endpoints and ClientIP affinity, reachable on a NodePort and on
// a load balancer IP whose source ranges are enforced in mangle, and a
// service without endpoints, rejected in filter.
const serviceRules = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
-A INPUT -m conntrack --ctstate NEW -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES
-A FORWARD -j KUBE-FORWARD
-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "ns/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-1 - [0:0]
:KUBE-SEP-2 - [0:0]
:KUBE-EXT-A - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SERVICES -d 192.0.2.10/32 -p tcp -m tcp --dport 80 -j KUBE-EXT-A
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-EXT-A
-A KUBE-EXT-A -j KUBE-MARK-MASQ
-A KUBE-EXT-A -j KUBE-SVC-A
-A KUBE-SVC-A ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-A -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -j KUBE-SEP-1
-A KUBE-SVC-A -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-2 --mask 255.255.255.255 --rsource -j KUBE-SEP-2
-A KUBE-SVC-A -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-1
-A KUBE-SVC-A -j KUBE-SEP-2
-A KUBE-SEP-1 -s 10.244.1.5/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-1 -p tcp -m recent --set --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SEP-2 -s 10.244.2.7/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-2 -p tcp -m recent --set --name KUBE-SEP-2 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.2.7:8080
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-FW-A - [0:0]
-A PREROUTING -d 192.0.2.10/32 -p tcp -m tcp --dport 80 -j KUBE-FW-A
-A KUBE-FW-A -s 198.51.100.0/24 -j RETURN
-A KUBE-FW-A -j DROP
COMMIT
`

func loadRules(t *testing.T, f *Fake, rules string) *Fake {
	t.Helper()
	if err := f.RestoreAll(context.Background(), []byte(rules), iptables.FlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	return f
}

var (
	nodeIP   = netip.MustParseAddr("192.168.0.10")
	podIP    = netip.MustParseAddr("10.244.3.3")
	outsider = netip.MustParseAddr("203.0.113.9")
)

func tcpTo(src netip.Addr, dst string, port uint16) Packet {
	return Packet{Protocol: "tcp", Source: src, SourcePort: 40000, Destination: netip.MustParseAddr(dst), DestinationPort: port,
		NodeAddrs: []netip.Addr{nodeIP}, Recent: map[string]bool{}}
}

func outcomeStrings(outs []Outcome) []string {
	s := make([]string, len(outs))
	for i, o := range outs {
		s[i] = o.String()
	}
	return s
}

func TestTraceServices(t *testing.T) {
	f := loadRules(t, NewFake(), serviceRules)
	for _, tc := range []struct {
		name string
		p    Packet
		want []string
	}{
		{
			name: "ClusterIP from a pod: either endpoint, no masquerade",
			p:    tcpTo(podIP, "10.96.0.10", 80),
			want: []string{"ACCEPT to 10.244.1.5:8080 (DNAT) p=0.5", "ACCEPT to 10.244.2.7:8080 (DNAT) p=0.5"},
		},
		{
			name: "ClusterIP from outside the cluster CIDR is masqueraded",
			p:    tcpTo(outsider, "10.96.0.10", 80),
			want: []string{"ACCEPT to 10.244.1.5:8080 (DNAT) masquerade p=0.5", "ACCEPT to 10.244.2.7:8080 (DNAT) masquerade p=0.5"},
		},
		{
			name: "hairpin: an endpoint reaching its own service is masqueraded",
			p:    tcpTo(netip.MustParseAddr("10.244.1.5"), "10.96.0.10", 80),
			want: []string{"ACCEPT to 10.244.1.5:8080 (DNAT) masquerade p=0.5", "ACCEPT to 10.244.2.7:8080 (DNAT) p=0.5"},
		},
		{
			name: "ClusterIP from the node itself",
			p:    func() Packet { p := tcpTo(nodeIP, "10.96.0.10", 80); p.FromNode = true; return p }(),
			want: []string{"ACCEPT to 10.244.1.5:8080 (DNAT) masquerade p=0.5", "ACCEPT to 10.244.2.7:8080 (DNAT) masquerade p=0.5"},
		},
		{
			name: "wrong port: untouched",
			p:    tcpTo(podIP, "10.96.0.10", 81),
			want: []string{"ACCEPT to 10.96.0.10:81 p=1"},
		},
		{
			name: "UDP to a TCP service: untouched",
			p:    func() Packet { p := tcpTo(podIP, "10.96.0.10", 80); p.Protocol = "udp"; return p }(),
			want: []string{"ACCEPT to 10.96.0.10:80 p=1"},
		},
		{
			name: "NodePort on a node address",
			p:    tcpTo(outsider, nodeIP.String(), 30080),
			want: []string{"ACCEPT to 10.244.1.5:8080 (DNAT) masquerade p=0.5", "ACCEPT to 10.244.2.7:8080 (DNAT) masquerade p=0.5"},
		},
		{
			name: "NodePort port on another address is not a NodePort",
			p:    tcpTo(outsider, "192.168.0.99", 30080),
			want: []string{"ACCEPT to 192.168.0.99:30080 p=1"},
		},
		{
			name: "unused port on the node is delivered locally",
			p:    tcpTo(outsider, nodeIP.String(), 22),
			want: []string{"ACCEPT local to 192.168.0.10:22 p=1"},
		},
		{
			name: "service without endpoints is rejected",
			p:    tcpTo(podIP, "10.96.0.20", 80),
			want: []string{"REJECT to 10.96.0.20:80 with icmp-port-unreachable p=1"},
		},
		{
			name: "service without endpoints, from the node",
			p:    func() Packet { p := tcpTo(nodeIP, "10.96.0.20", 80); p.FromNode = true; return p }(),
			want: []string{"REJECT to 10.96.0.20:80 with icmp-port-unreachable p=1"},
		},
		{
			name: "load balancer from an allowed source",
			p:    tcpTo(netip.MustParseAddr("198.51.100.7"), "192.0.2.10", 80),
			want: []string{"ACCEPT to 10.244.1.5:8080 (DNAT) masquerade p=0.5", "ACCEPT to 10.244.2.7:8080 (DNAT) masquerade p=0.5"},
		},
		{
			name: "load balancer from another source",
			p:    tcpTo(outsider, "192.0.2.10", 80),
			want: []string{"DROP to 192.0.2.10:80 p=1"},
		},
		{
			name: "affinity remembered",
			p: func() Packet {
				p := tcpTo(podIP, "10.96.0.10", 80)
				p.Recent = map[string]bool{"KUBE-SEP-2": true}
				return p
			}(),
			want: []string{"ACCEPT to 10.244.2.7:8080 (DNAT) p=1"},
		},
		{
			name: "affinity unknown: every branch, with what it assumed",
			p:    func() Packet { p := tcpTo(podIP, "10.96.0.10", 80); p.Recent = nil; return p }(),
			want: []string{
				"ACCEPT to 10.244.1.5:8080 (DNAT) p=1 assuming recent:KUBE-SEP-1=true",
				"ACCEPT to 10.244.2.7:8080 (DNAT) p=1 assuming recent:KUBE-SEP-1=false recent:KUBE-SEP-2=true",
				"ACCEPT to 10.244.1.5:8080 (DNAT) p=0.5 assuming recent:KUBE-SEP-1=false recent:KUBE-SEP-2=false",
				"ACCEPT to 10.244.2.7:8080 (DNAT) p=0.5 assuming recent:KUBE-SEP-1=false recent:KUBE-SEP-2=false",
			},
		},
		{
			name: "established connections skip nat",
			p:    func() Packet { p := tcpTo(podIP, "10.96.0.10", 80); p.CTState = "ESTABLISHED"; return p }(),
			want: []string{"ACCEPT to 10.96.0.10:80 p=1"},
		},
		{
			name: "invalid packets are dropped in FORWARD",
			p:    func() Packet { p := tcpTo(podIP, "10.96.0.10", 80); p.CTState = "INVALID"; return p }(),
			want: []string{"DROP to 10.96.0.10:80 p=1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := f.Trace(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, outcomeStrings(outs)); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			// Outcomes sharing their assumptions add up to 1.
			sums := map[string]float64{}
			for _, o := range outs {
				_, assumed, _ := strings.Cut(o.String(), "assuming")
				sums[assumed] += o.Probability
			}
			for k, sum := range sums {
				if math.Abs(sum-1) > 1e-9 {
					t.Errorf("probabilities of outcomes assuming %q add up to %v", k, sum)
				}
			}
		})
	}
}

func TestTracePathAndEffects(t *testing.T) {
	f := loadRules(t, NewFake(), serviceRules)
	outs, err := f.Trace(tcpTo(outsider, nodeIP.String(), 30080))
	if err != nil {
		t.Fatal(err)
	}
	o := outs[0]
	want := []string{
		"-t nat -A PREROUTING -j KUBE-SERVICES",
		"-t nat -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
		"-t nat -A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-EXT-A",
		"-t nat -A KUBE-EXT-A -j KUBE-MARK-MASQ",
		"-t nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
		"-t nat -A KUBE-EXT-A -j KUBE-SVC-A",
		"-t nat -A KUBE-SVC-A -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-1",
		"-t nat -A KUBE-SEP-1 -p tcp -m recent --set --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.5:8080",
		"-t filter -A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES",
		"-t filter -A FORWARD -j KUBE-FORWARD",
		"-t filter -A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT",
		"-t nat -A POSTROUTING -j KUBE-POSTROUTING",
		"-t nat -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
		"-t nat -A KUBE-POSTROUTING -j MASQUERADE --random-fully",
	}
	if diff := cmp.Diff(want, o.Path); diff != "" {
		t.Errorf("path (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"KUBE-SEP-1"}, o.RecentSet); diff != "" {
		t.Errorf("RecentSet (-want +got):\n%s", diff)
	}
	if o.Mark != 0 || !o.Masquerade || o.Source != outsider || !o.DNAT || o.Local {
		t.Errorf("outcome %+v", o)
	}
}

func TestTraceChainSemantics(t *testing.T) {
	const rules = `*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:CALLER - [0:0]
:GOTO - [0:0]
:SETS - [0:0]
-A INPUT -i lo -j ACCEPT
-A INPUT -p udp -j CALLER
-A INPUT -p tcp -m multiport --dports 22,8000:8100 -j ACCEPT
-A INPUT -p sctp -j SETS
-A CALLER -g GOTO
-A CALLER -j ACCEPT
-A GOTO -m mark --mark 0x1 -j RETURN
-A GOTO -j MARK --set-mark 0x2
-A SETS -m set --match-set allowed src -j ACCEPT
-A SETS -m physdev --physdev-is-bridged -j ACCEPT
-A SETS -j REJECT
-A FORWARD -o eth+ -j ACCEPT
COMMIT
`
	f := loadRules(t, NewFake(WithIPSets(func(string) bool { return true })), rules)
	base := Packet{Source: outsider, Destination: nodeIP, SourcePort: 1, DestinationPort: 8050, NodeAddrs: []netip.Addr{nodeIP}}
	for _, tc := range []struct {
		name   string
		change func(p *Packet)
		want   []string
	}{
		{
			name:   "policy DROP",
			change: func(p *Packet) { p.Protocol = "icmp" },
			want:   []string{"DROP local to 192.168.0.10:8050 p=1"},
		},
		{
			name:   "multiport range",
			change: func(p *Packet) { p.Protocol = "tcp" },
			want:   []string{"ACCEPT local to 192.168.0.10:8050 p=1"},
		},
		{
			// RETURN from a chain entered by -g returns past its
			// caller, to the policy.
			name:   "RETURN after -g skips the caller's remaining rules",
			change: func(p *Packet) { p.Protocol = "udp"; p.Mark = 1 },
			want:   []string{"DROP local to 192.168.0.10:8050 mark=0x1 p=1"},
		},
		{
			name:   "falling off a goto'd chain also returns past the caller",
			change: func(p *Packet) { p.Protocol = "udp" },
			want:   []string{"DROP local to 192.168.0.10:8050 mark=0x2 p=1"},
		},
		{
			name:   "unknown set membership: both branches",
			change: func(p *Packet) { p.Protocol = "sctp" },
			want: []string{
				"ACCEPT local to 192.168.0.10:8050 p=1 assuming set:allowed=true",
				"REJECT local to 192.168.0.10:8050 with icmp-port-unreachable p=1 assuming set:allowed=false",
			},
		},
		{
			name:   "known set membership",
			change: func(p *Packet) { p.Protocol = "sctp"; p.Sets = map[string]bool{"allowed": true} },
			want:   []string{"ACCEPT local to 192.168.0.10:8050 p=1"},
		},
		{
			name:   "from the node to itself comes in on lo",
			change: func(p *Packet) { p.Protocol = "icmp"; p.FromNode = true; p.Source = nodeIP },
			want:   []string{"ACCEPT local to 192.168.0.10:8050 p=1"},
		},
		{
			name:   "forwarded out of a matching interface",
			change: func(p *Packet) { p.Protocol = "tcp"; p.Destination = outsider; p.OutInterface = "eth0" },
			want:   []string{"ACCEPT to 203.0.113.9:8050 p=1"},
		},
		{
			name:   "forwarded with an unknown interface",
			change: func(p *Packet) { p.Protocol = "tcp"; p.Destination = outsider },
			want:   []string{"DROP to 203.0.113.9:8050 p=1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			tc.change(&p)
			outs, err := f.Trace(p)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, outcomeStrings(outs)); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTraceProbabilities(t *testing.T) {
	rules := "*nat\n:S - [0:0]\n-A PREROUTING -j S\n" +
		"-A S -m statistic --mode random --probability 0.33333333349 -p tcp -j DNAT --to-destination 10.0.0.1:80\n" +
		"-A S -m statistic --mode random --probability 0.50000000000 -p tcp -j DNAT --to-destination 10.0.0.2:80\n" +
		"-A S -p tcp -j DNAT --to-destination 10.0.0.3:80\nCOMMIT\n"
	f := loadRules(t, NewFake(), rules)
	outs, err := f.Trace(tcpTo(podIP, "10.96.0.1", 80))
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3 {
		t.Fatalf("outcomes: %v", outcomeStrings(outs))
	}
	for _, o := range outs {
		if math.Abs(o.Probability-1.0/3) > 1e-9 {
			t.Errorf("%s: probability %v, want 1/3", o, o.Probability)
		}
	}
}

func TestTraceIPv6(t *testing.T) {
	f := NewIPv6Fake()
	loadRules(t, f, "*nat\n-A PREROUTING -d fd00:96::1 -p udp --dport 53 -j DNAT --to-destination [fd00:244::5]:5353\nCOMMIT\n")
	outs, err := f.Trace(Packet{Protocol: "udp", Source: netip.MustParseAddr("fd00::1"), Destination: netip.MustParseAddr("fd00:96::1"), DestinationPort: 53})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ACCEPT to [fd00:244::5]:5353 (DNAT) p=1"}, outcomeStrings(outs)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
}

func TestTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules string
		p     Packet
		want  string
	}{
		{name: "nth mode", rules: "*nat\n-A PREROUTING -m statistic --mode nth --every 2 -j ACCEPT\nCOMMIT\n",
			p: tcpTo(podIP, "10.0.0.1", 80), want: "nth is not modelled"},
		{name: "DNAT range", rules: "*nat\n-A PREROUTING -j DNAT --to-destination 10.0.0.1-10.0.0.5\nCOMMIT\n",
			p: tcpTo(podIP, "10.0.0.1", 80), want: "ranges are not modelled"},
		{name: "IPv6 packet for IPv4", rules: "", p: Packet{Protocol: "tcp", Source: netip.MustParseAddr("::1"), Destination: netip.MustParseAddr("::2")}, want: "must be IPv4"},
		{name: "no protocol", rules: "", p: Packet{Source: podIP, Destination: podIP}, want: "unknown protocol"},
		{name: "bad state", rules: "", p: func() Packet { p := tcpTo(podIP, "10.0.0.1", 1); p.CTState = "FOO"; return p }(), want: "conntrack state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake()
			if tc.rules != "" {
				loadRules(t, f, tc.rules)
			}
			before := f.Dump()
			_, err := f.Trace(tc.p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if f.Dump() != before {
				t.Error("Trace changed the Fake")
			}
		})
	}
}

// TestTraceBranchLimit checks that a ruleset whose branches multiply
// without bound fails instead of running out of memory.
func TestTraceBranchLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("*nat\n")
	for i := 0; i < 20; i++ {
		b.WriteString("-A PREROUTING -m statistic --mode random --probability 0.5 -j MARK --xor-mark 0x1\n")
	}
	b.WriteString("COMMIT\n")
	f := loadRules(t, NewFake(), b.String())
	f.maxBranches = 1000
	if _, err := f.Trace(tcpTo(podIP, "10.0.0.1", 80)); err == nil || !strings.Contains(err.Error(), "more than 1000 branches") {
		t.Errorf("got %v, want a branch limit error", err)
	}
}
