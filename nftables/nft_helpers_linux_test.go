package nftables_test

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// nsNFT returns an Interface for the family's table of the writer's
// default name in ns, made inside ns (knftables.New checks nft there). Its
// transactions reach ns only when Run is called from inside ns.Do.
func nsNFT(t testing.TB, ns *kerneltest.NS, family knftables.Family) knftables.Interface {
	t.Helper()
	var nft knftables.Interface
	if err := ns.Do(func() (err error) {
		nft, err = knftables.New(family, nftables.DefaultTableName)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return nft
}

// syncIn renders in with w inside ns: a full sync may list the table
// through nft, which must read ns's, never the host's.
func syncIn(t testing.TB, ns *kerneltest.NS, w *nftables.Writer, in *proxy.FamilyInput) nftables.SyncResult {
	t.Helper()
	var res nftables.SyncResult
	if err := ns.Do(func() error { res = w.Sync(context.Background(), in); return nil }); err != nil {
		t.Fatal(err)
	}
	return res
}

// applyIn renders in with w, runs the transaction with nft inside ns and
// reports the outcome to w, as a proxier would (the sync inside ns too,
// since a full sync may list the table through nft); it fails t if nft refused
// the transaction or if the sync was not full when wantFull says it must
// be (and the other way round).
func applyIn(t testing.TB, ns *kerneltest.NS, nft knftables.Interface, w *nftables.Writer, in *proxy.FamilyInput, wantFull bool) nftables.SyncResult {
	t.Helper()
	// The sync too runs inside ns: a full sync may list the table.
	var res nftables.SyncResult
	err := ns.Do(func() error {
		res = w.Sync(context.Background(), in)
		return nft.Run(context.Background(), res.Transaction)
	})
	w.Applied(err)
	if err != nil {
		t.Fatalf("nft refused the transaction: %v\n%s", err, res.Transaction)
	}
	if res.Full != wantFull {
		t.Fatalf("sync full=%v, want %v", res.Full, wantFull)
	}
	return res
}
