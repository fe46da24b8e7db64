package nftables_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
)

// lister lists a fakeKernel's sets and elements as NewKernelState's
// TableLister lists the kernel's.
type lister struct{ k *fakeKernel }

func (l lister) Sets(family knftables.Family, table string) (map[string]bool, error) {
	t := l.k.table(family, table)
	if t == nil {
		return nil, fmt.Errorf("table %s %s: %w", family, table, nftables.ErrTableNotFound)
	}
	out := map[string]bool{}
	for name := range t.Sets {
		out[name] = false
	}
	for name := range t.Maps {
		out[name] = true
	}
	return out, nil
}

func (l lister) ElementKeys(family knftables.Family, table, set string) ([]string, error) {
	t := l.k.table(family, table)
	if t == nil {
		return nil, fmt.Errorf("table %s %s: %w", family, table, nftables.ErrTableNotFound)
	}
	var elems []*knftables.Element
	if m := t.Maps[set]; m != nil {
		elems = m.Elements
	} else if s := t.Sets[set]; s != nil {
		elems = s.Elements
	} else {
		return nil, fmt.Errorf("no set %s", set)
	}
	keys := make([]string, len(elems))
	for i, el := range elems {
		keys[i] = strings.Join(el.Key, " . ")
	}
	return keys, nil
}

type listingKernel struct {
	*fakeKernel
	lister
}

type listingWatcher struct {
	*watchingKernel
	lister
}

var (
	_ nftables.TableLister  = listingKernel{}
	_ nftables.TableWatcher = listingWatcher{}
	_ nftables.TableLister  = listingWatcher{}
)

// withLister makes a resync rig's KernelState a TableLister too.
func withLister(cfg *nftables.WriterConfig) {
	switch ks := cfg.KernelState.(type) {
	case *fakeKernel:
		cfg.KernelState = listingKernel{ks, lister{ks}}
	case *watchingKernel:
		cfg.KernelState = listingWatcher{ks, lister{ks.fakeKernel}}
	}
}

