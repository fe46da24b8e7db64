package nftables_test

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterLocalDetectionKernel sends real packets through the rules of
// the NodeCIDR, BridgeInterface and InterfaceNamePrefix modes, in each
// family (see writertest.LocalDetectionKernel): local traffic to a
// cluster IP keeps its source and reaches an externalTrafficPolicy Local
// VIP's remote endpoint, other traffic is masqueraded and dropped there;
// a change of the node's pod range re-programs NodeCIDR mode.
func TestWriterLocalDetectionKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	nw := writertest.KernelNetwork(t)
	for _, tc := range []struct {
		family    v1.IPFamily
		nftFamily knftables.Family
	}{{v1.IPv4Protocol, knftables.IPv4Family}, {v1.IPv6Protocol, knftables.IPv6Family}} {
		t.Run(string(tc.family), func(t *testing.T) {
			writertest.LocalDetectionKernel(t, nw, tc.family, func(t *testing.T, node proxy.NodeConfig) writertest.LocalSync {
				nft := nsNFT(t, nw.Node, tc.nftFamily)
				w, err := nftables.NewWriter(nft, nftables.WriterConfig{Family: tc.family, Node: node})
				if err != nil {
					t.Fatal(err)
				}
				return func(t *testing.T, c *writertest.Cluster, wantFull bool) {
					t.Helper()
					applyIn(t, nw.Node, nft, w, c.Input(), wantFull)
				}
			})
		})
	}
}
