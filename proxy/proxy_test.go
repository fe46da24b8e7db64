package proxy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/proxy"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestNodeConfigClusterCIDR(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cidrs   []netip.Prefix
		family  v1.IPFamily
		want    string // "" for none
		wantErr string
	}{
		{"none", nil, v1.IPv4Protocol, "", ""},
		{"other family only", prefixes("fd00:10::/64"), v1.IPv4Protocol, "", ""},
		{"own family, masked", prefixes("10.0.1.2/16", "fd00:10::/64"), v1.IPv4Protocol, "10.0.0.0/16", ""},
		{"IPv6 of two", prefixes("10.0.0.0/16", "fd00:10::1/64"), v1.IPv6Protocol, "fd00:10::/64", ""},
		{"IPv4-mapped counts as IPv4", prefixes("::ffff:10.0.0.0/112"), v1.IPv4Protocol, "10.0.0.0/16", ""},
		{"mapped wider than the IPv4 space is left out", prefixes("::ffff:0:0/80"), v1.IPv4Protocol, "", ""},
		{"the same twice", prefixes("10.0.0.0/16", "10.0.0.0/16"), v1.IPv4Protocol, "10.0.0.0/16", ""},
		{"two of the family", prefixes("10.0.0.0/16", "10.1.0.0/16"), v1.IPv4Protocol, "", "10.0.0.0/16 and 10.1.0.0/16 are both IPv4"},
		{"invalid ignored", []netip.Prefix{{}, netip.MustParsePrefix("10.0.0.0/8")}, v1.IPv4Protocol, "10.0.0.0/8", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := proxy.NodeConfig{ClusterCIDRs: tc.cidrs}
			got, err := c.ClusterCIDR(tc.family)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gotS := ""
			if got.IsValid() {
				gotS = got.String()
			}
			if gotS != tc.want {
				t.Errorf("got %q, want %q", gotS, tc.want)
			}
		})
	}
}

func TestNodeConfigNodePortPrefixes(t *testing.T) {
	c := proxy.NodeConfig{NodePortAddresses: append(prefixes("192.168.0.7/24", "fd00:1::/64", "::ffff:172.16.0.0/108", "0.0.0.0/0"), netip.Prefix{})}
	if diff := cmp.Diff(prefixes("192.168.0.0/24", "172.16.0.0/12", "0.0.0.0/0"), c.NodePortPrefixes(v1.IPv4Protocol), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("IPv4 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(prefixes("fd00:1::/64"), c.NodePortPrefixes(v1.IPv6Protocol), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("IPv6 (-want +got):\n%s", diff)
	}
	if got := (&proxy.NodeConfig{NodePortAddresses: prefixes("fd00:1::/64")}).NodePortPrefixes(v1.IPv4Protocol); got != nil {
		t.Errorf("no IPv4 prefix: got %v, want nil (every address)", got)
	}
}

func TestNodeConfigMasqueradeMark(t *testing.T) {
	for _, tc := range []struct {
		bit     *int
		want    int
		wantErr bool
	}{{nil, proxy.DefaultMasqueradeBit, false}, {ptr.To(0), 0, false}, {ptr.To(31), 31, false}, {ptr.To(32), 0, true}, {ptr.To(-1), 0, true}} {
		got, err := (&proxy.NodeConfig{MasqueradeBit: tc.bit}).MasqueradeMark()
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("bit %v: got %d, %v; want %d, error %v", tc.bit, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestNodeIPsOf(t *testing.T) {
	in := append(addrs("192.168.0.10", "fd00:1::10", "::ffff:10.0.0.1", "fe80::1%eth0", "10.0.0.1", "192.168.0.10"), netip.Addr{})
	cmpAddr := cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
	if diff := cmp.Diff(addrs("10.0.0.1", "192.168.0.10"), proxy.NodeIPsOf(v1.IPv4Protocol, in), cmpAddr); diff != "" {
		t.Errorf("IPv4 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(addrs("fd00:1::10", "fe80::1"), proxy.NodeIPsOf(v1.IPv6Protocol, in), cmpAddr); diff != "" {
		t.Errorf("IPv6 (-want +got):\n%s", diff)
	}
}

func TestFamilyOf(t *testing.T) {
	for s, want := range map[string]v1.IPFamily{"10.0.0.1": v1.IPv4Protocol, "::ffff:10.0.0.1": v1.IPv4Protocol, "fd00::1": v1.IPv6Protocol} {
		if got := proxy.FamilyOf(netip.MustParseAddr(s)); got != want {
			t.Errorf("FamilyOf(%s) = %s, want %s", s, got, want)
		}
	}
}
