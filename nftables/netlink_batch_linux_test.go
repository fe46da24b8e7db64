package nftables_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// elementsBlock is an "elements = { ... }" block of nft's listing.
var elementsBlock = regexp.MustCompile(`(?s)elements = \{(.*?)\}`)

// listTable is `nft list table` of the writer's table in ns, with the
// elements of each set and map sorted: the kernel lists a hash set in the
// order of its buckets, which depends on the set's random seed, not on
// what it holds.
func listTable(t *testing.T, ns *kerneltest.NS, family knftables.Family) string {
	t.Helper()
	out := ns.MustExec(t, "nft", "list", "table", string(family), nftables.DefaultTableName)
	return elementsBlock.ReplaceAllStringFunc(out, func(block string) string {
		inner := elementsBlock.FindStringSubmatch(block)[1]
		var els []string
		for _, e := range strings.Split(inner, ",") {
			els = append(els, strings.Join(strings.Fields(e), " "))
		}
		slices.Sort(els)
		return "elements = { " + strings.Join(els, ",\n") + " }"
	})
}

// batchFamily is one family's addresses for the netlink-batch kernel
// tests.
type batchFamily struct {
	family         v1.IPFamily
	nft            knftables.Family
	svc            func(i int) string // the cluster IP of service i
	podA, podB     string
	extra, missing string // an address nothing uses
}

var batchFamilies = []batchFamily{
	{v1.IPv4Protocol, knftables.IPv4Family, func(i int) string { return fmt.Sprintf("10.96.0.%d", i) },
		"10.0.0.11", "10.0.0.12", "10.0.0.99", "10.96.0.200"},
	{v1.IPv6Protocol, knftables.IPv6Family, func(i int) string { return fmt.Sprintf("fd00:96::%x", i) },
		"fd00:10::11", "fd00:10::12", "fd00:10::99", "fd00:96::200"},
}

