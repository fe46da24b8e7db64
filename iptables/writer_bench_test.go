package iptables_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testkit/benchcpu"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// Benchmarks at BENCHMARKS.md's sizes (services x endpoints per service).
// Run them with, for example:
//
//	go test -run '^$' -bench 'Sync(Full|Partial)' -benchmem -benchtime 5x ./iptables/
//
// Each reports the payload size ("payload-B") beside ns/op and allocations.

type benchSize struct{ services, endpoints int }

func (s benchSize) String() string { return fmt.Sprintf("%dx%d", s.services, s.endpoints) }

var benchSizes = []benchSize{{1000, 10}, {10000, 10}, {5000, 100}}

// benchCluster loads writertest's benchmark cluster (ClusterIP services
// of one TCP port, each with one EndpointSlice of ready endpoints spread
// over 100 nodes) into a cluster, and so into the change trackers and maps.
func benchCluster(size benchSize) *cluster {
	c := newCluster(v1.IPv4Protocol, "node-1")
	c.LoadBench(size.services, size.endpoints)
	return c
}

// loadedWriter returns a cluster of the given size and a writer that has
// synced it.
func loadedWriter(b *testing.B, size benchSize) (*cluster, *iptables.Writer) {
	c := benchCluster(size)
	w := benchWriter(b)
	w.Sync(context.Background(), c.input())
	w.Applied(nil)
	return c, w
}

func benchWriter(b testing.TB) *iptables.Writer {
	w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}}, RandomFully: true})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkSyncFull measures a full sync of a loaded cluster by a writer
// that has synced it before (as the periodic or canary-triggered full
// syncs are).
func BenchmarkSyncFull(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.String(), func(b *testing.B) {
			c := benchCluster(size)
			in := c.input()
			w := benchWriter(b)
			ctx := context.Background()
			w.Sync(ctx, in)
			w.Applied(nil)
			b.ReportAllocs()
			var res iptables.SyncResult
			cpu := benchcpu.Start()
			for b.Loop() {
				w.RequestFullSync()
				res = w.Sync(ctx, in)
				w.Applied(nil)
			}
			cpu.Report(b)
			if !res.Full {
				b.Fatal("sync was not full")
			}
			b.ReportMetric(float64(len(res.Payload)), "payload-B")
		})
	}
}

// BenchmarkSyncFirst measures the first sync of a writer: a full sync that
// also computes every chain name.
func BenchmarkSyncFirst(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.String(), func(b *testing.B) {
			c := benchCluster(size)
			in := c.input()
			ctx := context.Background()
			b.ReportAllocs()
			var res iptables.SyncResult
			cpu := benchcpu.Start()
			for b.Loop() {
				w := benchWriter(b)
				res = w.Sync(ctx, in)
			}
			cpu.Report(b)
			b.ReportMetric(float64(len(res.Payload)), "payload-B")
		})
	}
}

// BenchmarkSyncFirstApplied is BenchmarkSyncFirst followed by the report
// that the payload was applied, as a proxier makes it: the writer then
// records the chains the payload declares, for its drift checks.
func BenchmarkSyncFirstApplied(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.String(), func(b *testing.B) {
			in := benchCluster(size).input()
			ctx := context.Background()
			b.ReportAllocs()
			cpu := benchcpu.Start()
			for b.Loop() {
				w := benchWriter(b)
				w.Sync(ctx, in)
				w.Applied(nil)
			}
			cpu.Report(b)
		})
	}
}

// BenchmarkSyncPartial measures a partial sync after one endpoint of one
// service changed (turned not ready, or back), including the change
// trackers' Update of the maps, as a proxier's sync does.
func BenchmarkSyncPartial(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.String(), func(b *testing.B) {
			c, w := loadedWriter(b, size)
			ctx := context.Background()
			slices := make([]*discoveryv1.EndpointSlice, 0, len(c.Slices))
			for _, s := range c.Slices {
				slices = append(slices, s)
			}
			changed := make([]*discoveryv1.EndpointSlice, len(slices))
			for i, s := range slices {
				changed[i] = s.DeepCopy()
				changed[i].Endpoints[0].Conditions.Ready = ptr.To(false)
			}
			b.ReportAllocs()
			var bytes, i int
			// writer-ns/op is the part spent in Writer.Sync, without the
			// trackers' slice update and map Update.
			var writerTime time.Duration
			for b.Loop() {
				k := (i / 2) % len(slices)
				s := slices[k]
				if i%2 == 0 {
					s = changed[k]
				}
				i++
				c.EndpointTracker.EndpointSliceUpdate(s, false)
				input := c.input()
				start := time.Now()
				res := w.Sync(ctx, input)
				writerTime += time.Since(start)
				w.Applied(nil)
				if res.Full || res.ServicePortsWritten != 1 {
					b.Fatalf("full=%v, %d ports written; want a partial sync of 1", res.Full, res.ServicePortsWritten)
				}
				bytes += len(res.Payload)
			}
			b.ReportMetric(float64(bytes)/float64(i), "payload-B")
			b.ReportMetric(float64(writerTime.Nanoseconds())/float64(i), "writer-ns/op")
		})
	}
}

