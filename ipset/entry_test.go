package ipset_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
)

var (
	a4  = netip.MustParseAddr("10.0.0.1")
	b4  = netip.MustParseAddr("10.0.0.2")
	a6  = netip.MustParseAddr("fd00::1")
	b6  = netip.MustParseAddr("fd00::2")
	n4  = netip.MustParsePrefix("10.1.0.0/16")
	n6  = netip.MustParsePrefix("fd00:1::/64")
	tcp = v1.ProtocolTCP
)

func TestEntryStringAndParse(t *testing.T) {
	for _, tc := range []struct {
		entry ipset.Entry
		text  string
	}{
		{ipset.IPEntry(a4), "10.0.0.1"},
		{ipset.IPEntry(a6), "fd00::1"},
		{ipset.IPPortEntry(a4, tcp, 80), "10.0.0.1,tcp:80"},
		{ipset.IPPortEntry(a6, v1.ProtocolUDP, 53), "fd00::1,udp:53"},
		{ipset.IPPortEntry(a4, v1.ProtocolSCTP, 0), "10.0.0.1,sctp:0"},
		{ipset.IPPortIPEntry(a4, tcp, 443, b4), "10.0.0.1,tcp:443,10.0.0.2"},
		{ipset.IPPortIPEntry(a6, tcp, 443, b6), "fd00::1,tcp:443,fd00::2"},
		{ipset.IPPortNetEntry(a4, tcp, 65535, n4), "10.0.0.1,tcp:65535,10.1.0.0/16"},
		{ipset.IPPortNetEntry(a6, tcp, 8080, n6), "fd00::1,tcp:8080,fd00:1::/64"},
		{ipset.NetEntry(n4), "10.1.0.0/16"},
		{ipset.NetEntry(netip.MustParsePrefix("10.0.0.1/32")), "10.0.0.1/32"},
		{ipset.NetEntry(n6), "fd00:1::/64"},
		{ipset.PortEntry(30080), "30080"},
	} {
		t.Run(tc.text, func(t *testing.T) {
			if err := tc.entry.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := tc.entry.String(); got != tc.text {
				t.Errorf("String() = %q, want %q", got, tc.text)
			}
			got, err := ipset.ParseEntry(tc.entry.Type, tc.text)
			if err != nil {
				t.Fatalf("ParseEntry: %v", err)
			}
			if diff := cmp.Diff(tc.entry, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("ParseEntry(String()) differs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseEntryCanonicalises(t *testing.T) {
	for _, tc := range []struct {
		typ  ipset.Type
		in   string
		want string
	}{
		// `ipset list` prints host networks without a length.
		{ipset.HashNet, "10.0.0.7", "10.0.0.7/32"},
		{ipset.HashNet, "fd00::7", "fd00::7/128"},
		{ipset.HashIPPortNet, "10.0.0.1,tcp:80,10.2.3.4", "10.0.0.1,tcp:80,10.2.3.4/32"},
		// The kernel masks networks; so does the parser.
		{ipset.HashNet, "10.1.2.3/16", "10.1.0.0/16"},
		{ipset.HashIPPortNet, "10.0.0.1,udp:53,10.9.9.9/8", "10.0.0.1,udp:53,10.0.0.0/8"},
	} {
		e, err := ipset.ParseEntry(tc.typ, tc.in)
		if err != nil {
			t.Errorf("ParseEntry(%s, %q): %v", tc.typ, tc.in, err)
			continue
		}
		if got := e.String(); got != tc.want {
			t.Errorf("ParseEntry(%s, %q) = %q, want %q", tc.typ, tc.in, got, tc.want)
		}
	}
}

func TestParseEntryRejects(t *testing.T) {
	for _, tc := range []struct {
		typ ipset.Type
		in  string
	}{
		{ipset.HashIP, ""},
		{ipset.HashIP, "10.0.0.256"},
		{ipset.HashIP, "10.0.0.1,tcp:80"},
		{ipset.HashIP, "fe80::1%eth0"},
		{ipset.HashIP, "::ffff:10.0.0.1"},
		{ipset.HashIPPort, "10.0.0.1"},
		{ipset.HashIPPort, "10.0.0.1,80"},
		{ipset.HashIPPort, "10.0.0.1,icmp:0"},
		{ipset.HashIPPort, "10.0.0.1,TCP:80"},
		{ipset.HashIPPort, "10.0.0.1,tcp:65536"},
		{ipset.HashIPPort, "10.0.0.1,tcp:-1"},
		{ipset.HashIPPort, "10.0.0.1,tcp:http"},
		{ipset.HashIPPortIP, "10.0.0.1,tcp:80"},
		{ipset.HashIPPortIP, "10.0.0.1,tcp:80,fd00::1"},
		{ipset.HashIPPortIP, "10.0.0.1,tcp:80,10.0.0.0/8"},
		{ipset.HashIPPortNet, "10.0.0.1,tcp:80,fd00::/8"},
		{ipset.HashIPPortNet, "10.0.0.1,tcp:80,10.0.0.0/0"},
		{ipset.HashNet, "0.0.0.0/0"},
		{ipset.HashNet, "10.0.0.0/33"},
		{ipset.HashNet, "10.0.0.0,tcp:80"},
		{ipset.BitmapPort, "tcp:80"},
		{ipset.BitmapPort, "70000"},
		{ipset.Type("hash:mac"), "00:11:22:33:44:55"},
	} {
		e, err := ipset.ParseEntry(tc.typ, tc.in)
		if err == nil {
			t.Errorf("ParseEntry(%s, %q) = %v, want an error", tc.typ, tc.in, e)
			continue
		}
		if !errors.Is(err, ipset.ErrInvalid) {
			t.Errorf("ParseEntry(%s, %q) error %v does not wrap ErrInvalid", tc.typ, tc.in, err)
		}
	}
}

func TestEntryValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		entry ipset.Entry
	}{
		{"no type", ipset.Entry{Addr: a4}},
		{"hash:ip without address", ipset.Entry{Type: ipset.HashIP}},
		{"hash:ip with port", ipset.Entry{Type: ipset.HashIP, Addr: a4, Port: 80}},
		{"hash:ip with protocol", ipset.Entry{Type: ipset.HashIP, Addr: a4, Protocol: tcp}},
		{"hash:ip,port without protocol", ipset.Entry{Type: ipset.HashIPPort, Addr: a4, Port: 80}},
		{"hash:ip,port lower-case protocol", ipset.Entry{Type: ipset.HashIPPort, Addr: a4, Protocol: "tcp", Port: 80}},
		{"hash:ip,port with second address", ipset.Entry{Type: ipset.HashIPPort, Addr: a4, Protocol: tcp, Port: 80, Addr2: b4}},
		{"hash:ip,port,ip mixed families", ipset.IPPortIPEntry(a4, tcp, 80, b6)},
		{"hash:ip,port,net mixed families", ipset.IPPortNetEntry(a6, tcp, 80, n4)},
		{"hash:ip,port,net without net", ipset.Entry{Type: ipset.HashIPPortNet, Addr: a4, Protocol: tcp, Port: 80}},
		{"hash:net unmasked", ipset.Entry{Type: ipset.HashNet, Net: netip.MustParsePrefix("10.1.2.3/16")}},
		{"hash:net zero length", ipset.NetEntry(netip.MustParsePrefix("0.0.0.0/0"))},
		{"hash:net with address", ipset.Entry{Type: ipset.HashNet, Net: n4, Addr: a4}},
		{"bitmap:port with protocol", ipset.Entry{Type: ipset.BitmapPort, Port: 80, Protocol: tcp}},
		{"bitmap:port with address", ipset.Entry{Type: ipset.BitmapPort, Port: 80, Addr: a4}},
		{"IPv4-mapped", ipset.IPEntry(netip.MustParseAddr("::ffff:10.0.0.1"))},
		{"zone", ipset.IPEntry(netip.MustParseAddr("fe80::1%eth0"))},
	} {
		err := tc.entry.Validate()
		if !errors.Is(err, ipset.ErrInvalid) {
			t.Errorf("%s: Validate(%+v) = %v, want ErrInvalid", tc.name, tc.entry, err)
		}
	}
}

func TestSetValidate(t *testing.T) {
	ok := []ipset.Set{
		{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort},
		{Name: "x", Type: ipset.HashNet, Family: ipset.FamilyIPv6, HashSize: 100, MaxElem: 10},
		{Name: "KUBE-NODE-PORT-TCP", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 32767},
		{Name: "0123456789012345678901234567890", Type: ipset.HashIP},
	}
	for _, s := range ok {
		if err := s.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", s, err)
		}
	}
	bad := []ipset.Set{
		{Name: "", Type: ipset.HashIP},
		{Name: "01234567890123456789012345678901", Type: ipset.HashIP},
		{Name: "has space", Type: ipset.HashIP},
		{Name: "x", Type: "hash:mac"},
		{Name: "x", Type: ipset.HashIP, Family: "ipv4"},
		{Name: "x", Type: ipset.HashIP, PortTo: 10},
		{Name: "x", Type: ipset.BitmapPort, Family: ipset.FamilyIPv4},
		{Name: "x", Type: ipset.BitmapPort, HashSize: 64},
		{Name: "x", Type: ipset.BitmapPort, PortFrom: 10, PortTo: 9},
	}
	for _, s := range bad {
		if err := s.Validate(); !errors.Is(err, ipset.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalid", s, err)
		}
	}
}

func TestSetDefaultsAndString(t *testing.T) {
	for _, tc := range []struct {
		set  ipset.Set
		want string
	}{
		{ipset.Set{Name: "a", Type: ipset.HashIP}, "a hash:ip family inet hashsize 1024 maxelem 65536"},
		{ipset.Set{Name: "a", Type: ipset.HashIP, HashSize: 1}, "a hash:ip family inet hashsize 64 maxelem 65536"},
		{ipset.Set{Name: "a", Type: ipset.HashIP, HashSize: 1000}, "a hash:ip family inet hashsize 1024 maxelem 65536"},
		{ipset.Set{Name: "a", Type: ipset.HashIP, HashSize: 1025}, "a hash:ip family inet hashsize 2048 maxelem 65536"},
		{ipset.Set{Name: "a", Type: ipset.HashNet, Family: ipset.FamilyIPv6, MaxElem: 7}, "a hash:net family inet6 hashsize 1024 maxelem 7"},
		{ipset.Set{Name: "p", Type: ipset.BitmapPort}, "p bitmap:port range 0-65535"},
		{ipset.Set{Name: "p", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 32767}, "p bitmap:port range 30000-32767"},
	} {
		if got := tc.set.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.set, got, tc.want)
		}
	}
}

