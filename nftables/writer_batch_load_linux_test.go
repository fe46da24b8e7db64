package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterKernelBatchKinds measures, on tables of the benchmarks'
// clusters (1,000, 10,000 and 30,000 services × 10 endpoints, loaded
// split), the kernel's side of the two kinds of one-endpoint change that a
// partial sync sends as one netlink batch (WriterConfig.NetlinkElementSyncs):
// an endpoint whose readiness changes, which changes the service's
// endpoint count and so its service-ips element's verdict (goto lb-K), and
// an endpoint replaced by another address, which changes an endpoints
// element alone. Each kind alternates five times on five services; the
// first change that needs a shared chain the table lacks goes through nft
// and is not counted. It runs only with PROXYKIT_NFT_BENCH=1, in throwaway
// namespaces, and logs the figures (go test -v):
//
//	PROXYKIT_NFT_BENCH=1 PROXYKIT_REQUIRE_KERNEL=1 go test ./nftables/ -run TestWriterKernelBatchKinds -v
func TestWriterKernelBatchKinds(t *testing.T) {
	if os.Getenv("PROXYKIT_NFT_BENCH") != "1" {
		t.Skip("set PROXYKIT_NFT_BENCH=1 to measure (loads 30,000-service tables)")
	}
	kerneltest.Require(t, "nft")
	for _, size := range []benchSize{{1000, 10}, {10000, 10}, {30000, 10}} {
		t.Run(size.String(), func(t *testing.T) {
			ns := kerneltest.NewNS(t)
			nft := nsNFT(t, ns, knftables.IPv4Family)
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{
				Family:              v1.IPv4Protocol,
				Node:                proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}},
				SplitFirstLoad:      true,
				NetlinkElementSyncs: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			c := benchCluster(size)
			ctx := context.Background()
			res := syncIn(t, ns, w, c.input())
			err = ns.Do(func() error {
				if err := nft.Run(ctx, res.Transaction); err != nil {
					return err
				}
				return nftables.ApplyElements(res.Elements)
			})
			w.Applied(err)
			if err != nil {
				t.Fatal(err)
			}
			for _, kind := range []string{"count changes (a verdict)", "endpoint replaced (elements alone)"} {
				var times []time.Duration
				for i := range 10 {
					name := fmt.Sprintf("svc-%d", (i/2)*997%size.services)
					s := c.Slices["bench/"+name+"-1"].DeepCopy()
					if i%2 == 0 {
						if kind == "count changes (a verdict)" {
							s.Endpoints[3].Conditions.Ready = ptr.To(false)
						} else {
							s.Endpoints[3].Addresses = []string{fmt.Sprintf("10.200.%d.%d", i, 7)}
						}
					}
					c.EndpointTracker.EndpointSliceUpdate(s, false)
					res := syncIn(t, ns, w, c.input())
					if res.Batch == nil {
						err := ns.Do(func() error { return nft.Run(ctx, res.Transaction) })
						w.Applied(err)
						if err != nil {
							t.Fatal(err)
						}
						continue
					}
					start := time.Now()
					err := ns.Do(func() error { return nftables.ApplyElementBatch(*res.Batch) })
					times = append(times, time.Since(start))
					w.Applied(err)
					if err != nil {
						t.Fatal(err)
					}
					// Past the grace period that the background close of the
					// batch's socket may hold nf_tables' commit lock for.
					time.Sleep(50 * time.Millisecond)
				}
				slices.Sort(times)
				t.Logf("%s, %s: one netlink batch, median %v (min %v, max %v, n=%d)", size, kind, times[len(times)/2].Round(10*time.Microsecond), times[0].Round(10*time.Microsecond), times[len(times)-1].Round(10*time.Microsecond), len(times))
			}
		})
	}
}
