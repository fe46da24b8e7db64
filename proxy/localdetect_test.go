package proxy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/proxy"
)

// TestLocalDetector checks the matches of each mode, in each family,
// with kube-proxy's words: the prefix of the mode's family (ClusterCIDRs,
// or the node's pod range in NodeCIDR mode) or the interface, whatever
// the family; nothing where the mode has no prefix of the family.
func TestLocalDetector(t *testing.T) {
	cluster := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00:10::/48")}
	pods := []netip.Prefix{netip.MustParsePrefix("fd00:10:0:1::/64"), netip.MustParsePrefix("::ffff:10.0.1.0/120")}
	type matches struct{ IfLocal, IfNotLocal, IfLocalNFT, IfNotLocalNFT []string }
	for _, tc := range []struct {
		name     string
		node     proxy.NodeConfig
		family   v1.IPFamily
		podCIDRs []netip.Prefix
		want     matches
	}{
		{"ClusterCIDR by default", proxy.NodeConfig{ClusterCIDRs: cluster}, v1.IPv4Protocol, pods,
			matches{[]string{"-s", "10.0.0.0/16"}, []string{"!", "-s", "10.0.0.0/16"}, []string{"ip", "saddr", "10.0.0.0/16"}, []string{"ip", "saddr", "!=", "10.0.0.0/16"}}},
		{"ClusterCIDR IPv6", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeClusterCIDR, ClusterCIDRs: cluster}, v1.IPv6Protocol, nil,
			matches{[]string{"-s", "fd00:10::/48"}, []string{"!", "-s", "fd00:10::/48"}, []string{"ip6", "saddr", "fd00:10::/48"}, []string{"ip6", "saddr", "!=", "fd00:10::/48"}}},
		{"ClusterCIDR without one of the family", proxy.NodeConfig{ClusterCIDRs: cluster[:1]}, v1.IPv6Protocol, nil, matches{}},
		{"NodeCIDR reads the pod range, an IPv4-mapped one as IPv4", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR, ClusterCIDRs: cluster}, v1.IPv4Protocol, pods,
			matches{[]string{"-s", "10.0.1.0/24"}, []string{"!", "-s", "10.0.1.0/24"}, []string{"ip", "saddr", "10.0.1.0/24"}, []string{"ip", "saddr", "!=", "10.0.1.0/24"}}},
		{"NodeCIDR IPv6", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR}, v1.IPv6Protocol, pods,
			matches{[]string{"-s", "fd00:10:0:1::/64"}, []string{"!", "-s", "fd00:10:0:1::/64"}, []string{"ip6", "saddr", "fd00:10:0:1::/64"}, []string{"ip6", "saddr", "!=", "fd00:10:0:1::/64"}}},
		{"NodeCIDR before the range is allocated", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR, ClusterCIDRs: cluster}, v1.IPv4Protocol, nil, matches{}},
		{"BridgeInterface", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "cni0", ClusterCIDRs: cluster}, v1.IPv6Protocol, nil,
			matches{[]string{"-i", "cni0"}, []string{"!", "-i", "cni0"}, []string{"iifname", `"cni0"`}, []string{"iifname", "!=", `"cni0"`}}},
		{"InterfaceNamePrefix", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"}, v1.IPv4Protocol, nil,
			matches{[]string{"-i", "veth+"}, []string{"!", "-i", "veth+"}, []string{"iifname", `"veth*"`}, []string{"iifname", "!=", `"veth*"`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.node.LocalDetector(tc.family, tc.podCIDRs)
			if err != nil {
				t.Fatal(err)
			}
			got := matches{d.IfLocal(), d.IfNotLocal(), d.IfLocalNFT(), d.IfNotLocalNFT()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("matches (-want +got):\n%s", diff)
			}
			if d.Enabled() != (tc.want.IfLocal != nil) {
				t.Errorf("Enabled() = %v with matches %q", d.Enabled(), got.IfLocal)
			}
		})
	}
}

// TestLocalDetectorCompares checks that detectors are equal exactly when
// their matches are, which the renderers rely on to tell a change.
func TestLocalDetectorCompares(t *testing.T) {
	node := proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR}
	get := func(p ...string) proxy.LocalDetector {
		var ps []netip.Prefix
		for _, s := range p {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		d, err := node.LocalDetector(v1.IPv4Protocol, ps)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if get("10.0.1.0/24") != get("10.0.1.7/24", "fd00::/64") {
		t.Error("the same range, unmasked and beside another family's, is another detector")
	}
	if get("10.0.1.0/24") == get("10.0.2.0/24") || get("10.0.1.0/24") == get() {
		t.Error("another range, or none, is the same detector")
	}
}

// TestLocalDetectorRefuses checks the settings that could not make a
// rule: each is refused with the field it is in.
func TestLocalDetectorRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		node proxy.NodeConfig
		want string
	}{
		{"unknown mode", proxy.NodeConfig{DetectLocalMode: "nodecidr"}, `DetectLocalMode "nodecidr": want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix`},
		{"two cluster CIDRs", proxy.NodeConfig{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.1.0.0/16")}}, "ClusterCIDRs: cluster CIDRs 10.0.0.0/16 and 10.1.0.0/16 are both IPv4"},
		{"no bridge", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface}, "BridgeInterface: interface name must not be empty"},
		{"no prefix", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, BridgeInterface: "cni0"}, "InterfaceNamePrefix: interface name must not be empty"},
		{"prefix without room for the wildcard", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "abcdefghijklmno"},
			`InterfaceNamePrefix: interface name prefix "abcdefghijklmno" is too long: with iptables' wildcard it must fit in 15 characters`},
		{"bridge name with a rule in it", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: `cni0" accept`}, "BridgeInterface: interface name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.node.LocalDetector(v1.IPv4Protocol, nil)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v, want an error starting %q", err, tc.want)
			}
		})
	}
}

// TestValidateInterfaceName checks which names may reach iptables and nft.
func TestValidateInterfaceName(t *testing.T) {
	for name, ok := range map[string]bool{
		"cni0": true, "flannel.1": true, "kube-bridge": true, "br-4f2c9a1b7e3d": true, "_x": true, "eth0.100": true,
		"abcdefghijklmno": true, "abcdefghijklmnop": false,
		"": false, ".": false, "..": false, "-i": false,
		"veth+": false, "veth*": false, "cni 0": false, `cni"0`: false, "cni0;": false, "a/b": false, "a:b": false, "é": false, "cni0\n": false,
	} {
		if err := proxy.ValidateInterfaceName(name); (err == nil) != ok {
			t.Errorf("ValidateInterfaceName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}