func TestReplacesAndSwappable(t *testing.T) {
	base := ipset.Set{Name: "a", Type: ipset.HashIPPort}
	for _, tc := range []struct {
		name                string
		want, have          ipset.Set
		replaces, swappable bool
	}{
		{"same", base, base, false, true},
		{"defaults spelled out", base, ipset.Set{Name: "b", Type: ipset.HashIPPort, Family: ipset.FamilyIPv4, HashSize: 1024, MaxElem: 65536}, false, true},
		{"hash grew in the kernel", base, ipset.Set{Type: ipset.HashIPPort, HashSize: 4096}, false, true},
		{"larger hash size wanted", ipset.Set{Type: ipset.HashIPPort, HashSize: 4096}, base, true, true},
		{"other maximum", ipset.Set{Type: ipset.HashIPPort, MaxElem: 10}, base, true, true},
		{"other family", ipset.Set{Type: ipset.HashIPPort, Family: ipset.FamilyIPv6}, base, true, false},
		{"other type", ipset.Set{Type: ipset.HashIP}, base, true, false},
		{"hash:net and hash:ip differ in kind", ipset.Set{Type: ipset.HashNet}, ipset.Set{Type: ipset.HashIP}, true, false},
		{"port range", ipset.Set{Type: ipset.BitmapPort, PortFrom: 1, PortTo: 2}, ipset.Set{Type: ipset.BitmapPort}, true, true},
	} {
		if got := tc.want.Replaces(tc.have); got != tc.replaces {
			t.Errorf("%s: Replaces = %v, want %v", tc.name, got, tc.replaces)
		}
		if got := ipset.Swappable(tc.want, tc.have); got != tc.swappable {
			t.Errorf("%s: Swappable = %v, want %v", tc.name, got, tc.swappable)
		}
	}
}

func TestSetCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   ipset.Set
		entry ipset.Entry
		ok    bool
	}{
		{"fits", ipset.Set{Name: "s", Type: ipset.HashIP}, ipset.IPEntry(a4), true},
		{"IPv6 in default family", ipset.Set{Name: "s", Type: ipset.HashIP}, ipset.IPEntry(a6), false},
		{"IPv6 in inet6", ipset.Set{Name: "s", Type: ipset.HashIP, Family: ipset.FamilyIPv6}, ipset.IPEntry(a6), true},
		{"other type", ipset.Set{Name: "s", Type: ipset.HashNet}, ipset.IPEntry(a4), false},
		{"port in range", ipset.Set{Name: "s", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 30010}, ipset.PortEntry(30010), true},
		{"port out of range", ipset.Set{Name: "s", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 30010}, ipset.PortEntry(30011), false},
		{"malformed", ipset.Set{Name: "s", Type: ipset.HashIP}, ipset.Entry{Type: ipset.HashIP}, false},
	} {
		err := tc.set.Check(tc.entry)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ipset.ErrInvalid)) {
			t.Errorf("%s: Check = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestTypes(t *testing.T) {
	want := []ipset.Type{ipset.HashIP, ipset.HashIPPort, ipset.HashIPPortIP, ipset.HashIPPortNet, ipset.HashNet, ipset.BitmapPort}
	got := ipset.Types()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Types() (-want +got):\n%s", diff)
	}
	got[0] = "changed"
	if ipset.Types()[0] != ipset.HashIP {
		t.Error("Types() shares its slice with the caller")
	}
	for _, typ := range want {
		if !typ.Valid() || typ.IsHash() == (typ == ipset.BitmapPort) {
			t.Errorf("%s: Valid=%v IsHash=%v", typ, typ.Valid(), typ.IsHash())
		}
	}
	if ipset.Type("hash:mac").Valid() {
		t.Error("hash:mac is reported valid")
	}
}

func TestEntryCompare(t *testing.T) {
	ordered := []ipset.Entry{
		ipset.IPEntry(netip.MustParseAddr("10.0.0.9")),
		ipset.IPEntry(netip.MustParseAddr("10.0.0.10")),
		ipset.IPEntry(a6),
		ipset.IPPortEntry(a4, tcp, 80),
		ipset.IPPortEntry(a4, tcp, 443),
		ipset.IPPortEntry(a4, v1.ProtocolUDP, 53),
		ipset.IPPortIPEntry(a4, tcp, 80, a4),
		ipset.IPPortIPEntry(a4, tcp, 80, b4),
		ipset.IPPortNetEntry(a4, tcp, 80, netip.MustParsePrefix("10.0.0.0/8")),
		ipset.IPPortNetEntry(a4, tcp, 80, netip.MustParsePrefix("10.0.0.0/24")),
		ipset.NetEntry(n4),
		ipset.PortEntry(80),
		ipset.PortEntry(8080),
	}
	for i, a := range ordered {
		for j, b := range ordered {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.Compare(b); got != want {
				t.Errorf("Compare(%s, %s) = %d, want %d", a, b, got, want)
			}
		}
	}
}
