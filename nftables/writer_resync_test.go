package nftables_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
)

// fakeKernel is a knftables.Fake with the nf_tables generation the kernel
// keeps, and a KernelState that reads both as the netlink one reads the
// kernel: the generation goes up by one for every transaction with
// operations that the Fake applies (a refused one changes nothing), and
// RuleCounts and CheckElements read the Fake's table.
type fakeKernel struct {
	*knftables.Fake
	gen    uint32
	genErr error
	// checkErr, when set, is CheckElements' error.
	checkErr error
	// checked counts the elements CheckElements was asked about.
	checked int
	// touched holds, by generation, what the batches run on the Fake's
	// table changed; a generation bumped by hand (gen++) is another
	// program's batch on a table of its own.
	touched map[uint32]nftables.TableChanges
	// listedElements counts ListElements calls.
	listedElements int
}

func (k *fakeKernel) Run(ctx context.Context, tx *knftables.Transaction) error {
	if err := k.Fake.Run(ctx, tx); err != nil {
		return err
	}
	if tx.NumOperations() > 0 {
		k.gen++
		k.touched[k.gen] = txChanges(tx)
	}
	return nil
}

// txChanges is what a transaction on the Fake's table changes, as the
// kernel's notifications say it: the chains of chain and rule operations,
// the keys of element operations, and everything for the rest.
func txChanges(tx *knftables.Transaction) nftables.TableChanges {
	ch := nftables.TableChanges{Touched: true, Chains: map[string]bool{}, Elements: map[string]map[string]bool{}}
	for _, line := range strings.Split(strings.TrimSpace(tx.String()), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			ch.All = true
			continue
		}
		switch f[1] {
		case "chain", "rule":
			ch.Chains[f[4]] = true
		case "element":
			key, _, _ := strings.Cut(strings.TrimPrefix(strings.Join(f[5:], " "), "{ "), " :")
			key = strings.TrimSuffix(key, " }")
			if ch.Elements[f[4]] == nil {
				ch.Elements[f[4]] = map[string]bool{}
			}
			ch.Elements[f[4]][key] = true
		default:
			ch.All = true
		}
	}
	return ch
}

// watchingKernel is a fakeKernel that is also a TableWatcher, as
// KernelWatcher is: it knows which batches touched the table, except
// those up to lostThrough.
type watchingKernel struct {
	*fakeKernel
	lostThrough uint32
}

func (k *watchingKernel) Changes(family knftables.Family, table string, after, upTo uint32) (nftables.TableChanges, bool) {
	if family != knftables.IPv4Family || table != nftables.DefaultTableName {
		return nftables.TableChanges{}, true
	}
	if k.lostThrough > after {
		return nftables.TableChanges{}, false
	}
	out := nftables.TableChanges{Chains: map[string]bool{}, Elements: map[string]map[string]bool{}}
	for g := after + 1; g <= upTo; g++ {
		ch, ok := k.touched[g]
		if !ok {
			continue
		}
		out.Touched = true
		out.All = out.All || ch.All
		for c := range ch.Chains {
			out.Chains[c] = true
		}
		for set, keys := range ch.Elements {
			if out.Elements[set] == nil {
				out.Elements[set] = map[string]bool{}
			}
			for key := range keys {
				out.Elements[set][key] = true
			}
		}
	}
	return out, true
}

func (k *fakeKernel) Generation() (uint32, error) { return k.gen, k.genErr }

func (k *fakeKernel) table(family knftables.Family, table string) *knftables.FakeTable {
	return k.Fake.Tables[family][table]
}

func (k *fakeKernel) RuleCounts(family knftables.Family, table string) (map[string]int, error) {
	t := k.table(family, table)
	if t == nil {
		return nil, fmt.Errorf("table %s %s: %w", family, table, nftables.ErrTableNotFound)
	}
	counts := map[string]int{}
	for name, c := range t.Chains {
		counts[name] = len(c.Rules)
	}
	return counts, nil
}

