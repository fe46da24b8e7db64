package iptablestest_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// TestTraceIPSetFake checks that a Fake given an ipset fake decides set
// matches from its members, with the packet as the rule sees it (after
// DNAT), and refuses rules and traces naming a missing set.
func TestTraceIPSetFake(t *testing.T) {
	ctx := context.Background()
	sets := ipsettest.NewFake()
	if err := sets.Restore(`create ALLOWED hash:net family inet hashsize 1024 maxelem 65536
add ALLOWED 203.0.113.0/24
add ALLOWED 10.244.0.0/16
create HAIRPIN hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add HAIRPIN 10.244.1.5,tcp:8080,10.244.1.5
`); err != nil {
		t.Fatal(err)
	}
	ipt := iptablestest.NewFake(iptablestest.WithIPSetFake(sets))
	// A service whose traffic is filtered by source, and masqueraded when
	// the endpoint chosen by DNAT is the client itself.
	rules := `*nat
-A PREROUTING -d 10.96.0.10 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080
-A POSTROUTING -m set --match-set HAIRPIN dst,dst,src -j MASQUERADE
COMMIT
*filter
-A FORWARD -m set --match-set ALLOWED src -j ACCEPT
-A FORWARD -m set ! --match-set ALLOWED src -j DROP
COMMIT
`
	if err := ipt.RestoreAll(ctx, []byte(rules), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	tcp := func(src, dst string) iptablestest.Packet {
		s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
		return iptablestest.Packet{Protocol: "tcp", Source: s.Addr(), SourcePort: s.Port(), Destination: d.Addr(), DestinationPort: d.Port(), InInterface: "eth0"}
	}
	for _, tc := range []struct {
		name string
		p    iptablestest.Packet
		want []string
	}{
		{"a source in the allowed network", tcp("203.0.113.7:40000", "10.96.0.10:80"), []string{"ACCEPT to 10.244.1.5:8080 (DNAT) p=1"}},
		{"a source outside it", tcp("198.18.0.1:40000", "10.96.0.10:80"), []string{"DROP to 10.244.1.5:8080 (DNAT) p=1"}},
		// HAIRPIN's dst,dst reads the destination after DNAT: the
		// endpoint's own address and port.
		{"the endpoint reaching itself", tcp("10.244.1.5:40000", "10.96.0.10:80"), []string{"ACCEPT to 10.244.1.5:8080 (DNAT) masquerade p=1"}},
		{"another pod", tcp("10.244.2.9:40000", "10.96.0.10:80"), []string{"ACCEPT to 10.244.1.5:8080 (DNAT) p=1"}},
	} {
		out, err := ipt.Trace(tc.p)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []string
		for _, o := range out {
			got = append(got, o.String())
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}

	// p.Sets, when given, still decides.
	p := tcp("198.18.0.1:40000", "10.96.0.10:80")
	p.Sets = map[string]bool{"ALLOWED": true}
	if out, err := ipt.Trace(p); err != nil || len(out) != 1 || out[0].Verdict != iptablestest.Accept {
		t.Errorf("with p.Sets saying ALLOWED matches: %v, %v; want one ACCEPT", out, err)
	}

	// A rule naming a set the ipset fake does not have is refused.
	err := ipt.RestoreAll(ctx, []byte("*filter\n-A INPUT -m set --match-set NOPE dst -j DROP\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters)
	var ierr *iptables.Error
	if !errors.As(err, &ierr) || !strings.Contains(ierr.Stderr, "Set NOPE doesn't exist") {
		t.Errorf("restoring a rule on a missing set: got %v, want an *iptables.Error saying the set does not exist", err)
	}
	// The rules hold references: the set cannot be destroyed under them,
	// as in the kernel, until they are gone.
	if err := sets.Destroy(ctx, "ALLOWED"); !errors.Is(err, ipset.ErrInUse) {
		t.Errorf("destroying a set that rules use: got %v, want ipset.ErrInUse", err)
	}
	if err := ipt.FlushChain(ctx, iptables.TableFilter, iptables.ChainForward); err != nil {
		t.Fatal(err)
	}
	if err := sets.Destroy(ctx, "ALLOWED"); err != nil {
		t.Errorf("destroying a set no rule uses any more: %v", err)
	}
	// A restore that replaces the table releases its rules' references.
	if err := ipt.RestoreAll(ctx, []byte("*nat\nCOMMIT\n"), iptables.FlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	if err := sets.Destroy(ctx, "HAIRPIN"); err != nil {
		t.Errorf("destroying a set after the table that used it was replaced: %v", err)
	}
}

// vanishingSets is an ipset view whose set is there when a rule is made
// and gone when a trace asks.
type vanishingSets struct{ gone bool }

func (v *vanishingSets) HasSet(string) bool { return !v.gone }
func (v *vanishingSets) MatchPacket(name string, _ v1.Protocol, _ []netip.AddrPort) (bool, error) {
	return false, fmt.Errorf("ipset %s: %w", name, ipset.ErrNotFound)
}
func (v *vanishingSets) Reference(string) error { return nil }
func (v *vanishingSets) Unreference(string)     {}

// TestTraceMissingSet: a trace that meets a rule on a set that does not
// exist fails, naming the rule and the set, as iptables refuses such a
// rule.
func TestTraceMissingSet(t *testing.T) {
	sets := &vanishingSets{}
	ipt := iptablestest.NewFake(iptablestest.WithIPSetFake(sets))
	if err := ipt.RestoreAll(context.Background(), []byte("*filter\n-A FORWARD -m set --match-set GONE src -j DROP\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	sets.gone = true
	_, err := ipt.Trace(iptablestest.Packet{Protocol: "tcp", Source: netip.MustParseAddr("192.0.2.1"), Destination: netip.MustParseAddr("192.0.2.2"), DestinationPort: 80})
	if err == nil || !strings.Contains(err.Error(), "--match-set GONE src: Set GONE doesn't exist") {
		t.Errorf("got %v, want an error naming the rule and the missing set", err)
	}
}
