package nftables

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/proxy"
)

// driftCase is a change another program makes to the Mode's table by
// hand, with nft in the namespace.
type driftCase struct {
	name string
	// nft returns the arguments of the nft commands that make it, given
	// the family ("ip" or "ip6"), the table, and the namespace to read
	// handles from.
	nft func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string
}

// ruleHandle returns the handle of the first rule of chain that contains
// match.
func ruleHandle(t testing.TB, ns *kerneltest.NS, fam, table, chain, match string) string {
	t.Helper()
	listing := ns.MustExec(t, "nft", "-a", "list", "chain", fam, table, chain)
	m := regexp.MustCompile(regexp.QuoteMeta(match) + `.*# handle (\d+)`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no rule with %q in chain %s:\n%s", match, chain, listing)
	}
	return m[1]
}

// sharedChain returns the name of a shared load-balancing chain of the
// table (lb-N, N the endpoint count of services that use it).
func firstSharedChain(t testing.TB, ns *kerneltest.NS, fam, table string) string {
	t.Helper()
	m := regexp.MustCompile(`chain (lb-\d+) `).FindStringSubmatch(ns.MustExec(t, "nft", "list", "chains", fam))
	if m == nil {
		t.Fatalf("no shared chain in table %s %s", fam, table)
	}
	return m[1]
}

func ipKeyword(family v1.IPFamily) string {
	if family == v1.IPv6Protocol {
		return "ip6"
	}
	return "ip"
}

func addrType(family v1.IPFamily) string {
	if family == v1.IPv6Protocol {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// driftCases are the changes by hand the drift tests make: deleting,
// flushing, and adding what the writer did not write.
var driftCases = []driftCase{
	{"an element deleted", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"delete", "element", fam, table, "endpoints", "{ " + ipOf(family, 0x60_00_00) + " . tcp . 80 . 0 }"}}
	}},
	{"a rule deleted", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"delete", "rule", fam, table, "services", "handle", ruleHandle(t, ns, fam, table, "services", "@service-ips")}}
	}},
	{"a chain flushed", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"flush", "chain", fam, table, firstSharedChain(t, ns, fam, table)}}
	}},
	{"a service element added", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"add", "element", fam, table, "service-ips", "{ " + ipOf(family, 0x61_00_00) + " . tcp . 80 : goto " + firstSharedChain(t, ns, fam, table) + " }"}}
	}},
	{"an endpoints element added", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"add", "element", fam, table, "endpoints", "{ " + ipOf(family, 0x60_00_00) + " . tcp . 80 . 99 : " + ipOf(family, 0xf5_00_00) + " . 8080 }"}}
	}},
	{"a chain added", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"add", "chain", fam, table, "intruder"}, {"add", "rule", fam, table, "intruder", "counter", "accept"}}
	}},
	{"a base chain added", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"add", "chain", fam, table, "intruder-hook", "{ type filter hook output priority 0; }"},
			{"add", "rule", fam, table, "intruder-hook", ipKeyword(family), "daddr", ipOf(family, 0x60_00_00), "drop"}}
	}},
	{"a rule added to a chain of the writer's", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"add", "chain", fam, table, "intruder"},
			{"add", "rule", fam, table, "services", ipKeyword(family), "daddr", ipOf(family, 0x61_00_00), "jump", "intruder"}}
	}},
	{"a set and a map added", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"add", "set", fam, table, "intruders", "{ type " + addrType(family) + "; }"},
			{"add", "element", fam, table, "intruders", "{ " + ipOf(family, 0x61_00_00) + " }"},
			{"add", "map", fam, table, "intruder-map", "{ type " + addrType(family) + " : verdict; }"}}
	}},
}

// driftRig runs a Mode's Run with a lost that, as the Proxier's, asks
// for a sync (the next input Full), which the rig then runs, at once.
type driftRig struct {
	k *kernelFamily
	// lost counts the calls of lost.
	lost chan struct{}
}