func (k *fakeKernel) CheckElements(elements []*knftables.Element) ([]nftables.ElementState, error) {
	if k.checkErr != nil {
		return nil, k.checkErr
	}
	k.checked += len(elements)
	out := make([]nftables.ElementState, len(elements))
	for i, el := range elements {
		t := k.table(el.Family, el.Table)
		if t == nil {
			return nil, fmt.Errorf("element %v: no table %s %s", el.Key, el.Family, el.Table)
		}
		var found *knftables.Element
		if el.Map != "" {
			m := t.Maps[el.Map]
			if m == nil {
				return nil, fmt.Errorf("element %v: no map %s", el.Key, el.Map)
			}
			found = m.FindElement(el.Key...)
		} else {
			s := t.Sets[el.Set]
			if s == nil {
				return nil, fmt.Errorf("element %v: no set %s", el.Key, el.Set)
			}
			found = s.FindElement(el.Key...)
		}
		switch {
		case found == nil:
			out[i] = nftables.ElementMissing
		case strings.Join(found.Value, " ") != strings.Join(el.Value, " "):
			out[i] = nftables.ElementDiffers
		}
	}
	return out, nil
}

// resyncRig is a writer with a periodic resync on a fakeKernel, its clock
// and a loaded cluster.
type resyncRig struct {
	t     *testing.T
	k     *fakeKernel
	w     *nftables.Writer
	c     *cluster
	clock *clocktesting.FakeClock
	state nftables.KernelState
}

const resyncPeriod = time.Hour

// newResyncRig makes a rig whose writer has no KernelState (state ""), a
// fakeKernel ("plain") or a watchingKernel ("watch"), and whatever opts
// change in its configuration.
func newResyncRig(t *testing.T, state string, opts ...func(*nftables.WriterConfig)) *resyncRig {
	k := &fakeKernel{Fake: knftables.NewFake(knftables.IPv4Family, nftables.DefaultTableName), touched: map[uint32]nftables.TableChanges{}}
	clock := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	cfg := baseConfig()
	cfg.FullSyncPeriod = resyncPeriod
	cfg.Clock = clock
	switch state {
	case "plain":
		cfg.KernelState = k
	case "watch":
		cfg.KernelState = &watchingKernel{fakeKernel: k}
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	w, err := nftables.NewWriter(k, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "a", "10.96.0.1", withNodePort(30001), withExternalIPs("192.0.2.1")))
	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(100)))
	c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"), remote("10.0.2.2"))
	c.setService(makeService("ns", "c", "10.96.0.3", withLoadBalancer("203.0.113.3", "198.51.100.0/24")))
	c.setEndpoints("ns", "c", tcp8080)
	r := &resyncRig{t: t, k: k, w: w, c: c, clock: clock, state: cfg.KernelState}
	if res := r.sync(); !res.Full {
		t.Fatal("first sync not full")
	}
	return r
}

// sync runs one sync as a proxier does (an empty transaction is not run;
// a netlink batch runs as one transaction, one generation).
func (r *resyncRig) sync() nftables.SyncResult {
	r.t.Helper()
	res := r.w.Sync(context.Background(), r.c.input())
	tx := res.Transaction
	if res.Batch != nil {
		tx = batchTransaction(r.k.Fake, res.Batch)
	}
	var err error
	if tx.NumOperations() > 0 {
		if err = nftablestest.CheckTransaction(r.k.Fake, tx); err == nil {
			err = r.k.Run(context.Background(), tx)
		}
	}
	r.w.Applied(err)
	if err != nil {
		r.t.Fatalf("running the sync:\n%s\nerror: %v", res.Transaction, err)
	}
	return res
}

// resync lets the period pass and syncs.
func (r *resyncRig) resync() nftables.SyncResult {
	r.t.Helper()
	r.clock.Step(resyncPeriod)
	return r.sync()
}

// byHand runs a transaction of another program's, filled by fill, on the
// Fake's table.
func (r *resyncRig) byHand(fill func(tx *knftables.Transaction)) {
	r.t.Helper()
	tx := r.k.NewTransaction()
	fill(tx)
	if err := r.k.Run(context.Background(), tx); err != nil {
		r.t.Fatalf("change by hand: %v", err)
	}
}