// BenchmarkSyncServiceChange measures a partial sync after one Service was
// added or deleted (alternately), trackers included. A Service change
// makes the writer look through the ServicePortMap once for the Service's
// ports, so this grows with the cluster, unlike an endpoint change.
func BenchmarkSyncServiceChange(b *testing.B) {
	for _, size := range benchSizes[:2] {
		b.Run(size.String(), func(b *testing.B) {
			c, w := loadedWriter(b, size)
			ctx := context.Background()
			svc := makeService("bench", "extra", "10.97.0.1")
			b.ReportAllocs()
			var bytes, i int
			for b.Loop() {
				if i%2 == 0 {
					c.setService(svc)
					c.setEndpoints("bench", "extra", tcp8080, ep{IP: "10.200.0.1"}, ep{IP: "10.200.0.2"})
				} else {
					c.deleteService("bench", "extra")
					c.deleteEndpoints("bench", "extra")
				}
				i++
				res := w.Sync(ctx, c.input())
				w.Applied(nil)
				if res.Full || res.ServicePortsWritten > 1 {
					b.Fatalf("full=%v, %d ports written", res.Full, res.ServicePortsWritten)
				}
				bytes += len(res.Payload)
			}
			b.ReportMetric(float64(bytes)/float64(i), "payload-B")
		})
	}
}

// BenchmarkSyncMemory reports the heap that the maps and a writer keep
// after a full sync ("retained-MB", payload buffer included) and the most
// the heap held during the first full sync ("peak-MB"), measured with the
// garbage collector off during that sync, so it is an upper bound. The
// time per op is not meaningful.
func BenchmarkSyncMemory(b *testing.B) {
	for _, size := range []benchSize{{10000, 10}} {
		b.Run(size.String(), func(b *testing.B) {
			var retained, peak float64
			for b.Loop() {
				retained, peak = syncMemory(b, size)
			}
			b.ReportMetric(retained/(1<<20), "retained-MB")
			b.ReportMetric(peak/(1<<20), "peak-MB")
		})
	}
}

func syncMemory(b *testing.B, size benchSize) (retained, peak float64) {
	c := benchCluster(size)
	in := c.input()
	c.Services, c.Slices = nil, nil
	var before, after, done runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := benchWriter(b)
	w.Sync(context.Background(), in)
	runtime.ReadMemStats(&after)
	w.Applied(nil)
	runtime.GC()
	runtime.ReadMemStats(&done)
	runtime.KeepAlive(c)
	runtime.KeepAlive(w)
	// peak: the maps (live before) plus everything the sync allocated.
	peak = float64(before.HeapAlloc) + float64(after.TotalAlloc-before.TotalAlloc)
	return float64(done.HeapAlloc), peak
}

// BenchmarkRuleTally measures what iptables mode adds to a sync for its
// rule gauges: reading a full payload of a loaded cluster into the count
// (a tally that has seen it before, as after the first full sync), and a
// partial payload of one changed endpoint.
func BenchmarkRuleTally(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.String(), func(b *testing.B) {
			_, w := loadedWriter(b, size)
			w.RequestFullSync()
			res := w.Sync(context.Background(), benchCluster(size).input())
			payload := slices.Clone(res.Payload)
			var tally iptables.RuleTally
			tally.Note(payload, true)
			b.ReportAllocs()
			for b.Loop() {
				tally.Note(payload, true)
			}
			b.ReportMetric(float64(len(payload)), "payload-B")
		})
	}
}

// BenchmarkAppliedFull measures what a Mode does once a full payload is
// applied: the writer's record of its chains, for the drift check, and
// the rule tally, for the rule gauges. "one-walk" is a Mode's writer,
// which reads the payload once for both; "two-walks" reads it once for
// each, as the Mode did before. The sync itself is not timed.
func BenchmarkAppliedFull(b *testing.B) {
	for _, size := range benchSizes[:2] {
		in := benchCluster(size).input()
		for _, oneWalk := range []bool{true, false} {
			name := size.String() + "/two-walks"
			if oneWalk {
				name = size.String() + "/one-walk"
			}
			b.Run(name, func(b *testing.B) {
				w := benchWriter(b)
				var tally iptables.RuleTally
				if oneWalk {
					iptables.SetRuleTally(w, &tally)
				}
				ctx := context.Background()
				// The first payload fills the writer's and the tally's
				// maps; the loop measures the resyncs after it.
				res := w.Sync(ctx, in)
				w.Applied(nil)
				if !oneWalk {
					tally.Note(res.Payload, res.Full)
				}
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					w.RequestFullSync()
					res := w.Sync(ctx, in)
					b.StartTimer()
					w.Applied(nil)
					if !oneWalk {
						tally.Note(res.Payload, res.Full)
					}
				}
			})
		}
	}
}