func startDriftRig(t *testing.T, k *kernelFamily) *driftRig {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := &driftRig{k: k, lost: make(chan struct{}, 16)}
	done := make(chan struct{})
	go func() {
		k.b.Run(ctx, func() {
			k.fullNext.Store(true)
			r.lost <- struct{}{}
		})
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// awaitRepair waits for lost and runs the sync it asks for; it reports
// whether that sync was full and how long after since it ended.
func (r *driftRig) awaitRepair(t testing.TB, since time.Time) (bool, time.Duration) {
	t.Helper()
	select {
	case <-r.lost:
	case <-time.After(30 * time.Second):
		t.Fatal("lost not called within 30 s of the change by hand")
	}
	full := r.k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{})
	return full, time.Since(since)
}

// TestKernelDriftRepaired checks, with the real nft and kernel and for
// each family, that a change another program makes by hand to the
// Mode's table (an element or a rule deleted, a chain flushed; an
// element, a chain, a base chain, a rule in a chain of the writer's, a
// set or a map added) makes Run call lost without waiting for a periodic
// resync (the watcher's signal; the drift check period is left at its
// default, far longer than the test), and that the sync lost asks for is
// partial and leaves the table exactly as the writer's syncs had left it
// (nft list table, element lists sorted). After each repair, the
// Mode's own syncs are not taken for another's change: Drifted is
// false, and an ordinary partial sync brings no call of lost.
func TestKernelDriftRepaired(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), func(t *testing.T) {
			k := newKernelFamily(t, ns, family, 3, 2)
			if k.b.watcher == nil {
				t.Fatal("the Mode does not follow nf_tables' commits")
			}
			fam, table := string(k.b.Family()), k.b.Table()
			want := kerneltest.ListTable(t, ns, fam, table)
			r := startDriftRig(t, k)
			for _, tc := range driftCases {
				for _, args := range tc.nft(t, ns, family, fam, table) {
					ns.MustExec(t, "nft", args...)
				}
				if kerneltest.ListTable(t, ns, fam, table) == want {
					t.Fatalf("%s: the change by hand changed nothing", tc.name)
				}
				if full, _ := r.awaitRepair(t, time.Now()); full {
					t.Errorf("%s: the repair was a full sync", tc.name)
				}
				if diff := cmp.Diff(want, kerneltest.ListTable(t, ns, fam, table)); diff != "" {
					t.Errorf("%s: table after the repair (-want +got):\n%s", tc.name, diff)
				}
				if drifted, err := k.b.w.Drifted(); err != nil || drifted {
					t.Errorf("%s: after the repair Drifted() = %v, %v; want false", tc.name, drifted, err)
				}
			}
			// The Mode's own partial sync is no drift: the watcher
			// signals it, and the check finds the writer's generation.
			// Run's check of that signal is waited for by taking the
			// lock it holds, after the watcher has read the batch.
			k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{})
			if drifted, err := k.b.w.Drifted(); err != nil || drifted {
				t.Errorf("after the Mode's own sync Drifted() = %v, %v; want false", drifted, err)
			}
			select {
			case <-r.lost:
				t.Error("lost called after the repairs with nothing changed by hand")
			default:
			}
			// A Full input of the Proxier's own still brings a full
			// sync.
			k.fullNext.Store(true)
			if !k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{}) {
				t.Error("the sync of a Full input was not full")
			}
		})
	}
}

// TestKernelDriftPeriodicCheck checks that a change the watcher missed
// (made while it was out of the monitor group, as during the Mode's
// full syncs) is found by the periodic drift check and repaired by a
// partial sync: a cluster IP element deleted and a chain added by the
// check's listing; an endpoints element deleted by the thorough
// comparison, which a full sync period brings (here, at once).
func TestKernelDriftPeriodicCheck(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	clusterIPDeleted := driftCase{"a cluster IP element deleted", func(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, fam, table string) [][]string {
		return [][]string{{"delete", "element", fam, table, "cluster-ips", "{ " + ipOf(family, 0x60_00_01) + " }"}}
	}}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, tc := range []struct {
			name   string
			period time.Duration
			cases  []driftCase
		}{
			{"listing", time.Hour, []driftCase{clusterIPDeleted, driftCases[5]}},
			{"thorough", time.Nanosecond, []driftCase{driftCases[0]}},
		} {
			t.Run(string(family)+"/"+tc.name, func(t *testing.T) {
				k := newKernelFamily(t, ns, family, 3, 2, WithDriftCheckPeriod(50*time.Millisecond), withFullSyncPeriod(tc.period))
				fam, table := string(k.b.Family()), k.b.Table()
				want := kerneltest.ListTable(t, ns, fam, table)
				r := startDriftRig(t, k)
				for _, dc := range tc.cases {
					cmds := dc.nft(t, ns, family, fam, table)
					if err := k.b.watcher.Quiet(func() error {
						for _, args := range cmds {
							if _, err := ns.Exec("nft", args...); err != nil {
								return err
							}
						}
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					if full, _ := r.awaitRepair(t, time.Now()); full {
						t.Errorf("%s: the repair was a full sync", dc.name)
					}
					if diff := cmp.Diff(want, kerneltest.ListTable(t, ns, fam, table)); diff != "" {
						t.Errorf("%s: table after the repair (-want +got):\n%s", dc.name, diff)
					}
				}
			})
		}
	}
}

// TestKernelDriftRepairTimes measures, through the Mode on a table of
// 10,000 services of 10 endpoints, how long each change by hand of
// driftCases takes to be repaired with the default periods: from the end
// of the nft command to lost (the watcher's signal and the check), and
// the sync lost asks for (the comparison of what the watcher saw, and the
// repair). A Proxier runs that sync no sooner than its minimum sync
// period after the one before. It runs only with PROXYKIT_NFT_BENCH=1
// and logs the figures (go test -v):
//
//	PROXYKIT_NFT_BENCH=1 PROXYKIT_REQUIRE_KERNEL=1 go test ./nftables/ -run TestKernelDriftRepairTimes -v -timeout 20m
func TestKernelDriftRepairTimes(t *testing.T) {
	if os.Getenv("PROXYKIT_NFT_BENCH") != "1" {
		t.Skip("set PROXYKIT_NFT_BENCH=1 to measure (loads a 10,000-service table)")
	}
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	k := newKernelFamily(t, ns, v1.IPv4Protocol, 10000, 10, withSplitFirstLoad(nil), withNetlinkElementSyncs(nil))
	fam, table := string(k.b.Family()), k.b.Table()
	want := kerneltest.ListTable(t, ns, fam, table)
	r := startDriftRig(t, k)
	// The watcher's signal of the change's commit: nft itself takes
	// seconds to read the table before it commits, so the time is taken
	// from the signal of the commit, not from the command.
	committed := k.b.watcher.Notify(k.b.Family(), table)
	for round := range 3 {
		for _, tc := range driftCases {
			cmds := tc.nft(t, ns, v1.IPv4Protocol, fam, table)
			// Forget the signals of the repairs before: wait until the
			// watcher has read every batch so far, then drain.
			g, err := k.b.watcher.Generation()
			if err != nil {
				t.Fatal(err)
			}
			k.b.watcher.Changes(k.b.Family(), table, g-1, g)
			select {
			case <-committed:
			default:
			}
			changed := make(chan time.Time, 1)
			go func() {
				<-committed
				changed <- time.Now()
			}()
			for _, args := range cmds {
				ns.MustExec(t, "nft", args...)
			}
			<-r.lost
			found := time.Since(<-changed)
			start := time.Now()
			full := k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{})
			t.Logf("round %d, %s: lost after %v, repair sync %v (full %v)", round, tc.name, found.Round(10*time.Microsecond), time.Since(start).Round(10*time.Microsecond), full)
		}
	}
	if diff := cmp.Diff(want, kerneltest.ListTable(t, ns, fam, table)); diff != "" {
		t.Errorf("table after the repairs (-want +got):\n%s", diff)
	}
}