// firstElement returns the first element of the writer's set or map.
func (r *resyncRig) firstElement(name string) *knftables.Element {
	r.t.Helper()
	t := r.k.Table
	if m := t.Maps[name]; m != nil && len(m.Elements) > 0 {
		return m.Elements[0]
	}
	if s := t.Sets[name]; s != nil && len(s.Elements) > 0 {
		return s.Elements[0]
	}
	r.t.Fatalf("no element in %s", name)
	return nil
}

// TestWriterResync checks the periodic resync's decisions with a
// KernelState: what the transaction holds, and that the table afterwards
// is the one the writer wrote.
func TestWriterResync(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change is what happens between the load and the resync.
		change      func(r *resyncRig)
		wantResync  nftables.Resync
		wantFull    bool
		wantDrifted int
		// wantOps is the resync transaction's operations, in order, as
		// "verb kind name" lines (the first line of each's nft text);
		// nil for a full sync, which is not compared.
		wantOps []string
		// own: the writer changed the table in change; the table after
		// the resync must be the one after change, not before it.
		own bool
		// unvouched: the resync could not learn the generation, so the
		// one after it checks again before skipping.
		unvouched bool
		// fullAfterOwn: the resync is a full sync after the writer's own
		// change, which also deletes the shared chains that change left
		// unused: the table is compared with a fresh writer's.
		fullAfterOwn bool
	}{
		{
			name:       "nothing changed",
			change:     func(*resyncRig) {},
			wantResync: nftables.ResyncSkipped,
			wantOps:    []string{},
		},
		{
			name:       "only the writer's own partial syncs since",
			change:     func(r *resyncRig) { r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1")); r.sync() },
			wantResync: nftables.ResyncSkipped,
			wantOps:    []string{},
			own:        true,
		},
		{
			name:       "another program committed to its own table",
			change:     func(r *resyncRig) { r.k.gen++ },
			wantResync: nftables.ResyncChecked,
			wantOps:    []string{},
		},
		{
			name: "an endpoints element deleted by hand",
			change: func(r *resyncRig) {
				el := *r.firstElement("endpoints")
				r.byHand(func(tx *knftables.Transaction) { tx.Delete(&el) })
			},
			wantResync:  nftables.ResyncChecked,
			wantDrifted: 1,
			wantOps:     []string{"add element ip kube-proxy endpoints"},
		},
		{
			name: "a service-ips element pointed elsewhere by hand",
			change: func(r *resyncRig) {
				el := *r.firstElement("service-ips")
				r.byHand(func(tx *knftables.Transaction) {
					tx.Delete(&el)
					other := el
					other.Value = []string{"goto reject-chain"}
					tx.Add(&other)
				})
			},
			wantResync:  nftables.ResyncChecked,
			wantDrifted: 1,
			wantOps:     []string{"delete element ip kube-proxy service-ips", "add element ip kube-proxy service-ips"},
		},
		{
			name: "a no-endpoint element deleted by hand",
			change: func(r *resyncRig) {
				el := *r.firstElement("no-endpoint-services")
				r.byHand(func(tx *knftables.Transaction) { tx.Delete(&el) })
			},
			wantResync:  nftables.ResyncChecked,
			wantDrifted: 1,
			wantOps:     []string{"add element ip kube-proxy no-endpoint-services"},
		},
		{
			name: "a rule of the services chain deleted by hand",
			change: func(r *resyncRig) {
				rule := *r.k.Table.Chains["services"].Rules[0]
				r.byHand(func(tx *knftables.Transaction) { tx.Delete(&rule) })
			},
			wantResync:  nftables.ResyncChecked,
			wantDrifted: 1,
			wantOps:     []string{"add chain ip kube-proxy services", "flush chain ip kube-proxy services", "add rule ip kube-proxy services", "add rule ip kube-proxy services"},
		},
		{
			name: "a shared chain's rule deleted by hand",
			change: func(r *resyncRig) {
				rule := *r.k.Table.Chains["lb-2"].Rules[1]
				r.byHand(func(tx *knftables.Transaction) { tx.Delete(&rule) })
			},
			wantResync:  nftables.ResyncChecked,
			wantDrifted: 1,
			wantOps: []string{"add chain ip kube-proxy lb-2", "flush chain ip kube-proxy lb-2", "add rule ip kube-proxy lb-2",
				"add rule ip kube-proxy lb-2", "add rule ip kube-proxy lb-2", "add rule ip kube-proxy lb-2"},
		},
		{
			name: "a per-service chain's rule deleted by hand",
			change: func(r *resyncRig) {
				for name, c := range r.k.Table.Chains {
					if strings.HasPrefix(name, "service-") && strings.Contains(name, "/") && len(c.Rules) > 0 {
						rule := *c.Rules[0]
						r.byHand(func(tx *knftables.Transaction) { tx.Delete(&rule) })
						return
					}
				}
				r.t.Fatal("no per-service chain")
			},
			wantResync: nftables.ResyncRewrite,
			wantFull:   true,
		},
		{
			name: "the table deleted by hand",
			change: func(r *resyncRig) {
				r.byHand(func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
			},
			wantResync: nftables.ResyncRewrite,
			wantFull:   true,
		},
		{
			name: "the generation cannot be read",
			change: func(r *resyncRig) {
				r.k.genErr = errors.New("no netlink")
			},
			wantResync: nftables.ResyncChecked,
			wantOps:    []string{},
			unvouched:  true,
		},
		{
			name: "the elements cannot be compared",
			change: func(r *resyncRig) {
				r.k.gen++
				r.k.checkErr = errors.New("no netlink")
			},
			wantResync: nftables.ResyncRewrite,
			wantFull:   true,
		},
		{
			name: "another program committed between the writer's render and run",
			change: func(r *resyncRig) {
				r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
				res := r.w.Sync(context.Background(), r.c.input())
				r.k.gen++
				r.w.Applied(r.k.Run(context.Background(), res.Transaction))
			},
			wantResync: nftables.ResyncChecked,
			wantOps:    []string{},
			own:        true,
		},
		{
			// The transaction is run but never reported: the writer
			// cannot know what the kernel holds.
			name: "a partial sync that was never reported",
			change: func(r *resyncRig) {
				r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
				res := r.w.Sync(context.Background(), r.c.input())
				if err := r.k.Run(context.Background(), res.Transaction); err != nil {
					r.t.Fatal(err)
				}
			},
			wantResync:   nftables.ResyncNone,
			wantFull:     true,
			fullAfterOwn: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newResyncRig(t, "plain")
			want := normalDump(r.k.Fake)
			tc.change(r)
			if tc.own {
				want = normalDump(r.k.Fake)
			}
			res := r.resync()
			if res.Resync != tc.wantResync || res.Full != tc.wantFull || res.Drifted != tc.wantDrifted {
				t.Errorf("resync: %v full %v drifted %d, want %v full %v drifted %d\n%s", res.Resync, res.Full, res.Drifted,
					tc.wantResync, tc.wantFull, tc.wantDrifted, res.Transaction)
			}
			if tc.wantOps != nil {
				got := []string{}
				for _, line := range strings.Split(strings.TrimSpace(res.Transaction.String()), "\n") {
					if line != "" {
						f := strings.Fields(line)
						got = append(got, strings.Join(f[:min(5, len(f))], " "))
					}
				}
				if diff := cmp.Diff(tc.wantOps, got); diff != "" {
					t.Errorf("resync transaction (-want +got):\n%s\n%s", diff, res.Transaction)
				}
			}
			r.k.genErr, r.k.checkErr = nil, nil
			if tc.fullAfterOwn {
				fresh, fw := newFake(t, baseConfig())
				syncFake(t, fw, fresh, r.c.input())
				want = normalDump(fresh)
			}
			if diff := cmp.Diff(want, normalDump(r.k.Fake)); diff != "" {
				t.Errorf("table after the resync (-want +got):\n%s", diff)
			}
			// Whatever the resync did, the table is now known again:
			// the next resync is skipped.
			if tc.unvouched {
				if res := r.resync(); res.Resync != nftables.ResyncChecked || res.Transaction.NumOperations() != 0 {
					t.Errorf("resync after an unread generation: %v, %d operations, want checked and none", res.Resync, res.Transaction.NumOperations())
				}
			}
			if res := r.resync(); res.Resync != nftables.ResyncSkipped || res.Transaction.NumOperations() != 0 {
				t.Errorf("next resync: %v, %d operations, want skipped and none\n%s", res.Resync, res.Transaction.NumOperations(), res.Transaction)
			}
		})
	}
}

