package ipset_test

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipset"
)

// kernelIPSet returns an ipset Interface bound to a new throwaway namespace,
// and a referenceFunc that references a set with an iptables rule there.
func kernelIPSet(t *testing.T) (*ipset.Netlink, *kerneltest.NS, referenceFunc) {
	t.Helper()
	kerneltest.Require(t, "iptables", "ipset")
	ns := kerneltest.NewNS(t)
	n, err := ipset.New(ipset.WithNetNSPath("/run/netns/" + ns.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ref := func(t *testing.T, name string) {
		ns.MustExec(t, "iptables", "-w", "-A", "INPUT", "-m", "set", "--match-set", name, "src", "-j", "ACCEPT")
	}
	return n, ns, ref
}

func TestKernelBehaviour(t *testing.T) {
	n, _, ref := kernelIPSet(t)
	runBehaviour(t, n, ref)
}

// ipsetList runs `ipset list NAME` in ns and returns its header line and
// its members, parsed as entries of type typ.
func ipsetList(t *testing.T, ns *kerneltest.NS, name string, typ ipset.Type) (string, []ipset.Entry) {
	t.Helper()
	out := ns.MustExec(t, "ipset", "list", name)
	head, members, ok := strings.Cut(out, "Members:\n")
	if !ok {
		t.Fatalf("ipset list %s: no members section:\n%s", name, out)
	}
	header := regexp.MustCompile(`(?m)^Header: (.*)$`).FindStringSubmatch(head)
	if header == nil {
		t.Fatalf("ipset list %s: no header:\n%s", name, out)
	}
	var entries []ipset.Entry
	for _, line := range strings.Split(strings.TrimSpace(members), "\n") {
		if line == "" {
			continue
		}
		e, err := ipset.ParseEntry(typ, line)
		if err != nil {
			t.Fatalf("ipset list %s: %v", name, err)
		}
		entries = append(entries, e)
	}
	return header[1], entries
}

var sortEntries = cmpopts.SortSlices(func(a, b ipset.Entry) bool { return a.String() < b.String() })

func TestKernelRoundTrip(t *testing.T) {
	n, ns, _ := kernelIPSet(t)
	ctx := context.Background()
	c4, c6 := netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("2001:db8::9")
	for _, tc := range []struct {
		set     ipset.Set
		header  string
		entries []ipset.Entry
		absent  ipset.Entry
	}{{
		set:     ipset.Set{Name: "ip4", Type: ipset.HashIP, HashSize: 300, MaxElem: 5000},
		header:  "family inet hashsize 512 maxelem 5000",
		entries: []ipset.Entry{ipset.IPEntry(a4), ipset.IPEntry(b4)},
		absent:  ipset.IPEntry(c4),
	}, {
		set:     ipset.Set{Name: "ip6", Type: ipset.HashIP, Family: ipset.FamilyIPv6, HashSize: 10},
		header:  "family inet6 hashsize 64 maxelem 65536",
		entries: []ipset.Entry{ipset.IPEntry(a6), ipset.IPEntry(b6)},
		absent:  ipset.IPEntry(c6),
	}, {
		set:    ipset.Set{Name: "ipport4", Type: ipset.HashIPPort},
		header: "family inet hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{
			ipset.IPPortEntry(a4, tcp, 80), ipset.IPPortEntry(a4, v1.ProtocolUDP, 80),
			ipset.IPPortEntry(a4, v1.ProtocolSCTP, 80), ipset.IPPortEntry(b4, tcp, 0), ipset.IPPortEntry(b4, tcp, 65535),
		},
		absent: ipset.IPPortEntry(a4, tcp, 81),
	}, {
		set:     ipset.Set{Name: "ipport6", Type: ipset.HashIPPort, Family: ipset.FamilyIPv6},
		header:  "family inet6 hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{ipset.IPPortEntry(a6, tcp, 443), ipset.IPPortEntry(a6, v1.ProtocolUDP, 53)},
		absent:  ipset.IPPortEntry(a6, v1.ProtocolSCTP, 443),
	}, {
		set:     ipset.Set{Name: "ipportip4", Type: ipset.HashIPPortIP},
		header:  "family inet hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{ipset.IPPortIPEntry(a4, tcp, 80, a4), ipset.IPPortIPEntry(a4, tcp, 80, b4)},
		absent:  ipset.IPPortIPEntry(b4, tcp, 80, a4),
	}, {
		set:     ipset.Set{Name: "ipportip6", Type: ipset.HashIPPortIP, Family: ipset.FamilyIPv6},
		header:  "family inet6 hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{ipset.IPPortIPEntry(a6, v1.ProtocolUDP, 53, b6)},
		absent:  ipset.IPPortIPEntry(a6, v1.ProtocolUDP, 53, a6),
	}, {
		set:    ipset.Set{Name: "ipportnet4", Type: ipset.HashIPPortNet},
		header: "family inet hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{
			ipset.IPPortNetEntry(a4, tcp, 80, n4), ipset.IPPortNetEntry(a4, tcp, 80, netip.MustParsePrefix("10.0.0.2/32")),
			ipset.IPPortNetEntry(b4, v1.ProtocolSCTP, 9, netip.MustParsePrefix("192.168.0.0/24")),
		},
		absent: ipset.IPPortNetEntry(a4, tcp, 80, netip.MustParsePrefix("10.1.0.0/17")),
	}, {
		set:     ipset.Set{Name: "ipportnet6", Type: ipset.HashIPPortNet, Family: ipset.FamilyIPv6},
		header:  "family inet6 hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{ipset.IPPortNetEntry(a6, tcp, 80, n6), ipset.IPPortNetEntry(a6, tcp, 80, netip.MustParsePrefix("fd00::2/128"))},
		absent:  ipset.IPPortNetEntry(b6, tcp, 80, n6),
	}, {
		set:     ipset.Set{Name: "net4", Type: ipset.HashNet},
		header:  "family inet hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{ipset.NetEntry(n4), ipset.NetEntry(netip.MustParsePrefix("10.0.0.7/32")), ipset.NetEntry(netip.MustParsePrefix("128.0.0.0/1"))},
		absent:  ipset.NetEntry(netip.MustParsePrefix("10.1.0.0/24")),
	}, {
		set:     ipset.Set{Name: "net6", Type: ipset.HashNet, Family: ipset.FamilyIPv6},
		header:  "family inet6 hashsize 1024 maxelem 65536",
		entries: []ipset.Entry{ipset.NetEntry(n6), ipset.NetEntry(netip.MustParsePrefix("fd00::7/128"))},
		absent:  ipset.NetEntry(netip.MustParsePrefix("fd00:1::/65")),
	}, {
		set:     ipset.Set{Name: "ports", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 32767},
		header:  "range 30000-32767",
		entries: []ipset.Entry{ipset.PortEntry(30000), ipset.PortEntry(30080), ipset.PortEntry(32767)},
		absent:  ipset.PortEntry(30081),
	}, {
		set:     ipset.Set{Name: "allports", Type: ipset.BitmapPort},
		header:  "range 0-65535",
		entries: []ipset.Entry{ipset.PortEntry(0), ipset.PortEntry(65535)},
		absent:  ipset.PortEntry(1),
	}} {
		t.Run(tc.set.Name, func(t *testing.T) {
			if err := n.Create(ctx, tc.set); err != nil {
				t.Fatal(err)
			}
			for _, e := range tc.entries {
				if err := n.Add(ctx, tc.set.Name, e); err != nil {
					t.Fatal(err)
				}
			}
			got, err := n.ListEntries(ctx, tc.set.Name)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.entries, got, sortEntries, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
				t.Errorf("ListEntries (-want +got):\n%s", diff)
			}
			header, listed := ipsetList(t, ns, tc.set.Name, tc.set.Type)
			if !strings.HasPrefix(header, tc.header) {
				t.Errorf("ipset list header %q, want %q", header, tc.header)
			}
			if diff := cmp.Diff(tc.entries, listed, sortEntries, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
				t.Errorf("members the ipset binary lists (-want +got):\n%s", diff)
			}
			for _, e := range tc.entries {
				if ok, err := n.Test(ctx, tc.set.Name, e); !ok || err != nil {
					t.Errorf("Test(%s) = %v, %v; want true", e, ok, err)
				}
			}
			if ok, err := n.Test(ctx, tc.set.Name, tc.absent); ok || err != nil {
				t.Errorf("Test(%s) = %v, %v; want false", tc.absent, ok, err)
			}
			sets, err := n.ListSets(ctx)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(sets, func(s ipset.SetInfo) bool { return s.Name == tc.set.Name })
			if i < 0 {
				t.Fatalf("ListSets does not show %s", tc.set.Name)
			}
			want := ipset.SetInfo{Set: tc.set.WithDefaults(), NumEntries: len(tc.entries)}
			if diff := cmp.Diff(want, sets[i]); diff != "" {
				t.Errorf("ListSets (-want +got):\n%s", diff)
			}
			// What the ipset binary adds, the netlink side reads back.
			ns.MustExec(t, "ipset", "add", tc.set.Name, tc.absent.String())
			if ok, err := n.Test(ctx, tc.set.Name, tc.absent); !ok || err != nil {
				t.Errorf("after `ipset add %s`: Test = %v, %v; want true", tc.absent, ok, err)
			}
			for _, e := range append(tc.entries, tc.absent) {
				if err := n.Del(ctx, tc.set.Name, e); err != nil {
					t.Errorf("Del(%s): %v", e, err)
				}
			}
			if _, listed := ipsetList(t, ns, tc.set.Name, tc.set.Type); len(listed) != 0 {
				t.Errorf("after deleting every member, ipset list shows %v", listed)
			}
		})
	}
}

