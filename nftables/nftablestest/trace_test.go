package nftablestest_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables/nftablestest"
)

// table makes a Fake with table "t" and a nat prerouting base chain
// "pre" holding rules.
func table(t *testing.T, rules ...string) *knftables.Fake {
	t.Helper()
	fake := knftables.NewFake(knftables.IPv4Family, "t")
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "pre", Type: ptr.To(knftables.NATType), Hook: ptr.To(knftables.PreroutingHook), Priority: ptr.To(knftables.DNATPriority)})
	tx.Add(&knftables.Chain{Name: "ep"})
	tx.Add(&knftables.Rule{Chain: "ep", Rule: "meta l4proto tcp dnat to 10.0.0.5:80"})
	for _, r := range rules {
		tx.Add(&knftables.Rule{Chain: "pre", Rule: r})
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return fake
}

var pkt = nftablestest.Packet{Src: netip.MustParseAddr("10.1.0.1"), Dst: netip.MustParseAddr("10.96.0.1"), Protocol: v1.ProtocolTCP, DstPort: 80}

// TestTraceRefusesWhatItCannotRead: a rule the tracer does not know is an
// error, not a guess.
func TestTraceRefusesWhatItCannotRead(t *testing.T) {
	for _, rule := range []string{
		"ip daddr 10.96.0.1 counter goto ep",
		"oifname eth0 goto ep",
		"ip daddr 10.96.0.1 tcp dport 80 goto ep extra",
		"numgen random mod 2 vmap { 0 : goto ep }",
	} {
		tr := nftablestest.NewTracer(table(t, rule), knftables.IPv4Family, "t")
		if outs, err := tr.Trace(pkt); err == nil {
			t.Errorf("rule %q: traced to %v, want an error", rule, outs)
		}
	}
}

// TestTraceFollowsMatches checks matches that hold and fail.
func TestTraceFollowsMatches(t *testing.T) {
	for _, tc := range []struct {
		rule string
		dnat bool
	}{
		{"ip daddr 10.96.0.1 tcp dport 80 goto ep", true},
		{"ip daddr 10.96.0.2 tcp dport 80 goto ep", false},
		{"ip daddr 10.96.0.1 udp dport 80 goto ep", false},
		{"ip saddr != { 10.1.0.0/16 , 10.2.0.1 } goto ep", false},
		{"ip saddr != { 10.3.0.0/16 } goto ep", true},
		{"numgen random mod 1 vmap { 0 : goto ep }", true},
		// pkt came in through eth0.
		{`iifname "eth0" goto ep`, true},
		{"iifname eth0 goto ep", true},
		{`iifname != "eth0" goto ep`, false},
		{`iifname "eth" goto ep`, false},
		{`iifname "eth*" goto ep`, true},
		{`iifname != "eth*" goto ep`, false},
		{`iifname "veth*" goto ep`, false},
		{`iifname != "veth*" goto ep`, true},
	} {
		tr := nftablestest.NewTracer(table(t, tc.rule), knftables.IPv4Family, "t")
		in := pkt
		in.InInterface = "eth0"
		outs, err := tr.Trace(in)
		if err != nil {
			t.Fatalf("rule %q: %v", tc.rule, err)
		}
		if len(outs) != 1 || outs[0].DNAT.IsValid() != tc.dnat || outs[0].Verdict != nftablestest.Accept {
			t.Errorf("rule %q: outcomes %+v, want DNAT %v", tc.rule, outs, tc.dnat)
		}
	}
}

// TestTraceInterfaceOfNodePackets: a node's packet came in through no
// interface, which the kernel compares as "", so "!=" holds, until it
// comes back over loopback.
func TestTraceInterfaceOfNodePackets(t *testing.T) {
	for _, tc := range []struct {
		rule string
		dnat bool
	}{
		{`iifname "eth0" goto ep`, false},
		{`iifname != "eth0" goto ep`, true},
		{`iifname "eth*" goto ep`, false},
		{`iifname != "eth*" goto ep`, true},
	} {
		fake := table(t, tc.rule)
		tx := fake.NewTransaction()
		tx.Add(&knftables.Chain{Name: "out", Type: ptr.To(knftables.NATType), Hook: ptr.To(knftables.OutputHook), Priority: ptr.To(knftables.DNATPriority)})
		tx.Add(&knftables.Rule{Chain: "out", Rule: tc.rule})
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		in := pkt
		in.Output, in.InInterface = true, "eth0"
		outs, err := nftablestest.NewTracer(fake, knftables.IPv4Family, "t").Trace(in)
		if err != nil {
			t.Fatalf("rule %q: %v", tc.rule, err)
		}
		if len(outs) != 1 || outs[0].DNAT.IsValid() != tc.dnat {
			t.Errorf("rule %q from the node: outcomes %+v, want DNAT %v", tc.rule, outs, tc.dnat)
		}
	}
}

