package changetracker

import (
	"net/netip"
	"testing"
)

func TestParseAddr(t *testing.T) {
	tests := []struct {
		in     string
		want   netip.Addr
		wantOK bool
	}{
		{"10.0.0.1", netip.MustParseAddr("10.0.0.1"), true},
		{"fd00::1", netip.MustParseAddr("fd00::1"), true},
		{"fd00:0::1", netip.MustParseAddr("fd00::1"), true},
		{"010.000.000.001", netip.MustParseAddr("10.0.0.1"), true},
		{"::ffff:10.0.0.1", netip.MustParseAddr("10.0.0.1"), true},
		{"fe80::1%eth0", netip.Addr{}, false},
		{"10.0.0.1/8", netip.Addr{}, false},
		{"", netip.Addr{}, false},
		{"node-a", netip.Addr{}, false},
	}
	for _, tt := range tests {
		got, ok := ParseAddr(tt.in)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseAddr(%q) = %v, %t; want %v, %t", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}
