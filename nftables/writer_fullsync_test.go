package nftables_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// changeByHand is another program's change to the writer's table, after
// which the caller asks for a full sync: the writer's memory of the table
// is then wrong.
type changeByHand struct {
	name string
	// before is synced, partially, before the change by hand.
	before func(c *cluster)
	// byHand, if not nil, is the other program's transaction.
	byHand func(tx *knftables.Transaction)
	// with arrives with the full sync.
	with func(c *cluster)
}

// changesByHand leave the table without a chain or an affinity set that
// the writer remembers and the full sync deletes; the last two change
// nothing by hand, for the same deletions of objects that exist.
var changesByHand = []changeByHand{
	{
		name:   "table deleted, with a shared chain that a partial sync left unused",
		before: func(c *cluster) { c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1")) },
		byHand: func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) },
	},
	{
		name:   "table deleted, then a service with affinity deleted",
		byHand: func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) },
		with:   func(c *cluster) { c.deleteService("ns", "b") },
	},
	{
		name:   "table deleted, then an affinity timeout changed",
		byHand: func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) },
		with:   func(c *cluster) { c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(200))) },
	},
	{
		name:   "an unused shared chain deleted by hand",
		before: func(c *cluster) { c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1")) },
		byHand: func(tx *knftables.Transaction) {
			tx.Flush(&knftables.Chain{Name: "lb-2"})
			tx.Delete(&knftables.Chain{Name: "lb-2"})
		},
	},
	{
		name: "table emptied by hand (deleted and added again), then a service with affinity deleted",
		byHand: func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Table{})
			tx.Add(&knftables.Table{Comment: ptr.To("service rules written by proxykit")})
		},
		with: func(c *cluster) { c.deleteService("ns", "b") },
	},
	{
		name: "nothing by hand, then a service with affinity deleted",
		with: func(c *cluster) { c.deleteService("ns", "b") },
	},
	{
		name: "nothing by hand, then an affinity timeout changed",
		with: func(c *cluster) { c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(200))) },
	},
}

// changeByHandCluster is the cluster changesByHand start from: a service
// of the shared chains (two endpoints, a node port) and one with
// affinity, whose chains and sets are its own.
func changeByHandCluster() *cluster {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "a", "10.96.0.1", withNodePort(30001)))
	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(100)))
	c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"), remote("10.0.2.2"))
	return c
}

// afterRequestedFullSync is the partial sync that follows the requested
// full sync in the tests: it deletes or changes what the full sync wrote,
// so it applies only if the writer's memory is the table again.
func afterRequestedFullSync(c *cluster) {
	c.deleteService("ns", "a")
	c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(300)))
}

// freshDump is the table a new writer writes for c's services.
func freshDump(t *testing.T, c *cluster, dump func(*knftables.Fake) string) string {
	t.Helper()
	fresh, fw := newFake(t, baseConfig())
	syncFake(t, fw, fresh, &proxy.FamilyInput{Services: c.ServiceMap, Endpoints: c.EndpointsMap, NodeLabels: c.NodeLabels})
	return dump(fresh)
}

// TestWriterRequestedFullSyncAfterChangesByHand checks that a full sync
// asked for with RequestFullSync, after another program changed the table
// (or deleted it), is a transaction the kernel takes: deleting what the
// writer remembers (a stale chain or set that went with the table) must
// not make it fail. Afterwards the table is what a new writer writes for
// the same services, and the writer's memory is right again: a partial
// sync after it applies too. TestWriterRequestedFullSyncKernel runs the
// same changes on the kernel.
func TestWriterRequestedFullSyncAfterChangesByHand(t *testing.T) {
	for _, tc := range changesByHand {
		t.Run(tc.name, func(t *testing.T) {
			c := changeByHandCluster()
			fake, w := newFake(t, baseConfig())
			syncFake(t, w, fake, c.input())
			if tc.before != nil {
				tc.before(c)
				if res := syncFake(t, w, fake, c.input()); res.Full {
					t.Fatal("the sync before the change by hand was full")
				}
			}
			if tc.byHand != nil {
				tx := fake.NewTransaction()
				tc.byHand(tx)
				if err := fake.Run(context.Background(), tx); err != nil {
					t.Fatalf("change by hand: %v", err)
				}
			}
			if tc.with != nil {
				tc.with(c)
			}

			w.RequestFullSync()
			res := w.Sync(context.Background(), c.input())
			err := nftablestest.CheckTransaction(fake, res.Transaction)
			if err == nil {
				err = fake.Run(context.Background(), res.Transaction)
			}
			w.Applied(err)
			if err != nil || !res.Full {
				t.Fatalf("requested full sync: full %v, error %v; want a full sync the kernel takes\n%s", res.Full, err, res.Transaction)
			}
			if diff := cmp.Diff(freshDump(t, c, normalDump), normalDump(fake)); diff != "" {
				t.Errorf("table after the requested full sync (-new writer's +got):\n%s", diff)
			}

			afterRequestedFullSync(c)
			if res := syncFake(t, w, fake, c.input()); res.Full {
				t.Error("the sync after the requested full sync was full")
			}
			if diff := cmp.Diff(freshDump(t, c, layoutDump), layoutDump(fake)); diff != "" {
				t.Errorf("table after the next partial sync (-new writer's +got):\n%s", diff)
			}
		})
	}
}
