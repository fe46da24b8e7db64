package ipsettest

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
)

func TestMatchPacket(t *testing.T) {
	f := NewFake()
	if err := f.Restore(`create IP hash:ip family inet hashsize 1024 maxelem 65536
add IP 10.0.0.1
create IPPORT hash:ip,port family inet hashsize 1024 maxelem 65536
add IPPORT 10.96.0.1,tcp:80
create LOOP hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add LOOP 10.0.1.5,tcp:8080,10.0.1.5
create SRCNET hash:ip,port,net family inet hashsize 1024 maxelem 65536
add SRCNET 192.0.2.10,tcp:443,203.0.113.0/24
create NET6 hash:net family inet6 hashsize 1024 maxelem 65536
add NET6 fd00:10::/64
add NET6 fd00:20::/48
create NODEPORTS bitmap:port range 0-65535
add NODEPORTS 30080
`); err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	for _, tc := range []struct {
		set   string
		proto v1.Protocol
		dims  []netip.AddrPort
		want  bool
	}{
		{"IP", tcp, []netip.AddrPort{ap("10.0.0.1:1")}, true},
		{"IP", "", []netip.AddrPort{ap("10.0.0.1:0")}, true}, // hash:ip takes any protocol
		{"IP", tcp, []netip.AddrPort{ap("10.0.0.2:1")}, false},
		{"IP", tcp, []netip.AddrPort{ap("[::ffff:10.0.0.1]:1")}, false}, // another family
		{"IPPORT", tcp, []netip.AddrPort{ap("10.96.0.1:80"), ap("10.96.0.1:80")}, true},
		{"IPPORT", udp, []netip.AddrPort{ap("10.96.0.1:80"), ap("10.96.0.1:80")}, false},
		{"IPPORT", "", []netip.AddrPort{ap("10.96.0.1:80"), ap("10.96.0.1:80")}, false}, // no ports
		{"IPPORT", tcp, []netip.AddrPort{ap("10.96.0.1:80"), ap("10.0.0.9:81")}, false},
		{"IPPORT", tcp, []netip.AddrPort{ap("10.96.0.1:80")}, false},                                      // fewer directions than dimensions
		{"IPPORT", tcp, []netip.AddrPort{ap("10.96.0.1:80"), ap("10.96.0.1:80"), ap("10.9.9.9:1")}, true}, // extra ones ignored
		{"LOOP", tcp, []netip.AddrPort{ap("10.0.1.5:8080"), ap("10.0.1.5:8080"), ap("10.0.1.5:40000")}, true},
		{"LOOP", tcp, []netip.AddrPort{ap("10.0.1.5:8080"), ap("10.0.1.5:8080"), ap("10.0.1.6:40000")}, false},
		{"SRCNET", tcp, []netip.AddrPort{ap("192.0.2.10:443"), ap("192.0.2.10:443"), ap("203.0.113.77:5000")}, true},
		{"SRCNET", tcp, []netip.AddrPort{ap("192.0.2.10:443"), ap("192.0.2.10:443"), ap("203.0.114.1:5000")}, false},
		{"NET6", tcp, []netip.AddrPort{ap("[fd00:10::5]:1")}, true},
		{"NET6", tcp, []netip.AddrPort{ap("[fd00:20:0:ff::1]:1")}, true},
		{"NET6", tcp, []netip.AddrPort{ap("[fd00:11::1]:1")}, false},
		{"NET6", tcp, []netip.AddrPort{ap("10.0.0.1:1")}, false},
		{"NODEPORTS", udp, []netip.AddrPort{ap("192.0.2.1:30080")}, true},
		{"NODEPORTS", tcp, []netip.AddrPort{ap("192.0.2.1:30081")}, false},
		{"NODEPORTS", "", []netip.AddrPort{ap("192.0.2.1:30080")}, false},
	} {
		got, err := f.MatchPacket(tc.set, tc.proto, tc.dims)
		if err != nil {
			t.Errorf("MatchPacket(%s, %s, %v): %v", tc.set, tc.proto, tc.dims, err)
			continue
		}
		if got != tc.want {
			t.Errorf("MatchPacket(%s, %s, %v) = %v, want %v", tc.set, tc.proto, tc.dims, got, tc.want)
		}
	}
	if _, err := f.MatchPacket("NONE", tcp, []netip.AddrPort{ap("10.0.0.1:1")}); !errors.Is(err, ipset.ErrNotFound) {
		t.Errorf("MatchPacket of a missing set: got %v, want ipset.ErrNotFound", err)
	}
	if !f.HasSet("IP") || f.HasSet("NONE") {
		t.Errorf("HasSet(IP), HasSet(NONE) = %v, %v; want true, false", f.HasSet("IP"), f.HasSet("NONE"))
	}
	// Matching is not a call of the Interface.
	if diff := cmp.Diff(Counts{}, f.Counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}
