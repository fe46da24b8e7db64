package ebpftest_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
)

func TestTrace(t *testing.T) {
	fk := ebpftest.NewFake(v1.IPv4Protocol, ebpf.Sizes{})
	vip := ebpf.Frontend{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: v1.ProtocolTCP}
	empty := ebpf.Frontend{Addr: netip.MustParseAddr("10.96.0.2"), Port: 80, Protocol: v1.ProtocolTCP}
	a, b := netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fk.UpdateEndpoint(1, ebpf.Endpoint{Service: 7, Addr: a.Addr(), Port: a.Port()}))
	must(fk.UpdateEndpoint(2, ebpf.Endpoint{Service: 7, Addr: b.Addr(), Port: b.Port()}))
	must(fk.UpdateEndpoint(3, ebpf.Endpoint{Service: 8, Addr: b.Addr(), Port: b.Port()}))
	// Slots 0 and 1 name a, 2 names b, 3 an endpoint of another set.
	for slot, id := range []uint32{1, 1, 2, 3} {
		must(fk.UpdateSlot(ebpf.SlotKey{Service: 7, Slot: uint32(slot)}, id))
	}
	must(fk.UpdateService(vip, ebpf.Service{ID: 7, Count: 4, AffinitySeconds: 10}))
	must(fk.UpdateService(empty, ebpf.Service{ID: 9}))
	// The same Service's SCTP port: the kernel never runs the connect
	// programs for it, so its frontend is never applied.
	sctp := ebpf.Frontend{Addr: vip.Addr, Port: 80, Protocol: v1.ProtocolSCTP}
	must(fk.UpdateService(sctp, ebpf.Service{ID: 7, Count: 4}))

	for _, tc := range []struct {
		name string
		c    ebpftest.Connection
		want []ebpftest.Outcome
	}{{
		name: "random",
		c:    ebpftest.Connection{Destination: vip},
		want: []ebpftest.Outcome{
			{Translated: true, Endpoint: a, Probability: 0.5},
			{Translated: true, Endpoint: b, Probability: 0.25},
			{Probability: 0.25},
		},
	}, {
		name: "affinity",
		c:    ebpftest.Connection{Destination: vip, Affinity: b},
		want: []ebpftest.Outcome{{Translated: true, Endpoint: b, Probability: 1, Sticky: true}},
	}, {
		name: "no endpoints",
		c:    ebpftest.Connection{Destination: empty},
		want: []ebpftest.Outcome{{Refused: true, Probability: 1}},
	}, {
		name: "not a frontend",
		c:    ebpftest.Connection{Destination: ebpf.Frontend{Addr: vip.Addr, Port: 81, Protocol: v1.ProtocolTCP}},
		want: []ebpftest.Outcome{{Probability: 1}},
	}, {
		name: "SCTP passes with endpoints in the maps",
		c:    ebpftest.Connection{Destination: sctp},
		want: []ebpftest.Outcome{{Probability: 1}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, fk.Trace(tc.c), cmp.Comparer(func(x, y netip.AddrPort) bool { return x == y })); diff != "" {
				t.Errorf("Trace (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFakeFull(t *testing.T) {
	fk := ebpftest.NewFake(v1.IPv4Protocol, ebpf.Sizes{Services: 1})
	f := func(port uint16) ebpf.Frontend {
		return ebpf.Frontend{Addr: netip.MustParseAddr("10.96.0.1"), Port: port, Protocol: v1.ProtocolUDP}
	}
	if err := fk.UpdateService(f(1), ebpf.Service{ID: 1}); err != nil {
		t.Fatal(err)
	}
	if err := fk.UpdateService(f(1), ebpf.Service{ID: 2}); err != nil {
		t.Errorf("replacing an element of a full map: %v", err)
	}
	if err := fk.UpdateService(f(2), ebpf.Service{ID: 1}); !ebpf.IsMapFull(err) {
		t.Errorf("adding to a full map: %v, want a map-full error", err)
	}
	if err := fk.UpdateEndpoint(1, ebpf.Endpoint{Addr: netip.MustParseAddr("fd00::1"), Port: 1}); err == nil {
		t.Error("an IPv6 endpoint in IPv4 maps was accepted")
	}
}
