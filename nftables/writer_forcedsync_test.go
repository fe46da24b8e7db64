package nftables_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// ListElements counts the listings of elements, which a full sync that
// trusts its memory must not need.
func (k *fakeKernel) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	k.listedElements++
	return k.Fake.ListElements(ctx, objectType, name)
}

// trackedElementLines are the lines of tx that add, delete or flush the
// elements of the sets and maps whose elements the writer tracks: all but
// firewall-allow and nodeport-ips, which a full sync flushes and fills.
func trackedElementLines(tx *knftables.Transaction) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(tx.String()), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[4] == "firewall-allow" || f[4] == "nodeport-ips" {
			continue
		}
		if f[1] == "element" || f[0] == "flush" && (f[1] == "set" || f[1] == "map") {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

// txLines renders fill's transaction on k as trackedElementLines does.
func txLines(k *fakeKernel, fill func(tx *knftables.Transaction)) []string {
	tx := k.NewTransaction()
	fill(tx)
	return trackedElementLines(tx)
}

// TestWriterForcedFullSyncSendsOnlyDifferences checks that a full sync
// asked for (RequestFullSync, in.Full) does not send again the elements the
// kernel holds unchanged: with the generation unchanged since the writer's
// last transaction it trusts its memory and lists nothing; otherwise (or
// without a KernelState) it reads the elements back and sends only what
// repairs them. A deleted table is loaded whole. The table afterwards is
// what a new writer writes.
func TestWriterForcedFullSyncSendsOnlyDifferences(t *testing.T) {
	for _, tc := range []struct {
		name string
		// byHand changes the table; want is the tracked element lines
		// of the forced sync, given the rig after its first sync.
		byHand func(r *resyncRig) func(tx *knftables.Transaction)
		want   func(r *resyncRig) []string
		// trusted: with a KernelState, the sync must not list elements.
		trusted bool
	}{{
		name:    "nothing changed",
		want:    func(*resyncRig) []string { return nil },
		trusted: true,
	}, {
		name: "an endpoint element deleted by hand",
		byHand: func(r *resyncRig) func(tx *knftables.Transaction) {
			el := r.firstElement("endpoints")
			return func(tx *knftables.Transaction) { tx.Delete(el) }
		},
		want: func(r *resyncRig) []string {
			el := r.firstElement("endpoints")
			return txLines(r.k, func(tx *knftables.Transaction) { tx.Add(el) })
		},
	}, {
		name: "a cluster IP added by hand",
		byHand: func(*resyncRig) func(tx *knftables.Transaction) {
			return func(tx *knftables.Transaction) {
				tx.Add(&knftables.Element{Set: "cluster-ips", Key: []string{"10.96.9.9"}})
			}
		},
		want: func(r *resyncRig) []string {
			return txLines(r.k, func(tx *knftables.Transaction) {
				tx.Delete(&knftables.Element{Set: "cluster-ips", Key: []string{"10.96.9.9"}})
			})
		},
	}, {
		name: "a verdict changed by hand",
		byHand: func(r *resyncRig) func(tx *knftables.Transaction) {
			el := r.firstElement("service-ips")
			changed := &knftables.Element{Map: el.Map, Key: el.Key, Value: []string{"goto reject-chain"}}
			return func(tx *knftables.Transaction) { tx.Delete(el); tx.Add(changed) }
		},
		want: func(r *resyncRig) []string {
			el := r.firstElement("service-ips")
			changed := &knftables.Element{Map: el.Map, Key: el.Key, Value: []string{"goto reject-chain"}}
			return txLines(r.k, func(tx *knftables.Transaction) { tx.Delete(changed); tx.Add(el) })
		},
	}, {
		name: "table deleted",
		byHand: func(*resyncRig) func(tx *knftables.Transaction) {
			return func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) }
		},
		want: func(r *resyncRig) []string {
			_, fw := newFake(t, baseConfig())
			return trackedElementLines(fw.Sync(context.Background(), r.c.input()).Transaction)
		},
	}} {
		for _, state := range []string{"", "plain"} {
			t.Run(tc.name+"/kernelState="+state, func(t *testing.T) {
				r := newResyncRig(t, state)
				want := tc.want(r)
				if tc.byHand != nil {
					r.byHand(tc.byHand(r))
				}
				r.k.listedElements = 0
				r.w.RequestFullSync()
				res := r.sync()
				if !res.Full {
					t.Fatal("the requested sync was not full")
				}
				if diff := cmp.Diff(want, trackedElementLines(res.Transaction)); diff != "" {
					t.Errorf("element lines of the forced full sync (-want +got):\n%s\ntransaction:\n%s", diff, res.Transaction)
				}
				if tc.trusted && state != "" && r.k.listedElements != 0 {
					t.Errorf("the writer listed elements %d times; want none, the generation says the kernel holds what it wrote", r.k.listedElements)
				}
				if diff := cmp.Diff(freshDump(t, r.c, normalDump), normalDump(r.k.Fake)); diff != "" {
					t.Errorf("table after the forced full sync (-new writer's +got):\n%s", diff)
				}
				// The writer's memory is the table again: a partial sync
				// applies, and leaves what a new writer writes.
				afterRequestedFullSync(r.c)
				if res := r.sync(); res.Full {
					t.Error("the sync after the forced full sync was full")
				}
				if diff := cmp.Diff(freshDump(t, r.c, layoutDump), layoutDump(r.k.Fake)); diff != "" {
					t.Errorf("table after the next partial sync (-new writer's +got):\n%s", diff)
				}
			})
		}
	}
}

// TestWriterFullSyncAfterFailureReadsBack checks that the full sync after
// a failed transaction, whose outcome leaves the writer's memory in doubt,
// reads the elements back and sends what the failed partial sync would
// have sent, not every element.
func TestWriterFullSyncAfterFailureReadsBack(t *testing.T) {
	change := func(c *cluster) {
		c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"), remote("10.0.2.9"))
	}
	ok := newResyncRig(t, "plain")
	change(ok.c)
	want := trackedElementLines(ok.sync().Transaction)

	r := newResyncRig(t, "plain")
	change(r.c)
	r.w.Sync(context.Background(), r.c.input())
	r.w.Applied(errors.New("nft refused it"))
	r.k.listedElements = 0
	res := r.sync()
	if !res.Full {
		t.Fatal("the sync after a failure was not full")
	}
	if r.k.listedElements == 0 {
		t.Error("the full sync after a failure did not read the elements back")
	}
	if diff := cmp.Diff(want, trackedElementLines(res.Transaction)); diff != "" {
		t.Errorf("element lines of the full sync after a failure (-the partial sync's +got):\n%s", diff)
	}
	if diff := cmp.Diff(freshDump(t, r.c, normalDump), normalDump(r.k.Fake)); diff != "" {
		t.Errorf("table after the full sync (-new writer's +got):\n%s", diff)
	}
}
