package conntrack

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestFlowSetMatchesNetlinkFlows(t *testing.T) {
	want := Flow{
		Protocol: ProtocolUDP,
		Original: Tuple{Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: 40001, DstPort: 53},
		Reply:    Tuple{Src: netip.MustParseAddr("10.0.1.2"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 5353, DstPort: 40001},
	}
	nl := func(replySrc string, zone uint16) *netlink.ConntrackFlow {
		return &netlink.ConntrackFlow{
			FamilyType: 2,
			// netlink may hand out IPv4 addresses in their 16-byte form.
			Forward: netlink.IPTuple{Protocol: 17, SrcIP: net.ParseIP("10.0.0.2"), DstIP: net.ParseIP("10.96.0.10").To4(), SrcPort: 40001, DstPort: 53},
			Reverse: netlink.IPTuple{Protocol: 17, SrcIP: net.ParseIP(replySrc), DstIP: net.ParseIP("10.0.0.2"), SrcPort: 5353, DstPort: 40001},
			Zone:    zone,
		}
	}
	if got := fromNetlink(nl("10.0.1.2", 0)); got != want {
		t.Errorf("fromNetlink = %s, want %s", got, want)
	}
	set := flowSet{want.key(): {}}
	for _, tc := range []struct {
		flow  *netlink.ConntrackFlow
		match bool
	}{
		{nl("10.0.1.2", 0), true},
		{nl("10.0.2.2", 0), false}, // same original tuple, another endpoint
		{nl("10.0.1.2", 1), false}, // another zone
	} {
		if got := set.MatchConntrackFlow(tc.flow); got != tc.match {
			t.Errorf("MatchConntrackFlow(reply %s zone %d) = %v, want %v", tc.flow.Reverse.SrcIP, tc.flow.Zone, got, tc.match)
		}
	}
}