// TestWriterResyncWithoutKernelState checks that a writer without a
// KernelState rewrites its table at every periodic resync, as before.
func TestWriterResyncWithoutKernelState(t *testing.T) {
	r := newResyncRig(t, "")
	for range 2 {
		if res := r.resync(); !res.Full || res.Resync != nftables.ResyncRewrite {
			t.Errorf("resync: full %v, %v; want a full rewrite", res.Full, res.Resync)
		}
	}
}

// TestWriterResyncAfterFailure checks that a failed transaction makes the
// next sync full, and the resync after that skipped again.
func TestWriterResyncAfterFailure(t *testing.T) {
	r := newResyncRig(t, "plain")
	r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
	r.w.Sync(context.Background(), r.c.input())
	r.w.Applied(errors.New("nft refused it"))
	if res := r.resync(); !res.Full {
		t.Fatalf("sync after a failure: full %v, %v", res.Full, res.Resync)
	}
	if res := r.resync(); res.Resync != nftables.ResyncSkipped {
		t.Errorf("resync after the full sync: %v, want skipped", res.Resync)
	}
}

// TestWriterResyncWatched checks the resync with a TableWatcher: batches
// of others that did not touch the table cost no comparison, even when
// the writer's own partial syncs came after them; a batch that touched it,
// or lost notifications, still make the writer compare.
func TestWriterResyncWatched(t *testing.T) {
	for _, tc := range []struct {
		name        string
		change      func(r *resyncRig, wk *watchingKernel)
		wantResync  nftables.Resync
		wantDrifted int
		// wantChecked is how many elements the writer asks the kernel
		// about: what the watcher saw change, or all (-1) for unknown.
		wantChecked int
	}{
		{"another program committed to its own table", func(r *resyncRig, _ *watchingKernel) { r.k.gen++ }, nftables.ResyncSkipped, 0, 0},
		{"another program's commit, then the writer's partial sync", func(r *resyncRig, _ *watchingKernel) {
			r.k.gen++
			r.c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
			r.sync()
		}, nftables.ResyncSkipped, 0, 0},
		{"an element deleted by hand", func(r *resyncRig, _ *watchingKernel) {
			el := *r.firstElement("endpoints")
			r.byHand(func(tx *knftables.Transaction) { tx.Delete(&el) })
		}, nftables.ResyncChecked, 1, 1},
		{"a rule deleted by hand", func(r *resyncRig, _ *watchingKernel) {
			rule := *r.k.Table.Chains["lb-2"].Rules[1]
			r.byHand(func(tx *knftables.Transaction) { tx.Delete(&rule) })
		}, nftables.ResyncChecked, 1, 0},
		{"the table deleted by hand", func(r *resyncRig, _ *watchingKernel) {
			r.byHand(func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
		}, nftables.ResyncRewrite, 0, 0},
		{"notifications lost", func(r *resyncRig, wk *watchingKernel) {
			r.k.gen++
			wk.lostThrough = r.k.gen
		}, nftables.ResyncChecked, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newResyncRig(t, "watch")
			wk := r.state.(*watchingKernel)
			tc.change(r, wk)
			checked := r.k.checked
			res := r.resync()
			wantFull := tc.wantResync == nftables.ResyncRewrite
			if res.Resync != tc.wantResync || res.Drifted != tc.wantDrifted || res.Full != wantFull {
				t.Errorf("resync: %v drifted %d full %v, want %v drifted %d full %v\n%s", res.Resync, res.Drifted, res.Full,
					tc.wantResync, tc.wantDrifted, wantFull, res.Transaction)
			}
			all := 0
			for _, m := range r.k.Table.Maps {
				all += len(m.Elements)
			}
			for name, st := range r.k.Table.Sets {
				if name != "firewall-allow" && name != "nodeport-ips" {
					all += len(st.Elements)
				}
			}
			want := tc.wantChecked
			if want < 0 {
				want = all
			}
			if got := r.k.checked - checked; got != want {
				t.Errorf("elements compared: %d, want %d", got, want)
			}
		})
	}
}