// TestApplyElementBatchKernel sends batches through ApplyElementBatch in
// one namespace and the same changes as one nft -f transaction in another,
// over the same table, for each family: additions to every set and map
// ApplyElementBatch takes, then their deletions (by key alone) with the
// maps' keys added again with other values, in one batch. After each, the
// two tables list the same. A batch the kernel refuses (a deletion of an
// element that is not there, beside valid additions) fails and changes
// nothing, as nft's transaction does.
func TestApplyElementBatchKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	for _, fam := range batchFamilies {
		t.Run(string(fam.family), func(t *testing.T) {
			c := newCluster(fam.family, node)
			c.setService(makeService("ns", "two", fam.svc(1), withNodePort(30080)))
			c.setEndpoints("ns", "two", tcp8080, local(fam.podA), remote(fam.podB))
			c.setService(makeService("ns", "one", fam.svc(2), withNodePort(30081)))
			c.setEndpoints("ns", "one", tcp8080, remote(fam.podB))
			in := c.input()
			type side struct {
				ns  *kerneltest.NS
				nft knftables.Interface
			}
			var sides [2]side
			for i := range sides {
				s := &sides[i]
				s.ns = kerneltest.NewNS(t)
				s.nft = nsNFT(t, s.ns, fam.nft)
				w, err := nftables.NewWriter(s.nft, nftables.WriterConfig{Family: fam.family, Node: proxy.NodeConfig{Name: node}})
				if err != nil {
					t.Fatal(err)
				}
				res := syncIn(t, s.ns, w, in)
				if err := s.ns.Do(func() error { return s.nft.Run(context.Background(), res.Transaction) }); err != nil {
					t.Fatal(err)
				}
			}
			el := func(set string, isMap bool, key []string, value ...string) *knftables.Element {
				e := &knftables.Element{Family: fam.nft, Table: nftables.DefaultTableName, Key: key, Value: value}
				if isMap {
					e.Map = set
				} else {
					e.Set = set
				}
				return e
			}
			svc, pod := fam.svc(9), fam.extra
			added := []*knftables.Element{
				el("endpoints", true, []string{svc, "tcp", "80", "0"}, pod, "8080"),
				el("nodeport-endpoints", true, []string{"udp", "31000", "0"}, pod, "53"),
				el("service-ips", true, []string{svc, "tcp", "80"}, "goto lb-2"),
				el("service-nodeports", true, []string{"sctp", "31000"}, "goto lb-nodeport-2"),
				el("cluster-ips", false, []string{svc}),
				el("hairpin-endpoints", false, []string{pod, pod}),
				el("firewall-ips", false, []string{svc, "udp", "53"}),
			}
			var names []string
			for _, e := range added {
				names = append(names, e.Set+e.Map)
			}
			slices.Sort(names)
			if diff := cmp.Diff(nftables.NetlinkSetNames, names); diff != "" {
				t.Fatalf("the test does not cover every set ApplyElementBatch takes (-those +covered):\n%s", diff)
			}
			var deleted []*knftables.Element
			for _, e := range added {
				d := *e
				d.Value = nil
				deleted = append(deleted, &d)
			}
			changed := []*knftables.Element{
				el("endpoints", true, []string{svc, "tcp", "80", "0"}, fam.podA, "9090"),
				el("nodeport-endpoints", true, []string{"udp", "31000", "0"}, fam.podB, "53"),
				el("service-ips", true, []string{svc, "tcp", "80"}, "goto lb-1"),
				el("service-nodeports", true, []string{"sctp", "31000"}, "goto lb-nodeport-1"),
			}
			apply := func(b nftables.ElementBatch) (netlinkErr, nftErr error) {
				netlinkErr = sides[0].ns.Do(func() error { return nftables.ApplyElementBatch(b) })
				tx := sides[1].nft.NewTransaction()
				b.AddTo(tx)
				nftErr = sides[1].ns.Do(func() error { return sides[1].nft.Run(context.Background(), tx) })
				return netlinkErr, nftErr
			}
			for _, step := range []struct {
				name string
				b    nftables.ElementBatch
				want string // in the netlink side's listing
			}{
				{"one of each added", nftables.ElementBatch{Add: added}, "goto lb-nodeport-2"},
				{"deleted by key, the maps' keys with other values", nftables.ElementBatch{Delete: deleted, Add: changed}, "goto lb-nodeport-1"},
			} {
				before := listTable(t, sides[0].ns, fam.nft)
				if errN, errT := apply(step.b); errN != nil || errT != nil {
					t.Fatalf("%s: netlink: %v; nft: %v", step.name, errN, errT)
				}
				got, want := listTable(t, sides[0].ns, fam.nft), listTable(t, sides[1].ns, fam.nft)
				if got == before || !strings.Contains(got, step.want) {
					t.Errorf("%s: the batch changed nothing:\n%s", step.name, got)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s: tables differ (-nft -f +netlink):\n%s", step.name, diff)
				}
			}
			if strings.Contains(listTable(t, sides[0].ns, fam.nft), "31000 . 0 : "+pod) {
				t.Error("the first value of nodeport-endpoints is still there")
			}

			before := listTable(t, sides[0].ns, fam.nft)
			refused := nftables.ElementBatch{
				Delete: []*knftables.Element{el("cluster-ips", false, []string{fam.missing})},
				Add:    []*knftables.Element{el("cluster-ips", false, []string{fam.svc(10)}), el("hairpin-endpoints", false, []string{fam.podB, fam.podB})},
			}
			errN, errT := apply(refused)
			if errN == nil || errT == nil {
				t.Fatalf("deleting an element that is not there: netlink: %v, nft: %v; want both refused", errN, errT)
			}
			if !errors.Is(errN, syscall.ENOENT) {
				t.Errorf("netlink's error %v is not ENOENT", errN)
			}
			if diff := cmp.Diff(before, listTable(t, sides[0].ns, fam.nft)); diff != "" {
				t.Errorf("the refused batch changed the table (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(listTable(t, sides[1].ns, fam.nft), before); diff != "" {
				t.Errorf("tables differ after the refused batch (-nft -f +netlink):\n%s", diff)
			}
		})
	}
}

