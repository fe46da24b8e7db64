package nftables_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterRequestedFullSyncKernel runs changesByHand on the kernel, in a
// throwaway namespace: the full sync asked for after each is a
// transaction the kernel takes (adding a chain or set that is there, then
// flushing and deleting it, is what makes it so), it leaves the chains and
// sets a new writer would write, and the partial sync after it applies.
func TestWriterRequestedFullSyncKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	for _, tc := range changesByHand {
		t.Run(tc.name, func(t *testing.T) {
			ns := kerneltest.NewNS(t)
			nft := nsNFT(t, ns, knftables.IPv4Family)
			w, err := nftables.NewWriter(nft, baseConfig())
			if err != nil {
				t.Fatal(err)
			}
			run := func(tx *knftables.Transaction) error {
				return ns.Do(func() error { return nft.Run(context.Background(), tx) })
			}
			apply := func(in *proxy.FamilyInput, wantFull bool) {
				t.Helper()
				// Inside ns: a full sync may list the table.
				var res nftables.SyncResult
				err := ns.Do(func() error {
					res = w.Sync(context.Background(), in)
					return nft.Run(context.Background(), res.Transaction)
				})
				w.Applied(err)
				if err != nil || res.Full != wantFull {
					t.Fatalf("sync: full %v, error %v; want full %v and no error\n%s", res.Full, err, wantFull, res.Transaction)
				}
			}
			c := changeByHandCluster()
			apply(c.input(), true)
			if tc.before != nil {
				tc.before(c)
				apply(c.input(), false)
			}
			if tc.byHand != nil {
				tx := nft.NewTransaction()
				tc.byHand(tx)
				if err := run(tx); err != nil {
					t.Fatalf("change by hand: %v", err)
				}
			}
			if tc.with != nil {
				tc.with(c)
			}
			w.RequestFullSync()
			apply(c.input(), true)

			fresh, fw := newFake(t, baseConfig())
			syncFake(t, fw, fresh, &proxy.FamilyInput{Services: c.ServiceMap, Endpoints: c.EndpointsMap, NodeLabels: c.NodeLabels})
			for _, kind := range []string{"chain", "set", "map"} {
				want, err := fresh.List(context.Background(), kind)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				if err := ns.Do(func() (err error) { got, err = nft.List(context.Background(), kind); return err }); err != nil {
					t.Fatal(err)
				}
				slices.Sort(want)
				slices.Sort(got)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%ss after the requested full sync (-new writer's +kernel):\n%s", kind, diff)
				}
			}

			afterRequestedFullSync(c)
			apply(c.input(), false)
			// The affinity sets were deleted and added again with the new
			// timeout (an "add" of an existing set does not change it).
			sets := ns.MustExec(t, "nft", "list", "sets", "ip")
			if n := strings.Count(sets, "timeout 5m"); n != 2 || strings.Count(sets, "timeout ") != 2 {
				t.Errorf("affinity sets after a partial sync that set their timeout to 300 s: %d of 5m, want 2 and no other:\n%s", n, sets)
			}
		})
	}
}

// TestWriterForcedFullSyncKernel checks, on the kernel, that a full sync
// asked for reads the elements back through nft and sends none of those
// the kernel holds unchanged (nft's listing of them must read as the
// writer writes them), and only the repair of one deleted by hand.
func TestWriterForcedFullSyncKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	nft := nsNFT(t, ns, knftables.IPv4Family)
	w, err := nftables.NewWriter(nft, baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := changeByHandCluster()
	c.setService(makeService("ns", "c", "10.96.0.3", withExternalIPs("192.0.2.3")))
	c.setEndpoints("ns", "c", tcp8080)
	applyIn(t, ns, nft, w, c.input(), true)

	w.RequestFullSync()
	res := applyIn(t, ns, nft, w, c.input(), true)
	if got := trackedElementLines(res.Transaction); len(got) != 0 {
		t.Errorf("forced full sync of an unchanged table sent element lines:\n%s", strings.Join(got, "\n"))
	}

	ns.MustExec(t, "nft", "delete", "element", "ip", nftables.DefaultTableName, "cluster-ips", "{ 10.96.0.2 }")
	w.RequestFullSync()
	res = applyIn(t, ns, nft, w, c.input(), true)
	want := []string{"add element ip kube-proxy cluster-ips { 10.96.0.2 }"}
	if diff := cmp.Diff(want, trackedElementLines(res.Transaction)); diff != "" {
		t.Errorf("forced full sync after an element was deleted by hand (-want +got):\n%s", diff)
	}
	if out := ns.MustExec(t, "nft", "list", "set", "ip", nftables.DefaultTableName, "cluster-ips"); !strings.Contains(out, "10.96.0.2") {
		t.Errorf("cluster-ips after the forced full sync lacks 10.96.0.2:\n%s", out)
	}
}