// BenchmarkDriftCheck measures the Mode's drift check at 10,000
// services of 10 endpoints: the periodic check with nothing committed
// (one read of the nf_tables generation), with the watcher after another
// program's commit to another table, and, for a Mode without the
// watcher (the monitor group cannot be joined, or notifications were
// lost), the sync the check then asks for, which compares the whole table
// by key and rule count and lists its chains, sets and small sets'
// elements; "compare+endpoints" also lists the endpoints maps, which it
// does at most once a full sync period. It runs only with
// PROXYKIT_NFT_BENCH=1:
//
//	PROXYKIT_NFT_BENCH=1 PROXYKIT_REQUIRE_KERNEL=1 go test ./nftables/ -run '^$' -bench BenchmarkDriftCheck -benchmem -benchtime 5x -timeout 20m
func BenchmarkDriftCheck(b *testing.B) {
	if os.Getenv("PROXYKIT_NFT_BENCH") != "1" {
		b.Skip("set PROXYKIT_NFT_BENCH=1 to measure (loads 10,000-service tables)")
	}
	kerneltest.Require(b, "nft")
	ns := kerneltest.NewNS(b)
	ctx := context.Background()
	lost := func() { b.Fatal("lost called") }
	other := 0
	commitElsewhere := func() {
		other++
		ns.MustExec(b, "nft", "add", "table", "ip", fmt.Sprintf("other-%d", other))
	}
	b.Run("unchanged", func(b *testing.B) {
		k := newKernelFamily(b, ns, v1.IPv4Protocol, 10000, 10, withSplitFirstLoad(nil))
		b.ReportAllocs()
		for b.Loop() {
			k.b.checkDrift(ctx, lost)
		}
	})
	b.Run("watcher-other-table", func(b *testing.B) {
		k := newKernelFamily(b, ns, v1.IPv4Protocol, 10000, 10, withSplitFirstLoad(nil))
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			commitElsewhere()
			b.StartTimer()
			k.b.checkDrift(ctx, lost)
		}
	})
	for _, mode := range []string{"compare", "compare+endpoints"} {
		b.Run(mode, func(b *testing.B) {
			state := NewKernelState("/run/netns/" + ns.Name)
			defer state.(io.Closer).Close()
			period := time.Hour
			if mode == "compare+endpoints" {
				period = time.Nanosecond
			}
			k := newKernelFamilyConfig(b, ns, WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}, KernelState: state}, 10000, 10,
				withSplitFirstLoad(nil), withFullSyncPeriod(period))
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				commitElsewhere()
				b.StartTimer()
				if drifted, err := k.b.w.Drifted(); err != nil || !drifted {
					b.Fatalf("Drifted() = %v, %v after another's commit without a watcher", drifted, err)
				}
				k.b.w.RequestResync()
				if k.sync(b, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{}) {
					b.Fatal("the comparison's sync was full")
				}
			}
		})
	}
}
