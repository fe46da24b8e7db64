package iptables_test

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterLocalDetectionKernel sends real packets through the rules of
// the NodeCIDR, BridgeInterface and InterfaceNamePrefix modes, with each
// iptables backend and family (see writertest.LocalDetectionKernel):
// local traffic to a cluster IP keeps its source and reaches an
// externalTrafficPolicy Local VIP's remote endpoint, other traffic is
// masqueraded and dropped there; a change of the node's pod range
// re-programs NodeCIDR mode.
func TestWriterLocalDetectionKernel(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			b := string(backend)
			kerneltest.Require(t, append(kernelTools(backend), "ip6tables-"+b, "ip6tables-"+b+"-save", "ip6tables-"+b+"-restore")...)
			// A network per backend: the other's rules would apply too.
			nw := writertest.KernelNetwork(t)
			for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				t.Run(string(family), func(t *testing.T) {
					ctx := context.Background()
					ipt, err := iptables.New(ctx, family, iptables.WithBackend(backend))
					if err != nil {
						t.Fatal(err)
					}
					writertest.LocalDetectionKernel(t, nw, family, func(t *testing.T, node proxy.NodeConfig) writertest.LocalSync {
						w := mustWriter(t, iptables.WriterConfig{Family: family, Node: node, RandomFully: ipt.HasRandomFully()})
						return func(t *testing.T, c *writertest.Cluster, wantFull bool) {
							t.Helper()
							res := w.Sync(ctx, c.Input())
							err := nw.Node.Do(func() error {
								if err := w.EnsureJumpRules(ctx, ipt); err != nil {
									return err
								}
								return ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
							})
							w.Applied(err)
							if err != nil {
								t.Fatalf("%v\n%s", err, res.Payload)
							}
							if res.Full != wantFull {
								t.Fatalf("sync full=%v, want %v", res.Full, wantFull)
							}
						}
					})
				})
			}
		})
	}
}