// TestCheckTransaction: what the kernel refuses and the Fake accepts.
func TestCheckTransaction(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, "t")
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "a"})
	tx.Add(&knftables.Chain{Name: "b"})
	tx.Add(&knftables.Rule{Chain: "b", Rule: "drop"})
	tx.Add(&knftables.Map{Name: "m", Type: "ipv4_addr : verdict"})
	tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}, Value: []string{"goto a"}})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		build func(tx *knftables.Transaction)
		err   string // "" for none
	}{
		{"element value changed with add", func(tx *knftables.Transaction) {
			tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}, Value: []string{"goto b"}})
		}, "refuses to change"},
		{"element deleted then added", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}})
			tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}, Value: []string{"goto b"}})
		}, ""},
		{"chain with rules deleted", func(tx *knftables.Transaction) { tx.Delete(&knftables.Chain{Name: "b"}) }, "holds rules"},
		{"chain flushed and deleted", func(tx *knftables.Transaction) {
			tx.Flush(&knftables.Chain{Name: "b"})
			tx.Delete(&knftables.Chain{Name: "b"})
		}, ""},
		{"referenced chain deleted", func(tx *knftables.Transaction) { tx.Delete(&knftables.Chain{Name: "a"}) }, `no chain "a"`},
		{"reference removed first", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}})
			tx.Delete(&knftables.Chain{Name: "a"})
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := fake.Dump()
			tx := fake.NewTransaction()
			tc.build(tx)
			err := nftablestest.CheckTransaction(fake, tx)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
			if fake.Dump() != before {
				t.Error("CheckTransaction changed the Fake")
			}
		})
	}
}