// TestWriterNetlinkElementSyncsKernel runs a writer with
// NetlinkElementSyncs in a node namespace, its batches sent with
// ApplyElementBatch, beside a writer without it in another namespace, for
// each family, through churn: an endpoint removed (the count changes, to
// one whose shared chains exist), an endpoint replaced, a service added,
// all of them partial syncs sent as batches, then all endpoints gone (a
// transaction: commented elements). After each, both tables list the same
// and real connections from a client reach what the rules say; a pod that
// reaches itself is masqueraded (the hairpin set the batch changed).
// Last, an element deleted by hand makes the next batch (which deletes
// it) fail: the kernel refuses it whole, the table is as before, and the
// sync after is full and repairs it.
func TestWriterNetlinkElementSyncsKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	nw := newWriterNetwork(t)
	for _, tc := range []struct {
		batchFamily
		nodeIP, bridgeIP, cidr string
	}{
		{batchFamilies[0], "10.1.0.1", "10.0.0.1", "10.0.0.0/16"},
		{batchFamilies[1], "fd01::1", "fd00:10::1", "fd00:10::/64"},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			mirror := kerneltest.NewNS(t)
			type side struct {
				ns  *kerneltest.NS
				nft knftables.Interface
				w   *nftables.Writer
			}
			sides := []*side{{ns: nw.Node}, {ns: mirror}}
			for i, s := range sides {
				s.nft = nsNFT(t, s.ns, tc.nft)
				var err error
				s.w, err = nftables.NewWriter(s.nft, nftables.WriterConfig{
					Family:              tc.family,
					Node:                proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix(tc.cidr)}},
					NetlinkElementSyncs: i == 0,
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { nw.Node.MustExec(t, "nft", "delete", "table", string(tc.nft), nftables.DefaultTableName) })
			run := func(s *side, res nftables.SyncResult) error {
				return s.ns.Do(func() error {
					if res.Batch != nil {
						return nftables.ApplyElementBatch(*res.Batch)
					}
					return s.nft.Run(context.Background(), res.Transaction)
				})
			}
			c := newCluster(tc.family, "node-a")
			c.NodeIPs = []netip.Addr{addr(tc.nodeIP)}
			sync := func(what string, wantFull, wantBatch bool) {
				t.Helper()
				in := c.input()
				for i, s := range sides {
					res := syncIn(t, s.ns, s.w, in)
					err := run(s, res)
					s.w.Applied(err)
					if err != nil {
						t.Fatalf("%s, writer %d: %v", what, i, err)
					}
					if res.Full != wantFull || (res.Batch != nil) != (wantBatch && i == 0) {
						t.Fatalf("%s, writer %d: full=%v, batch %v; want full=%v, batch %v", what, i, res.Full, res.Batch != nil, wantFull, wantBatch && i == 0)
					}
				}
				if diff := cmp.Diff(listTable(t, mirror, tc.nft), listTable(t, nw.Node, tc.nft)); diff != "" {
					t.Errorf("%s: tables differ (-nft -f +netlink):\n%s", what, diff)
				}
			}
			reach := func(what string, dst netip.AddrPort, want ...string) {
				t.Helper()
				seen := map[string]bool{}
				for range 12 {
					r, err := kerneltest.Dial(nw.Client, "tcp", dst, 3*time.Second)
					if err != nil {
						t.Fatalf("%s: connecting to %s: %v", what, dst, err)
					}
					seen[r.Name] = true
				}
				wantSet := map[string]bool{}
				for _, p := range want {
					wantSet[p] = true
				}
				if diff := cmp.Diff(wantSet, seen); diff != "" {
					t.Errorf("%s: pods reached through %s (-want +got):\n%s", what, dst, diff)
				}
			}
			web := netip.AddrPortFrom(addr(tc.svc(1)), 80)
			webNodePort := netip.AddrPortFrom(addr(tc.nodeIP), 30080)
			c.setService(makeService("ns", "web", tc.svc(1), withNodePort(30080)))
			c.setEndpoints("ns", "web", tcp8080, local(tc.podA), local(tc.podB))
			// One endpoint: the shared chains of one exist from the start.
			c.setService(makeService("ns", "one", tc.svc(2), withNodePort(30081)))
			c.setEndpoints("ns", "one", tcp8080, local(tc.podB))
			sync("first load", true, false)
			reach("first load", web, "pod-a", "pod-b")

			c.setEndpoints("ns", "web", tcp8080, local(tc.podB))
			sync("endpoint removed", false, true)
			reach("endpoint removed", web, "pod-b")
			reach("endpoint removed", webNodePort, "pod-b")

			c.setEndpoints("ns", "web", tcp8080, local(tc.podA))
			sync("endpoint replaced", false, true)
			reach("endpoint replaced", web, "pod-a")
			reach("endpoint replaced", webNodePort, "pod-a")
			r, err := kerneltest.Dial(nw.Pods["pod-a"], "tcp", web, 3*time.Second)
			if err != nil || r.Name != "pod-a" || r.Client != addr(tc.bridgeIP) {
				t.Errorf("pod-a reaching itself through %s: reply %+v, error %v; want pod-a seeing the masqueraded %s", web, r, err, tc.bridgeIP)
			}

			c.setService(makeService("ns", "new", tc.svc(3), withNodePort(30083)))
			c.setEndpoints("ns", "new", tcp8080, local(tc.podA), local(tc.podB))
			sync("service added", false, true)
			reach("service added", netip.AddrPortFrom(addr(tc.svc(3)), 80), "pod-a", "pod-b")
			reach("service added", netip.AddrPortFrom(addr(tc.nodeIP), 30083), "pod-a", "pod-b")

			c.setEndpoints("ns", "web", tcp8080)
			sync("all endpoints gone", false, false)
			if _, err := kerneltest.Dial(nw.Client, "tcp", web, 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s without endpoints: %v, want connection refused", web, err)
			}

			// Another program deletes an element the next batch deletes.
			nw.Node.MustExec(t, "nft", "delete", "element", string(tc.nft), nftables.DefaultTableName, "endpoints",
				"{", tc.svc(3), ".", "tcp", ".", "80", ".", "1", "}")
			before := listTable(t, nw.Node, tc.nft)
			c.setEndpoints("ns", "new", tcp8080, local(tc.podA))
			w := sides[0].w
			res := syncIn(t, sides[0].ns, w, c.input())
			if res.Batch == nil {
				t.Fatalf("endpoint removed: no batch; transaction:\n%s", res.Transaction)
			}
			err = run(sides[0], res)
			w.Applied(err)
			if err == nil {
				t.Fatalf("a batch deleting an element that is not there was applied: %+v", res.Batch)
			}
			if diff := cmp.Diff(before, listTable(t, nw.Node, tc.nft)); diff != "" {
				t.Errorf("the refused batch changed the table (-before +after):\n%s", diff)
			}
			res = syncIn(t, sides[0].ns, w, c.input())
			err = run(sides[0], res)
			w.Applied(err)
			if err != nil || !res.Full || res.Batch != nil {
				t.Fatalf("sync after the refused batch: full=%v, batch %v, error %v; want a full transaction applied", res.Full, res.Batch != nil, err)
			}
			reach("repaired", netip.AddrPortFrom(addr(tc.svc(3)), 80), "pod-a")
		})
	}
}

