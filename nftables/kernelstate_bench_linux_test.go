package nftables_test

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
)

// BenchmarkSyncNothingKernelState measures a sync with nothing to do by a
// writer with a netlink KernelState, in a namespace: the render of an
// empty partial sync and the two reads of the nf_tables generation around
// it (in Sync and in Applied), which are most of it.
func BenchmarkSyncNothingKernelState(b *testing.B) {
	kerneltest.Require(b, "nft")
	ns := kerneltest.NewNS(b)
	nft := nsNFT(b, ns, knftables.IPv4Family)
	cfg := baseConfig()
	cfg.KernelState = nsKernelState(b, ns, false)
	w, err := nftables.NewWriter(nft, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	c := changeByHandCluster()
	res := syncIn(b, ns, w, c.input())
	err = ns.Do(func() error { return nft.Run(ctx, res.Transaction) })
	w.Applied(err)
	if err != nil {
		b.Fatal(err)
	}
	in := c.input()
	b.ReportAllocs()
	for b.Loop() {
		res = w.Sync(ctx, in)
		w.Applied(nil)
	}
	if res.Full || res.Transaction.NumOperations() != 0 {
		b.Fatalf("sync: full %v, %d operations; want nothing to do", res.Full, res.Transaction.NumOperations())
	}
}
