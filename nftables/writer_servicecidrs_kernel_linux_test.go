package nftables_test

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterServiceCIDRsKernel sends real connections from a client
// namespace through a node namespace whose table has service CIDRs from
// the sync's input, in each family: one to an unallocated address inside
// the ranges is dropped (the client times out), one to the service's
// cluster IP on a port it lacks is rejected, and one to an address outside
// the ranges (a pod's) is served.
// Nested and adjacent ranges load (merged), and a change of ranges is a
// full sync that nft applies and packets follow.
func TestWriterServiceCIDRsKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	nw := newWriterNetwork(t)
	for _, tc := range []struct {
		family                       v1.IPFamily
		nftFamily                    knftables.Family
		nodeIP, clusterIP, cidr, pod string
		before, after                []netip.Prefix
		// unallocated is in both; moved only in after. Both are pod-a's.
		unallocated, moved string
	}{
		{v1.IPv4Protocol, knftables.IPv4Family, "10.1.0.1", "10.96.0.10", "10.0.0.0/16", "10.0.0.11",
			[]netip.Prefix{prefix("10.96.0.0/16"), prefix("10.96.128.0/20"), prefix("10.98.0.0/25"), prefix("10.98.0.128/25")},
			[]netip.Prefix{prefix("10.96.0.0/16"), prefix("10.97.0.0/16")},
			"10.96.9.9", "10.97.0.5"},
		{v1.IPv6Protocol, knftables.IPv6Family, "fd01::1", "fd00:96::10", "fd00:10::/64", "fd00:10::11",
			[]netip.Prefix{prefix("fd00:96::/64"), prefix("fd00:96::/112"), prefix("fd00:98::/65"), prefix("fd00:98:0:0:8000::/65")},
			[]netip.Prefix{prefix("fd00:96::/64"), prefix("fd00:97::/64")},
			"fd00:96::9:9", "fd00:97::5"},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			nft := nsNFT(t, nw.Node, tc.nftFamily)
			t.Cleanup(func() {
				nw.Node.Do(func() error { // best effort: the namespace goes anyway
					tx := nft.NewTransaction()
					tx.Delete(&knftables.Table{})
					return nft.Run(context.Background(), tx)
				})
			})
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{
				Family: tc.family,
				Node:   proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix(tc.cidr)}},
			})
			if err != nil {
				t.Fatal(err)
			}
			c := newCluster(tc.family, "node-a")
			c.NodeIPs = []netip.Addr{addr(tc.nodeIP)}
			c.setService(makeService("ns", "web", tc.clusterIP))
			c.setEndpoints("ns", "web", tcp8080, local(tc.pod))
			apply := func(ranges []netip.Prefix, wantFull bool) nftables.SyncResult {
				t.Helper()
				in := c.input()
				in.ServiceCIDRs = ranges
				return applyIn(t, nw.Node, nft, w, in, wantFull)
			}
			// The unallocated addresses are pod-a's too (on its
			// loopback, routed by the node), so that a connection the
			// rules do not drop is served.
			for _, a := range []string{tc.unallocated, tc.moved} {
				p := netip.PrefixFrom(addr(a), addr(a).BitLen())
				nw.Pods["pod-a"].AddAddr(t, "lo", p)
				nw.Node.AddRoute(t, p, addr(tc.pod))
			}
			dial := func(dst string, port uint16, timeout time.Duration) error {
				_, err := kerneltest.Dial(nw.Client, "tcp", netip.AddrPortFrom(addr(dst), port), timeout)
				return err
			}
			wantDropped := func(what, dst string) {
				t.Helper()
				if err := dial(dst, 8080, time.Second); !kerneltest.IsTimeout(err) {
					t.Errorf("%s %s: %v, want a timeout (dropped)", what, dst, err)
				}
			}

			apply(tc.before, true)
			if err := dial(tc.clusterIP, 80, 3*time.Second); err != nil {
				t.Errorf("the service: %v", err)
			}
			// 3 s: the first SYN's rejection can reach the client while
			// connect still holds the socket, which then waits for the
			// retransmission's (TcpExtLockDroppedIcmps).
			if err := dial(tc.clusterIP, 81, 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("the service's cluster IP on a port it lacks: %v, want connection refused", err)
			}
			wantDropped("unallocated", tc.unallocated)
			if err := dial(tc.moved, 8080, 3*time.Second); err != nil {
				t.Errorf("%s, outside the ranges: %v, want pod-a's answer", tc.moved, err)
			}

			// Full: ports are judged again against the new ranges.
			apply(tc.after, true)
			wantDropped("unallocated, after the change", tc.unallocated)
			wantDropped("in the new range", tc.moved)
			if err := dial(tc.clusterIP, 80, 3*time.Second); err != nil {
				t.Errorf("the service after the change: %v", err)
			}
		})
	}
}