// dataMapTable makes a Fake like table's, with the data-map layout's
// objects: a data map "eps" from daddr . l4proto . dport . index to
// address . port holding elems, a set "pairs" of addresses pairs, and a
// nat postrouting chain "post" holding post.
func dataMapTable(t *testing.T, rules []string, elems [][2][]string, post ...string) *knftables.Fake {
	t.Helper()
	fake := table(t)
	tx := fake.NewTransaction()
	tx.Add(&knftables.Map{Name: "eps", TypeOf: "ip daddr . meta l4proto . tcp dport . numgen random mod 1 : ip daddr . tcp dport"})
	tx.Add(&knftables.Set{Name: "pairs", Type: "ipv4_addr . ipv4_addr"})
	tx.Add(&knftables.Element{Set: "pairs", Key: []string{"10.1.0.1", "10.1.0.1"}})
	for _, e := range elems {
		tx.Add(&knftables.Element{Map: "eps", Key: e[0], Value: e[1]})
	}
	for _, r := range rules {
		tx.Add(&knftables.Rule{Chain: "pre", Rule: r})
	}
	tx.Add(&knftables.Chain{Name: "post", Type: ptr.To(knftables.NATType), Hook: ptr.To(knftables.PostroutingHook), Priority: ptr.To(knftables.SNATPriority)})
	for _, r := range post {
		tx.Add(&knftables.Rule{Chain: "post", Rule: r})
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return fake
}

// TestTraceDataMap checks the data-map layout's constructs: a DNAT whose
// destination is looked up in a map by a concatenated key with a numgen
// index (one outcome per index; a missing element makes the rule not
// match, as in the kernel), a "tcp dport" that does not match another
// protocol, and a concatenated set match after "ct status dnat".
func TestTraceDataMap(t *testing.T) {
	key := func(i string) []string { return []string{"10.96.0.1", "tcp", "80", i} }
	two := [][2][]string{{key("0"), []string{"10.1.0.1", "8080"}}, {key("1"), []string{"10.0.0.7", "8081"}}}
	lookup := "dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @eps"
	hairpin := []string{"ct status dnat ip saddr . ip daddr @pairs masquerade"}
	// P is the outcome's probability: each numgen index is as likely.
	type out struct {
		DNAT string
		Masq bool
		P    float64
	}
	for _, tc := range []struct {
		name  string
		rules []string
		elems [][2][]string
		post  []string
		p     nftablestest.Packet
		want  []out
	}{
		{"both indexes", []string{lookup}, two, nil, pkt, []out{{DNAT: "10.1.0.1:8080", P: 0.5}, {DNAT: "10.0.0.7:8081", P: 0.5}}},
		{"hairpin: the client reached itself", []string{lookup}, two, hairpin, pkt, []out{{DNAT: "10.1.0.1:8080", Masq: true, P: 0.5}, {DNAT: "10.0.0.7:8081", P: 0.5}}},
		{"missing index falls through", []string{lookup, "goto ep"}, two[:1], nil, pkt, []out{{DNAT: "10.1.0.1:8080", P: 0.5}, {DNAT: "10.0.0.5:80", P: 0.5}}},
		{"numgen verdict map: each index as likely", []string{"numgen random mod 4 vmap { 0 : goto ep , 1 : goto ep , 2 : goto ep , 3 : drop }"}, nil, nil, pkt,
			[]out{{DNAT: "10.0.0.5:80", P: 0.25}, {DNAT: "10.0.0.5:80", P: 0.25}, {DNAT: "10.0.0.5:80", P: 0.25}, {P: 0.25}}},
		{"kube-proxy's DNAT by a numgen map of endpoints", []string{"meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.1.0.1 . 8080 , 1 : 10.0.0.7 . 8081 }"}, nil, nil, pkt,
			[]out{{DNAT: "10.1.0.1:8080", P: 0.5}, {DNAT: "10.0.0.7:8081", P: 0.5}}},
		{"kube-proxy's DNAT as nft lists it", []string{"meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.1.0.1 . 8080 , 1 : 10.0.0.7 . 8081 }"}, nil, nil, pkt,
			[]out{{DNAT: "10.1.0.1:8080", P: 0.5}, {DNAT: "10.0.0.7:8081", P: 0.5}}},
		{"kube-proxy's masquerade: mark and M != 0", []string{"mark set mark or 0x4000", "meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.1.0.1 . 8080 }"}, nil,
			[]string{"mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random"}, pkt, []out{{DNAT: "10.1.0.1:8080", Masq: true, P: 1}}},
		{"kube-proxy's masquerade: no mark, no masquerade", []string{"meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.1.0.1 . 8080 }"}, nil,
			[]string{"mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random"}, pkt, []out{{DNAT: "10.1.0.1:8080", P: 1}}},
		{"tcp dport does not match UDP", []string{lookup}, two, nil,
			nftablestest.Packet{Src: pkt.Src, Dst: pkt.Dst, Protocol: v1.ProtocolUDP, DstPort: 80}, []out{{P: 1}}},
		{"no DNAT, no hairpin", nil, nil, []string{"ct status dnat ip saddr . ip daddr @pairs masquerade", "ip saddr . ip saddr @pairs masquerade"},
			nftablestest.Packet{Src: pkt.Src, Dst: pkt.Src, Protocol: v1.ProtocolTCP, DstPort: 80, Output: true}, []out{{Masq: true, P: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := nftablestest.NewTracer(dataMapTable(t, tc.rules, tc.elems, tc.post...), knftables.IPv4Family, "t")
			outs, err := tr.Trace(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			var got []out
			for _, o := range outs {
				g := out{Masq: o.Masquerade, P: o.Probability}
				if o.DNAT.IsValid() {
					g.DNAT = o.DNAT.String()
				}
				got = append(got, g)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTraceDataMapRefusesWhatItCannotRead: unknown parts of a key, a
// value that is not an address and a port, and a concatenation compared
// with something other than a set are errors, not guesses.
func TestTraceDataMapRefusesWhatItCannotRead(t *testing.T) {
	for _, tc := range []struct {
		rule  string
		value []string
	}{
		{"dnat ip to ip daddr . meta mark . tcp dport . numgen random mod 1 map @eps", []string{"10.1.0.1", "8080"}},
		{"dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 1 map @eps", []string{"10.1.0.1"}},
		{"dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 1 map @eps", []string{"fd00::1", "8080"}},
		{"dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 1 map @eps", []string{"10.1.0.1", "0"}},
		{"dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 1 map @eps extra", []string{"10.1.0.1", "8080"}},
		{"ip daddr . meta l4proto . th dport 10.96.0.1", []string{"10.1.0.1", "8080"}},
		{"ip saddr . ip daddr . th dport @pairs goto ep", []string{"10.1.0.1", "8080"}},
		{"dnat ip addr . port to numgen random mod 2 map { 0 : 10.1.0.1 . 8080 }", []string{"10.1.0.1", "8080"}},
		{"dnat ip addr . port to numgen random mod 1 map { 0 : fd00::1 . 8080 }", []string{"10.1.0.1", "8080"}},
		{"dnat ip addr . port to numgen random mod 1 map { 0 : 10.1.0.1 8080 }", []string{"10.1.0.1", "8080"}},
		{"mark and 0x4000 < 0 accept", []string{"10.1.0.1", "8080"}},
	} {
		fake := dataMapTable(t, []string{tc.rule}, [][2][]string{{{"10.96.0.1", "tcp", "80", "0"}, tc.value}})
		tr := nftablestest.NewTracer(fake, knftables.IPv4Family, "t")
		if outs, err := tr.Trace(pkt); err == nil {
			t.Errorf("rule %q with value %q: traced to %v, want an error", tc.rule, tc.value, outs)
		}
	}
}

// TestTraceLocalDelivery: a node's packet to one of its own addresses
// comes back in over loopback, through the prerouting and input hooks'
// filter chains but no nat chain (the kernel set the connection's NAT up
// on the way out), as the kernel does; one to another host leaves the
// node after postrouting. A packet from outside is unchanged.
func TestTraceLocalDelivery(t *testing.T) {
	fake := table(t, "ip daddr 10.1.0.1 tcp dport 8080 goto ep")
	tx := fake.NewTransaction()
	for _, c := range []struct {
		name string
		typ  knftables.BaseChainType
		hook knftables.BaseChainHook
		prio knftables.BaseChainPriority
		rule string
	}{
		{"out", knftables.NATType, knftables.OutputHook, knftables.DNATPriority, "ip daddr 10.96.0.1 tcp dport 80 dnat to 10.1.0.1:8080"},
		{"post", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, "ip daddr 10.1.0.1 tcp dport 82 masquerade"},
		{"filter-pre", knftables.FilterType, knftables.PreroutingHook, knftables.FilterPriority, "ip daddr 10.1.0.1 tcp dport 83 drop"},
		{"in", knftables.FilterType, knftables.InputHook, knftables.FilterPriority, "ip daddr 10.1.0.1 tcp dport 81 reject"},
		{"in-nat", knftables.NATType, knftables.InputHook, knftables.SNATPriority, "tcp dport 81 accept"},
	} {
		tx.Add(&knftables.Chain{Name: c.name, Type: ptr.To(c.typ), Hook: ptr.To(c.hook), Priority: ptr.To(c.prio)})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: c.rule})
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, "t", netip.MustParseAddr("10.1.0.1"))
	node := func(dst string, port int) nftablestest.Packet {
		return nftablestest.Packet{Src: netip.MustParseAddr("10.1.0.1"), Dst: netip.MustParseAddr(dst), Protocol: v1.ProtocolTCP, DstPort: port, Output: true}
	}
	for _, tc := range []struct {
		name string
		p    nftablestest.Packet
		want nftablestest.Outcome
	}{
		{"to a local port that input rejects", node("10.1.0.1", 81),
			nftablestest.Outcome{Verdict: nftablestest.Reject, Chains: []string{"out", "post", "filter-pre", "in"}, Probability: 1}},
		{"to a local port that prerouting's filter drops", node("10.1.0.1", 83),
			nftablestest.Outcome{Verdict: nftablestest.Drop, Chains: []string{"out", "post", "filter-pre"}, Probability: 1}},
		{"DNATed to a local address: no second DNAT in prerouting", node("10.96.0.1", 80),
			nftablestest.Outcome{Verdict: nftablestest.Accept, DNAT: netip.MustParseAddrPort("10.1.0.1:8080"), Chains: []string{"out", "post", "filter-pre", "in"}, Probability: 1}},
		{"masqueraded on the way out, delivered locally", node("10.1.0.1", 82),
			nftablestest.Outcome{Verdict: nftablestest.Accept, Masquerade: true, Chains: []string{"out", "post", "filter-pre", "in"}, Probability: 1}},
		{"to another host: leaves after postrouting", node("10.2.0.9", 81),
			nftablestest.Outcome{Verdict: nftablestest.Accept, Chains: []string{"out", "post"}, Probability: 1}},
		{"from outside to a local port that input rejects", nftablestest.Packet{Src: netip.MustParseAddr("10.2.0.9"), Dst: netip.MustParseAddr("10.1.0.1"), Protocol: v1.ProtocolTCP, DstPort: 81},
			nftablestest.Outcome{Verdict: nftablestest.Reject, Chains: []string{"pre", "filter-pre", "in"}, Probability: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := tr.Trace(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]nftablestest.Outcome{tc.want}, outs, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
}
