package nftables_test

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterNodeOutputKernel sends the node's own connections, with the
// real kernel, to the external addresses of services, for each family:
//
//   - an external IP and a load-balancer IP of an externalTrafficPolicy
//     Local service whose only endpoint is on another node: the node's
//     connections reach that endpoint (short-circuited, as kube-proxy and
//     both iptables modes do), while the client's, from outside, are
//     dropped, since this node has no local endpoint;
//   - a load-balancer IP whose source ranges leave the node out, of a
//     service without endpoints: the firewall drops the node's
//     connection (a timeout) before the no-endpoints check would reject
//     it, as kube-proxy does.
//
// The endpoints are "on another node" only in the EndpointSlice: their
// pods sit on the node's bridge, so a connection that the rules send to
// them gets there.
func TestWriterNodeOutputKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	nw := newWriterNetwork(t)
	for _, tc := range []struct {
		family               v1.IPFamily
		nftFamily            knftables.Family
		nodeIP, cidr         string
		extSvc, lbSvc, fwSvc string // cluster IPs
		extIP, lbIP, fwIP    string
		otherNet             string
		podA, podB           string
	}{
		{v1.IPv4Protocol, knftables.IPv4Family, "10.1.0.1", "10.0.0.0/16",
			"10.96.0.40", "10.96.0.41", "10.96.0.42", "192.0.2.40", "203.0.113.41", "203.0.113.42",
			"198.51.100.0/24", "10.0.0.11", "10.0.0.12"},
		{v1.IPv6Protocol, knftables.IPv6Family, "fd01::1", "fd00:10::/64",
			"fd00:96::40", "fd00:96::41", "fd00:96::42", "2001:db8:2::40", "2001:db8:3::41", "2001:db8:3::42",
			"2001:db8:1::/64", "fd00:10::11", "fd00:10::12"},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			nft := nsNFT(t, nw.Node, tc.nftFamily)
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{
				Family: tc.family,
				Node:   proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix(tc.cidr)}},
			})
			if err != nil {
				t.Fatal(err)
			}
			// The earlier layout's base chains, as a table left by an
			// earlier version or by kube-proxy before it moved its filter
			// chains: the first sync deletes the retired ones and moves
			// filter-output after DNAT. The drop rule in one would fail
			// the node's connections below if it stayed.
			fam := string(tc.nftFamily)
			nw.Node.MustExec(t, "nft", "add", "table", fam, nftables.DefaultTableName)
			nw.Node.MustExec(t, "nft", "add", "chain", fam, nftables.DefaultTableName, "filter-prerouting", "{ type filter hook prerouting priority -110 ; }")
			nw.Node.MustExec(t, "nft", "add", "chain", fam, nftables.DefaultTableName, "filter-output", "{ type filter hook output priority -110 ; }")
			nw.Node.MustExec(t, "nft", "add", "chain", fam, nftables.DefaultTableName, "filter-output-post-dnat", "{ type filter hook output priority -90 ; }")
			nw.Node.MustExec(t, "nft", "add", "rule", fam, nftables.DefaultTableName, "filter-output-post-dnat", "tcp dport 8080 drop")

			c := newCluster(tc.family, "node-a")

			c.NodeIPs = []netip.Addr{addr(tc.nodeIP)}
			c.setService(makeService("ns", "ext", tc.extSvc, withExternalIPs(tc.extIP), withExternalLocal()))
			c.setEndpoints("ns", "ext", tcp8080, ep{IP: tc.podA, Node: "node-b"})
			c.setService(makeService("ns", "lb", tc.lbSvc, withLoadBalancer(tc.lbIP), withExternalLocal()))
			c.setEndpoints("ns", "lb", tcp8080, ep{IP: tc.podB, Node: "node-b"})
			c.setService(makeService("ns", "fenced", tc.fwSvc, withLoadBalancer(tc.fwIP, tc.otherNet)))
			applyIn(t, nw.Node, nft, w, c.input(), true)
			chains := nw.Node.MustExec(t, "nft", "list", "chains", fam)
			for _, gone := range []string{"filter-prerouting ", "filter-output-post-dnat"} {
				if strings.Contains(chains, gone) {
					t.Errorf("the earlier layout's chain %s is left:\n%s", gone, chains)
				}
			}

			for _, x := range []struct {
				dst  string
				want string
			}{{tc.extIP, "pod-a"}, {tc.lbIP, "pod-b"}} {
				dst := netip.AddrPortFrom(addr(x.dst), 80)
				r, err := kerneltest.Dial(nw.Node, "tcp", dst, 3*time.Second)
				if err != nil || r.Name != x.want {
					t.Errorf("the node connecting to %s: reply %+v, error %v; want %s (the remote endpoint)", dst, r, err, x.want)
				}
				if r, err := kerneltest.Dial(nw.Client, "tcp", dst, time.Second); !kerneltest.IsTimeout(err) {
					t.Errorf("the client connecting to %s: reply %+v, error %v; want a timeout (no local endpoint: dropped)", dst, r, err)
				}
			}

			fw := netip.AddrPortFrom(addr(tc.fwIP), 80)
			if r, err := kerneltest.Dial(nw.Node, "tcp", fw, 3*time.Second); !kerneltest.IsTimeout(err) {
				t.Errorf("the node connecting to %s outside its source ranges: reply %+v, error %v; want a timeout (dropped by the firewall)", fw, r, err)
			}
			// Its cluster IP, and the same VIP from a source inside
			// its ranges, have no endpoints to reach: rejected.
			if _, err := kerneltest.Dial(nw.Node, "tcp", netip.AddrPortFrom(addr(tc.fwSvc), 80), 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("the node connecting to cluster IP %s without endpoints: %v, want connection refused", tc.fwSvc, err)
			}
			c.setService(makeService("ns", "fenced", tc.fwSvc, withLoadBalancer(tc.fwIP, tc.otherNet, netip.PrefixFrom(addr(tc.nodeIP), addr(tc.nodeIP).BitLen()).String())))
			applyIn(t, nw.Node, nft, w, c.input(), false)
			if _, err := kerneltest.DialFrom(nw.Node, "tcp", addr(tc.nodeIP), fw, 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("the node connecting to %s inside its source ranges: %v, want connection refused (no endpoints)", fw, err)
			}
		})
	}
}
