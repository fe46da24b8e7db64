package nftablestest_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	nftablestest "github.com/proxykit/proxykit/nftables/testing"
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
		"iifname eth0 goto ep",
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
	} {
		tr := nftablestest.NewTracer(table(t, tc.rule), knftables.IPv4Family, "t")
		outs, err := tr.Trace(pkt)
		if err != nil {
			t.Fatalf("rule %q: %v", tc.rule, err)
		}
		if len(outs) != 1 || outs[0].DNAT.IsValid() != tc.dnat || outs[0].Verdict != nftablestest.Accept {
			t.Errorf("rule %q: outcomes %+v, want DNAT %v", tc.rule, outs, tc.dnat)
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
