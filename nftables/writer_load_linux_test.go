package nftables_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterKernelLoad measures the kernel's side of the writer's own
// transactions on the benchmarks' clusters (1,000, 10,000 and 30,000
// services × 10 endpoints): the first full sync through `nft -f -` (wall,
// and nft's user and system time: user is nft's parsing, system mostly
// the kernel's work), the same load split (WriterConfig.SplitFirstLoad:
// the skeleton through nft, the elements through ApplyElements), a forced
// full resync of the unchanged cluster,
// ten one-endpoint partial syncs through knftables (median and range), and
// the periodic resync through a KernelWatcher with nothing changed,
// after another program's commit and after an element deleted by hand
// (three each, range). The watcher runs throughout, out of the monitor
// group (Quiet) for the full syncs through nft -f, so the partial syncs'
// figures include what its notifications cost the kernel. It runs
// only with PROXYKIT_NFT_BENCH=1, in a throwaway namespace, and logs the
// figures (go test -v):
//
//	PROXYKIT_NFT_BENCH=1 PROXYKIT_REQUIRE_KERNEL=1 go test ./nftables/ -run TestWriterKernelLoad -v -timeout 20m
func TestWriterKernelLoad(t *testing.T) {
	if os.Getenv("PROXYKIT_NFT_BENCH") != "1" {
		t.Skip("set PROXYKIT_NFT_BENCH=1 to measure (loads 30,000-service tables)")
	}
	kerneltest.Require(t, "nft")
	for _, size := range []benchSize{{1000, 10}, {10000, 10}, {30000, 10}} {
		t.Run(size.String(), func(t *testing.T) {
			ns := kerneltest.NewNS(t)
			nft := nsNFT(t, ns, knftables.IPv4Family)
			clock := clocktesting.NewFakeClock(time.Now())
			kw := nsKernelState(t, ns, true).(*nftables.KernelWatcher)
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{
				Family:         v1.IPv4Protocol,
				Node:           proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}},
				FullSyncPeriod: time.Hour,
				Clock:          clock,
				KernelState:    kw,
			})
			if err != nil {
				t.Fatal(err)
			}
			c := benchCluster(size)
			ctx := context.Background()
			nftFile := func(what string) {
				t.Helper()
				res := syncIn(t, ns, w, c.input())
				text := res.Transaction.String()
				var stderr bytes.Buffer
				var wall time.Duration
				var cmd *exec.Cmd
				// The full syncs run with the watcher out of the
				// monitor group, as a proxier runs them (Quiet).
				err := kw.Quiet(func() error {
					return ns.Do(func() error {
						cmd = exec.Command("nft", "-f", "-")
						cmd.Stdin = strings.NewReader(text)
						cmd.Stderr = &stderr
						start := time.Now()
						err := cmd.Run()
						wall = time.Since(start)
						return err
					})
				})
				w.Applied(err)
				if err != nil {
					t.Fatalf("nft -f: %v: %s", err, stderr.String())
				}
				t.Logf("%s %s: %d operations, %.1f MB: nft -f %v (user %v, sys %v)", size, what, res.Transaction.NumOperations(),
					float64(len(text))/1e6, wall.Round(time.Millisecond), cmd.ProcessState.UserTime().Round(time.Millisecond),
					cmd.ProcessState.SystemTime().Round(time.Millisecond))
			}
			nftFile("full sync, empty table")
			w.RequestFullSync()
			nftFile("full resync, nothing changed")

			// The same first load split: the skeleton through nft, the
			// elements through ApplyElements, in another namespace.
			splitNS := kerneltest.NewNS(t)
			var splitNFT knftables.Interface
			if err := splitNS.Do(func() (err error) {
				splitNFT, err = knftables.New(knftables.IPv4Family, nftables.DefaultTableName)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			sw, err := nftables.NewWriter(splitNFT, nftables.WriterConfig{
				Family:         v1.IPv4Protocol,
				Node:           proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}},
				SplitFirstLoad: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			res := syncIn(t, splitNS, sw, c.input())
			var skel, elems time.Duration
			err = splitNS.Do(func() error {
				start := time.Now()
				if err := splitNFT.Run(ctx, res.Transaction); err != nil {
					return err
				}
				skel = time.Since(start)
				start = time.Now()
				err := nftables.ApplyElements(res.Elements)
				elems = time.Since(start)
				return err
			})
			sw.Applied(err)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s full sync split, empty table: %d operations through nft %v, %d elements through netlink %v: %v in all",
				size, res.Transaction.NumOperations(), skel.Round(time.Millisecond), len(res.Elements), elems.Round(time.Millisecond),
				(skel + elems).Round(time.Millisecond))

			var times []time.Duration
			ops := 0
			for i := range 10 {
				name := fmt.Sprintf("svc-%d", (i/2)*997%size.services)
				s := c.Slices["bench/"+name+"-1"].DeepCopy()
				if i%2 == 0 {
					s.Endpoints[3].Conditions.Ready = ptr.To(false)
				}
				c.EndpointTracker.EndpointSliceUpdate(s, false)
				res := syncIn(t, ns, w, c.input())
				if res.Full {
					t.Fatal("one-endpoint change made a full sync")
				}
				start := time.Now()
				err := ns.Do(func() error { return nft.Run(ctx, res.Transaction) })
				times = append(times, time.Since(start))
				w.Applied(err)
				if err != nil {
					t.Fatalf("partial sync: %v\n%s", err, res.Transaction)
				}
				ops += res.Transaction.NumOperations()
			}
			sortDurations(times)
			t.Logf("%s one endpoint going and coming back (10 partial syncs, %.1f operations each): median %v, range %v–%v",
				size, float64(ops)/10, times[len(times)/2].Round(100*time.Microsecond), times[0].Round(100*time.Microsecond), times[len(times)-1].Round(100*time.Microsecond))

			// The periodic resync (WriterConfig.KernelState), three times
			// each: with nothing changed, after another program's
			// commit to a table of its own, and after one element of the
			// endpoints map deleted by hand. "in the writer" is Sync,
			// which reads the kernel; "applied" is running what it sent.
			for _, rc := range []struct {
				what    string
				before  func(i int)
				want    nftables.Resync
				wantOps int
			}{
				{"nothing changed", func(int) {}, nftables.ResyncSkipped, 0},
				{"after an unrelated commit", func(i int) {
					ns.MustExec(t, "nft", "add", "table", "ip", fmt.Sprintf("other%d", i))
				}, nftables.ResyncSkipped, 0},
				{"after one element deleted by hand", func(i int) {
					ns.MustExec(t, "nft", "delete", "element", "ip", nftables.DefaultTableName, "endpoints",
						fmt.Sprintf("{ 10.96.0.%d . tcp . 80 . 0 }", i+1))
				}, nftables.ResyncChecked, 1},
			} {
				var inWriter, applied []time.Duration
				for i := range 3 {
					rc.before(i)
					clock.Step(time.Hour)
					start := time.Now()
					res := syncIn(t, ns, w, c.input())
					inWriter = append(inWriter, time.Since(start))
					var err error
					if res.Transaction.NumOperations() > 0 {
						start = time.Now()
						err = ns.Do(func() error { return nft.Run(ctx, res.Transaction) })
						applied = append(applied, time.Since(start))
					}
					w.Applied(err)
					if err != nil || res.Resync != rc.want || res.Transaction.NumOperations() != rc.wantOps {
						t.Fatalf("resync %s: %v with %d operations, error %v; want %v with %d:\n%s", rc.what, res.Resync,
							res.Transaction.NumOperations(), err, rc.want, rc.wantOps, res.Transaction)
					}
				}
				sortDurations(inWriter)
				line := fmt.Sprintf("%s periodic resync, %s: %v, %d operations: in the writer %v–%v", size, rc.what, rc.want,
					rc.wantOps, inWriter[0].Round(10*time.Microsecond), inWriter[len(inWriter)-1].Round(10*time.Microsecond))
				if len(applied) > 0 {
					sortDurations(applied)
					line += fmt.Sprintf(", applied %v–%v", applied[0].Round(100*time.Microsecond), applied[len(applied)-1].Round(100*time.Microsecond))
				}
				t.Log(line)
			}
		})
	}
}

func sortDurations(d []time.Duration) { slices.Sort(d) }