// TestWriterNetlinkElementSyncsResyncKernel checks, against the real
// kernel, with a netlink KernelState and with a KernelWatcher, that a
// batch counts as the writer's own commit: ApplyElementBatch commits one
// generation, so after a partial sync sent as a batch the periodic resync
// is skipped; and that an element another program deletes afterwards is
// still found and put back (by a batch too).
func TestWriterNetlinkElementSyncsResyncKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	for _, watch := range []bool{false, true} {
		for _, fam := range batchFamilies {
			t.Run(fmt.Sprintf("watch=%v/%s", watch, fam.family), func(t *testing.T) {
				ns := kerneltest.NewNS(t)
				state := nsKernelState(t, ns, watch)
				nft := nsNFT(t, ns, fam.nft)
				clock := clocktesting.NewFakeClock(time.Unix(1e9, 0))
				w, err := nftables.NewWriter(nft, nftables.WriterConfig{
					Family:              fam.family,
					Node:                proxy.NodeConfig{Name: node},
					FullSyncPeriod:      time.Hour,
					Clock:               clock,
					KernelState:         state,
					NetlinkElementSyncs: true,
				})
				if err != nil {
					t.Fatal(err)
				}
				c := newCluster(fam.family, node)
				sync := func(what string, want nftables.Resync, wantBatch bool) nftables.SyncResult {
					t.Helper()
					res := syncIn(t, ns, w, c.input())
					err := ns.Do(func() error {
						if res.Batch != nil {
							return nftables.ApplyElementBatch(*res.Batch)
						}
						if res.Transaction.NumOperations() == 0 {
							return nil
						}
						run := func() error { return nft.Run(context.Background(), res.Transaction) }
						if kw, ok := state.(*nftables.KernelWatcher); ok && res.Full {
							return kw.Quiet(run)
						}
						return run()
					})
					w.Applied(err)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if res.Resync != want || (res.Batch != nil) != wantBatch {
						t.Fatalf("%s: resync %v, batch %v; want %v, batch %v\n%s", what, res.Resync, res.Batch != nil, want, wantBatch, res.Transaction)
					}
					return res
				}
				c.setService(makeService("ns", "web", fam.svc(1)))
				c.setEndpoints("ns", "web", tcp8080, local(fam.podA), remote(fam.podB))
				sync("first load", nftables.ResyncNone, false)
				c.setEndpoints("ns", "web", tcp8080, local(fam.extra), remote(fam.podB))
				sync("endpoint replaced", nftables.ResyncNone, true)
				clock.Step(time.Hour)
				sync("resync after the writer's batch", nftables.ResyncSkipped, false)

				key := fam.svc(1) + " . tcp . 80 . 1"
				ns.MustExec(t, "nft", "delete", "element", string(fam.nft), nftables.DefaultTableName, "endpoints", "{ "+key+" }")
				clock.Step(time.Hour)
				if res := sync("resync after another's deletion", nftables.ResyncChecked, true); res.Drifted != 1 {
					t.Errorf("resync after another's deletion: %d drifted, want 1", res.Drifted)
				}
				if out := ns.MustExec(t, "nft", "list", "map", string(fam.nft), nftables.DefaultTableName, "endpoints"); !strings.Contains(out, key) {
					t.Errorf("the repair did not put back %q:\n%s", key, out)
				}
				clock.Step(time.Hour)
				sync("resync after the repair", nftables.ResyncSkipped, false)
			})
		}
	}
}
