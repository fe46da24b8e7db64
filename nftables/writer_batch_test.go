package nftables_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// batchTransaction is b as one knftables transaction on fake. Run on the
// Fake, it stands for ApplyElementBatch on the kernel
// (TestApplyElementBatchKernel checks that the kernel makes the same of
// both).
func batchTransaction(fake *knftables.Fake, b *nftables.ElementBatch) *knftables.Transaction {
	tx := fake.NewTransaction()
	b.AddTo(tx)
	return tx
}

// syncBatch syncs w as nftables.Mode over a real Interface does: the
// transaction, or the batch in its place, runs on fake (checked against
// what the kernel refuses first), and the outcome goes to Applied.
func syncBatch(t testing.TB, w *nftables.Writer, fake *knftables.Fake, in *proxy.FamilyInput) nftables.SyncResult {
	t.Helper()
	res := w.Sync(context.Background(), in)
	tx := res.Transaction
	if res.Batch != nil {
		if n := tx.NumOperations(); n != 0 {
			t.Fatalf("a sync with a netlink batch has %d operations in its transaction too:\n%s", n, tx)
		}
		tx = batchTransaction(fake, res.Batch)
	}
	err := nftablestest.CheckTransaction(fake, tx)
	if err == nil {
		err = fake.Run(context.Background(), tx)
	}
	w.Applied(err)
	if err != nil {
		t.Fatalf("running the sync (full %v, batch %v):\n%s\nerror: %v", res.Full, res.Batch != nil, tx, err)
	}
	return res
}

// loadBatchCluster is the cluster of the netlink-batch tests: a service
// with two endpoints, one with one (so that the shared chains of one
// endpoint exist), an affinity service, a load balancer with source
// ranges, and a service without endpoints.
func loadBatchCluster(c *cluster) {
	c.setService(makeService("ns", "a", "10.96.0.1", withNodePort(30001), withExternalIPs("192.0.2.1")))
	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	c.setService(makeService("ns", "one", "10.96.0.5", withNodePort(30005), withExternalIPs("192.0.2.5")))
	c.setEndpoints("ns", "one", tcp8080, remote("10.0.2.5"))
	c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(100)))
	c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"), remote("10.0.2.2"))
	c.setService(makeService("ns", "c", "10.96.0.3", withLoadBalancer("203.0.113.3", "198.51.100.0/24")))
	c.setEndpoints("ns", "c", tcp8080, remote("10.0.2.3"))
	c.setService(makeService("ns", "empty", "10.96.0.4"))
}

// TestWriterNetlinkElementSyncs checks which partial syncs
// NetlinkElementSyncs sends as a netlink batch: those whose every change
// is an element of the big maps and sets (endpoints replaced, removed
// while a shared chain of the new count exists, a service added or
// removed); and which stay one nft transaction: a change with a chain
// (new endpoint count, affinity), a commented element (the no-endpoint
// maps), an interval set (source ranges). Either way the writer beside it
// without the option makes the same changes, in the same order (the
// batch is its transaction, deletions first), and the two tables end
// equal.
func TestWriterNetlinkElementSyncs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		change    func(c *cluster)
		wantBatch bool
	}{
		{"endpoint replaced", func(c *cluster) {
			c.setEndpoints("ns", "a", tcp8080, local("10.0.1.9"), remote("10.0.2.1"))
		}, true},
		{"endpoint removed, count 2 to 1", func(c *cluster) {
			c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
		}, true},
		{"service added", func(c *cluster) {
			c.setService(makeService("ns", "d", "10.96.0.6", withNodePort(30006), withExternalIPs("192.0.2.6")))
			c.setEndpoints("ns", "d", tcp8080, local("10.0.1.6"), remote("10.0.2.6"))
		}, true},
		{"service removed", func(c *cluster) {
			c.deleteService("ns", "a")
			c.setEndpoints("ns", "a", tcp8080)
		}, true},
		{"endpoint added, count 2 to 3: new shared chains", func(c *cluster) {
			c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"), remote("10.0.2.9"))
		}, false},
		{"all endpoints gone: commented no-endpoint elements", func(c *cluster) {
			c.setEndpoints("ns", "a", tcp8080)
		}, false},
		{"endpoints for a service without: a commented element goes", func(c *cluster) {
			c.setEndpoints("ns", "empty", tcp8080, remote("10.0.2.4"))
		}, false},
		{"affinity service's endpoint removed: its chains", func(c *cluster) {
			c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"))
		}, false},
		{"source ranges changed: an interval set", func(c *cluster) {
			c.setService(makeService("ns", "c", "10.96.0.3", withLoadBalancer("203.0.113.3", "198.51.100.0/25")))
		}, false},
		{"nothing changed", func(c *cluster) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			loadBatchCluster(c)
			plainFake, plain := newFake(t, baseConfig())
			cfg := baseConfig()
			cfg.NetlinkElementSyncs = true
			fake, w := newFake(t, cfg)
			in := c.input()
			syncFake(t, plain, plainFake, in)
			if res := syncBatch(t, w, fake, in); !res.Full || res.Batch != nil {
				t.Fatalf("first sync: full=%v, batch %v; want a full transaction", res.Full, res.Batch != nil)
			}

			tc.change(c)
			in = c.input()
			want := syncFake(t, plain, plainFake, in)
			res := syncBatch(t, w, fake, in)
			if res.Full || want.Full {
				t.Fatalf("full=%v (without the option %v), want a partial sync", res.Full, want.Full)
			}
			if (res.Batch != nil) != tc.wantBatch {
				t.Fatalf("netlink batch %v, want %v; the transaction:\n%s", res.Batch != nil, tc.wantBatch, want.Transaction)
			}
			got := res.Transaction
			if res.Batch != nil {
				if res.Batch.Len() == 0 {
					t.Error("empty batch")
				}
				got = batchTransaction(fake, res.Batch)
			}
			if diff := cmp.Diff(want.Transaction.String(), got.String()); diff != "" {
				t.Errorf("changes differ from the transaction without the option (-transaction +got):\n%s", diff)
			}
			if diff := cmp.Diff(normalDump(plainFake), normalDump(fake)); diff != "" {
				t.Errorf("tables differ (-without the option +with):\n%s", diff)
			}
		})
	}
}

