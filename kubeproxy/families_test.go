package kubeproxy

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// TestFamilies checks the IP families each mode proxies against what
// kube-proxy v1.37 decides (cmd/kube-proxy/app: detectNodeIPs and
// platformCheckSupported): the node's primary family, that of its first
// address, and the other one whenever the host supports both, even when
// the Node lists no address of it; single stack when the host supports
// the primary alone; a failure when it does not support the primary.
// Support is iptables and ip6tables working (iptables and IPVS mode; nft
// serves both) and the kernel's IPv6 (on, off, or none at all).
func TestFamilies(t *testing.T) {
	v4 := []string{"192.168.10.11"}
	v6 := []string{"fd00::11"}
	dual := []string{"192.168.10.11", "fd00::11"}
	dual6 := []string{"fd00::11", "192.168.10.11"}
	ipv4, ipv6 := v1.IPv4Protocol, v1.IPv6Protocol
	const (
		on   = "0\n" // net.ipv6.conf.all.disable_ipv6
		off  = "1\n"
		none = "" // no IPv6 in the kernel: no sysctl
	)
	for _, tc := range []struct {
		name string
		mode string
		// node are the Node's addresses; none makes IPv4 the primary.
		node []string
		// noIPTables are the families whose iptables does not work.
		noIPTables []v1.IPFamily
		kernelIPv6 string
		want       []v1.IPFamily
		wantErr    string
	}{
		{name: "IPv4 node, both supported: dual-stack", node: v4, kernelIPv6: on, want: []v1.IPFamily{ipv4, ipv6}},
		{name: "IPv4 node, no ip6tables", node: v4, noIPTables: []v1.IPFamily{ipv6}, kernelIPv6: on, want: []v1.IPFamily{ipv4}},
		{name: "IPv4 node, IPv6 off", node: v4, kernelIPv6: off, want: []v1.IPFamily{ipv4}},
		{name: "IPv4 node, no IPv6 in the kernel", node: v4, kernelIPv6: none, want: []v1.IPFamily{ipv4}},
		{name: "IPv4 node, no iptables", node: v4, noIPTables: []v1.IPFamily{ipv4}, kernelIPv6: on, wantErr: `no support for primary IP family "IPv4"`},
		{name: "neither iptables works", node: v4, noIPTables: []v1.IPFamily{ipv4, ipv6}, kernelIPv6: on, wantErr: "iptables is not available on this host"},
		{name: "IPv6 node, both supported", node: v6, kernelIPv6: on, want: []v1.IPFamily{ipv6, ipv4}},
		{name: "IPv6 node, no iptables", node: v6, noIPTables: []v1.IPFamily{ipv4}, kernelIPv6: on, want: []v1.IPFamily{ipv6}},
		{name: "IPv6 node, IPv6 off", node: v6, kernelIPv6: off, wantErr: `no support for primary IP family "IPv6"`},
		{name: "dual-stack node", node: dual, kernelIPv6: on, want: []v1.IPFamily{ipv4, ipv6}},
		{name: "dual-stack node, IPv6 first", node: dual6, kernelIPv6: on, want: []v1.IPFamily{ipv6, ipv4}},
		{name: "dual-stack node, no ip6tables", node: dual, noIPTables: []v1.IPFamily{ipv6}, kernelIPv6: on, want: []v1.IPFamily{ipv4}},
		{name: "node without addresses", kernelIPv6: on, want: []v1.IPFamily{ipv4, ipv6}},
		{name: "nftables, IPv4 node", mode: ModeNFTables, node: v4, kernelIPv6: on, want: []v1.IPFamily{ipv4, ipv6}},
		{name: "nftables ignores iptables", mode: ModeNFTables, node: v4, noIPTables: []v1.IPFamily{ipv4, ipv6}, kernelIPv6: on, want: []v1.IPFamily{ipv4, ipv6}},
		{name: "nftables, IPv6 off", mode: ModeNFTables, node: v4, kernelIPv6: off, want: []v1.IPFamily{ipv4}},
		{name: "nftables, IPv6 node, IPv6 off", mode: ModeNFTables, node: v6, kernelIPv6: off, wantErr: `no support for primary IP family "IPv6"`},
		{name: "IPVS, IPv4 node", mode: ModeIPVS, node: v4, kernelIPv6: on, want: []v1.IPFamily{ipv4, ipv6}},
		{name: "IPVS, IPv4 node, no ip6tables", mode: ModeIPVS, node: v4, noIPTables: []v1.IPFamily{ipv6}, kernelIPv6: on, want: []v1.IPFamily{ipv4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f, h := newFakeHost(t)
			if tc.mode == ModeIPVS {
				f.withIPVS(t)
			}
			if tc.kernelIPv6 != none {
				path := filepath.Join(f.root, "proc/sys", sysctlDisableIPv6)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tc.kernelIPv6), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			newIPTables := h.NewIPTables
			h.NewIPTables = func(ctx context.Context, p v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
				for _, f := range tc.noIPTables {
					if f == p {
						return nil, errors.New("no such binary")
					}
				}
				return newIPTables(ctx, p, b)
			}
			s, err := newSetup(&Config{Mode: tc.mode}, []Option{WithHost(h)})
			if err != nil {
				t.Fatal(err)
			}
			groups, err := s.newBackends()(ctx, nodeWith(tc.node...), proxy.NewMetrics(prometheus.NewRegistry()))
			for _, g := range groups {
				if c, ok := g.Backend.(io.Closer); ok {
					defer c.Close()
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []v1.IPFamily
			for _, g := range groups {
				got = append(got, g.Families...)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("families proxied (-want +got):\n%s", diff)
			}
		})
	}
}

// nodeWith is the Node the proxier hands the backend factory for a Node
// object with addrs: both families, the first address's first (IPv4
// when there is none).
func nodeWith(addrs ...string) proxier.Node {
	n := proxier.Node{Name: "node-a", Families: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPs: map[v1.IPFamily][]netip.Addr{}}
	for i, a := range addrs {
		ip := netip.MustParseAddr(a)
		f := proxy.FamilyOf(ip)
		if i == 0 && f == v1.IPv6Protocol {
			n.Families = []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}
		}
		n.IPs[f] = append(n.IPs[f], ip)
	}
	return n
}