// TestWriterRepairsDriftOnRequest checks that a sync after
// RequestResync, before any periodic resync is due, repairs what another
// program changed in the table, by comparison and without a full sync,
// whether the KernelState follows the namespace's commits ("watch") or
// not ("plain"): what it deleted comes back, and what it added (elements,
// chains, rules in the writer's chains, sets, maps) goes, so that the
// table is again exactly the writer's. A second requested resync then
// finds nothing: the repair is not taken for another's change.
func TestWriterRepairsDriftOnRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(r *resyncRig, tx *knftables.Transaction)
		// hourly: without a watcher, the change is found only by the
		// thorough comparison, once a FullSyncPeriod (an element of the
		// endpoints maps).
		hourly bool
	}{
		{
			name: "an endpoints element deleted",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				el := *r.firstElement("endpoints")
				tx.Delete(&el)
			},
			hourly: true,
		},
		{
			name: "a cluster IP element deleted",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				el := *r.firstElement("cluster-ips")
				tx.Delete(&el)
			},
		},
		{
			name: "a verdict map element added",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Element{Map: "service-ips", Key: []string{"10.96.9.9", "tcp", "80"}, Value: []string{"goto reject-chain"}})
			},
		},
		{
			name: "a set element added",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Element{Set: "cluster-ips", Key: []string{"10.96.9.9"}})
			},
		},
		{
			name: "an endpoints element added",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Element{Map: "endpoints", Key: []string{"10.96.0.1", "tcp", "80", "7"}, Value: []string{"10.9.9.9", "80"}})
			},
			hourly: true,
		},
		{
			name: "a chain added",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Chain{Name: "intruder"})
				tx.Add(&knftables.Rule{Chain: "intruder", Rule: "accept"})
			},
		},
		{
			name: "a rule added to a static chain, jumping to an added chain",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Chain{Name: "intruder"})
				tx.Add(&knftables.Rule{Chain: "services", Rule: "ip daddr 10.96.9.9 jump intruder"})
			},
		},
		{
			name: "a rule added to a shared chain",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Rule{Chain: "lb-2", Rule: "ip daddr 10.96.9.9 drop"})
			},
		},
		{
			name: "a set and a map added",
			change: func(r *resyncRig, tx *knftables.Transaction) {
				tx.Add(&knftables.Set{Name: "intruders", Type: "ipv4_addr"})
				tx.Add(&knftables.Element{Set: "intruders", Key: []string{"192.0.2.9"}})
				tx.Add(&knftables.Map{Name: "intruder-map", Type: "ipv4_addr : verdict"})
			},
		},
	} {
		for _, state := range []string{"plain", "watch"} {
			t.Run(state+"/"+tc.name, func(t *testing.T) {
				r := newResyncRig(t, state, withLister)
				want := normalDump(r.k.Fake)
				r.byHand(func(tx *knftables.Transaction) { tc.change(r, tx) })
				if normalDump(r.k.Fake) == want {
					t.Fatal("the change by hand changed nothing")
				}
				r.w.RequestResync()
				res := r.sync()
				hourly := tc.hourly && state == "plain"
				if res.Full || res.Resync != nftables.ResyncChecked || (res.Drifted == 0) != hourly {
					t.Errorf("repair: full %v, %v, %d drifted; want a partial sync that checked and found drift (unless %v)\n%s", res.Full, res.Resync, res.Drifted, hourly, res.Transaction)
				}
				got := normalDump(r.k.Fake)
				if hourly {
					if got == want {
						t.Fatal("an endpoints element added by hand was found before the periodic resync without a watcher")
					}
					res = r.resync()
					if res.Full || res.Resync != nftables.ResyncChecked || res.Drifted != 1 {
						t.Errorf("periodic resync: full %v, %v, %d drifted; want a partial sync that repaired one\n%s", res.Full, res.Resync, res.Drifted, res.Transaction)
					}
					got = normalDump(r.k.Fake)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("table after the repair (-want +got):\n%s\ntransaction:\n%s", diff, res.Transaction)
				}
				r.w.RequestResync()
				if res := r.sync(); res.Resync != nftables.ResyncSkipped || res.Transaction.NumOperations() != 0 {
					t.Errorf("resync after the repair: %v with %d operations, want skipped with none:\n%s", res.Resync, res.Transaction.NumOperations(), res.Transaction)
				}
			})
		}
	}
}

// TestWriterDrifted checks when Writer.Drifted says another program may
// have changed the table: not after the writer's own syncs, not after a
// commit to another table that a TableWatcher saw, and not while a full
// sync is coming anyway; after a change to the table, until a sync
// repaired it.
func TestWriterDrifted(t *testing.T) {
	for _, state := range []string{"plain", "watch"} {
		t.Run(state, func(t *testing.T) {
			r := newResyncRig(t, state, withLister)
			check := func(when string, want bool) {
				t.Helper()
				got, err := r.w.Drifted()
				if err != nil || got != want {
					t.Errorf("%s: Drifted() = %v, %v; want %v", when, got, err, want)
				}
			}
			check("after the first sync", false)
			r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
			r.sync()
			check("after the writer's own partial sync", false)
			r.k.gen++
			check("after a commit to another table", state == "plain")
			r.w.RequestResync()
			r.sync()
			check("after the resync that compared", false)
			el := *r.firstElement("cluster-ips")
			r.byHand(func(tx *knftables.Transaction) { tx.Delete(&el) })
			check("after an element deleted by hand", true)
			r.w.RequestFullSync()
			check("with a full sync requested", false)
			r.sync()
			check("after the full sync", false)
			r.byHand(func(tx *knftables.Transaction) { tx.Delete(&el) })
			res := r.w.Sync(context.Background(), r.c.input())
			check("before the outcome of a sync is reported", false)
			r.w.Applied(r.k.Run(context.Background(), res.Transaction))
			// The watcher said what changed, and that sync compared it;
			// without one, only a resync compares.
			check("after the next sync", state == "plain")
			r.w.RequestResync()
			r.sync()
			check("after a requested resync", false)
		})
	}
}