// TestWriterNetlinkElementSyncsFull checks that full syncs are never a
// batch (the first, a requested one, the one after a failed batch), that
// a first load split by SplitFirstLoad stays split rather than batched,
// and that a failed batch makes the next sync full.
func TestWriterNetlinkElementSyncsFull(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	loadBatchCluster(c)
	cfg := baseConfig()
	cfg.NetlinkElementSyncs, cfg.SplitFirstLoad = true, true
	fake, w := newFake(t, cfg)
	res := w.Sync(context.Background(), c.input())
	if !res.Full || res.Batch != nil || len(res.Elements) == 0 {
		t.Fatalf("first sync: full=%v, batch %v, %d elements split off; want a full sync split, not batched", res.Full, res.Batch != nil, len(res.Elements))
	}
	err := fake.Run(context.Background(), res.Transaction)
	if err == nil {
		err = fake.Run(context.Background(), batchTransaction(fake, &nftables.ElementBatch{Add: res.Elements}))
	}
	w.Applied(err)
	if err != nil {
		t.Fatal(err)
	}

	w.RequestFullSync()
	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.9"), remote("10.0.2.1"))
	if res := syncBatch(t, w, fake, c.input()); !res.Full || res.Batch != nil {
		t.Fatalf("requested full sync: full=%v, batch %v; want a full transaction", res.Full, res.Batch != nil)
	}

	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	res = w.Sync(context.Background(), c.input())
	if res.Full || res.Batch == nil {
		t.Fatalf("endpoint replaced: full=%v, batch %v; want a partial batch", res.Full, res.Batch != nil)
	}
	w.Applied(errors.New("netlink: the kernel refused the batch"))
	if res := syncBatch(t, w, fake, c.input()); !res.Full || res.Batch != nil {
		t.Fatalf("sync after a failed batch: full=%v, batch %v; want a full transaction", res.Full, res.Batch != nil)
	}
}

// TestWriterNetlinkElementSyncsResync checks that the writer counts a
// batch as one commit of its own: after a partial sync sent as a batch
// (one generation, as ApplyElementBatch commits), the periodic resync is
// skipped, with and without a watcher, as after a transaction. Counting
// the batch as no commit would make the resync compare the table
// (ResyncChecked), counting two would do the same.
func TestWriterNetlinkElementSyncsResync(t *testing.T) {
	for _, state := range []string{"plain", "watch"} {
		t.Run(state, func(t *testing.T) {
			r := newResyncRig(t, state, func(cfg *nftables.WriterConfig) { cfg.NetlinkElementSyncs = true })
			r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.9"))
			gen := r.k.gen
			res := r.sync()
			if res.Batch == nil || r.k.gen != gen+1 {
				t.Fatalf("endpoint replaced: batch %v, %d generations; want a batch, one generation", res.Batch != nil, r.k.gen-gen)
			}
			if res := r.resync(); res.Resync != nftables.ResyncSkipped || res.Full {
				t.Errorf("resync after the writer's own batch: %v, full=%v; want skipped", res.Resync, res.Full)
			}
			// Another program's batch on the table is still seen.
			el := r.firstElement("endpoints")
			r.byHand(func(tx *knftables.Transaction) { tx.Delete(el) })
			if res := r.resync(); res.Resync != nftables.ResyncChecked || res.Drifted != 1 {
				t.Errorf("resync after another's deletion: %v, %d drifted; want checked, 1", res.Resync, res.Drifted)
			}
		})
	}
}