func TestKernelLargeSet(t *testing.T) {
	n, ns, _ := kernelIPSet(t)
	ctx := context.Background()
	set := ipset.Set{Name: "big", Type: ipset.HashIPPort}
	if err := n.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	if err := n.Create(ctx, ipset.Set{Name: "small", Type: ipset.HashIP}); err != nil {
		t.Fatal(err)
	}
	const size = 6000
	for i := range size {
		e := ipset.IPPortEntry(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), tcp, 80)
		if err := n.Add(ctx, set.Name, e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := n.ListEntries(ctx, set.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != size {
		t.Errorf("ListEntries returned %d entries, want %d", len(got), size)
	}
	// The kernel splits a set this large over several netlink messages;
	// ListSets must still report each set once, with its header.
	sets, err := n.ListSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sets {
		names = append(names, s.Name)
		if s.Name == "big" && (s.NumEntries != size || s.Type != ipset.HashIPPort || s.Family != ipset.FamilyIPv4) {
			t.Errorf("big listed as %+v", s)
		}
	}
	if diff := cmp.Diff([]string{"big", "small"}, names); diff != "" {
		t.Errorf("ListSets names (-want +got):\n%s", diff)
	}
	out := ns.MustExec(t, "ipset", "list", "-terse", "big")
	if !strings.Contains(out, fmt.Sprintf("Number of entries: %d", size)) {
		t.Errorf("ipset list -terse:\n%s", out)
	}
}

func TestKernelVersion(t *testing.T) {
	n, ns, _ := kernelIPSet(t)
	v, err := n.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := ns.MustExec(t, "ipset", "version")
	m := regexp.MustCompile(`protocol version: (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("ipset version: %q", out)
	}
	if fmt.Sprint(v.Protocol) != m[1] || v.MinProtocol == 0 || v.MinProtocol > v.Protocol {
		t.Errorf("Version() = %+v, ipset binary says protocol %s", v, m[1])
	}
}
