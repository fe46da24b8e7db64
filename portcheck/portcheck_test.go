package portcheck_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/portcheck"
)

func TestOwnAddr(t *testing.T) {
	for _, tc := range []struct {
		family v1.IPFamily
		addr   netip.Addr
		want   bool
	}{
		{v1.IPv4Protocol, netip.MustParseAddr("10.0.0.1"), true},
		{v1.IPv4Protocol, netip.MustParseAddr("::ffff:10.0.0.1"), false},
		{v1.IPv4Protocol, netip.MustParseAddr("fd00::1"), false},
		{v1.IPv4Protocol, netip.Addr{}, false},
		{v1.IPv6Protocol, netip.MustParseAddr("fd00::1"), true},
		{v1.IPv6Protocol, netip.MustParseAddr("fe80::1%eth0"), false},
		{v1.IPv6Protocol, netip.MustParseAddr("::ffff:10.0.0.1"), false},
		{v1.IPv6Protocol, netip.MustParseAddr("10.0.0.1"), false},
	} {
		if got := portcheck.New(tc.family).OwnAddr(tc.addr); got != tc.want {
			t.Errorf("%s OwnAddr(%v) = %v, want %v", tc.family, tc.addr, got, tc.want)
		}
	}
}
