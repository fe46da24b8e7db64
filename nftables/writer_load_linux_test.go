package nftables_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/kerneltest"
	"github.com/proxykit/proxykit/nftables"
)

// TestWriterKernelLoad measures the kernel's side of the writer's own
// transactions on the benchmarks' clusters (1,000, 10,000 and 30,000
// services × 10 endpoints): the first full sync through `nft -f -` (wall,
// and nft's user and system time: user is nft's parsing, system mostly
// the kernel's work), the same load split (WriterConfig.SplitFirstLoad:
// the skeleton through nft, the elements through ApplyElements), a forced
// full resync of the unchanged cluster, and
// ten one-endpoint partial syncs through knftables (median and range). It runs
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
			var nft knftables.Interface
			if err := ns.Do(func() (err error) {
				nft, err = knftables.New(knftables.IPv4Family, nftables.DefaultTableName)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{IPFamily: v1.IPv4Protocol, NodeName: "node-1", ClusterCIDR: prefix("10.128.0.0/10")})
			if err != nil {
				t.Fatal(err)
			}
			c, bySvc := benchCluster(size)
			ctx := context.Background()
			nftFile := func(what string) {
				t.Helper()
				res := w.Sync(ctx, c.input())
				text := res.Transaction.String()
				var stderr bytes.Buffer
				var wall time.Duration
				var cmd *exec.Cmd
				err := ns.Do(func() error {
					cmd = exec.Command("nft", "-f", "-")
					cmd.Stdin = strings.NewReader(text)
					cmd.Stderr = &stderr
					start := time.Now()
					err := cmd.Run()
					wall = time.Since(start)
					return err
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
			sw, err := nftables.NewWriter(splitNFT, nftables.WriterConfig{IPFamily: v1.IPv4Protocol, NodeName: "node-1",
				ClusterCIDR: prefix("10.128.0.0/10"), SplitFirstLoad: true})
			if err != nil {
				t.Fatal(err)
			}
			res := sw.Sync(ctx, c.input())
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
				s := bySvc[name].DeepCopy()
				if i%2 == 0 {
					s.Endpoints[3].Conditions.Ready = ptr.To(false)
				}
				c.epTracker.EndpointSliceUpdate(s, false)
				res := w.Sync(ctx, c.input())
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
		})
	}
}

func sortDurations(d []time.Duration) { slices.Sort(d) }
