package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// Benchmarks on the input of iptables' benchmarks (services × endpoints per
// service, ClusterIP services with one TCP port, endpoints over 100
// nodes). Run them with:
//
//	go test -run '^$' -bench . -benchmem ./nftables/
//
// They measure the writer alone: rendering the transaction, not running
// it. "ops" is the transaction's number of operations.

type benchSize struct{ services, endpoints int }

func (s benchSize) String() string { return fmt.Sprintf("%dx%d", s.services, s.endpoints) }

// benchCluster loads the cluster of iptables' benchmarks, writertest's,
// into a cluster.
func benchCluster(size benchSize) *cluster {
	c := newCluster(v1.IPv4Protocol, "node-1")
	c.LoadBench(size.services, size.endpoints)
	return c
}

// loadedWriter returns a cluster of the given size and a writer that has
// synced it.
func loadedWriter(b *testing.B, size benchSize) (*cluster, *nftables.Writer) {
	c := benchCluster(size)
	w := benchWriter(b)
	w.Sync(context.Background(), c.input())
	w.Applied(nil)
	return c, w
}

func benchWriter(b *testing.B) *nftables.Writer {
	w, err := nftables.NewWriter(knftables.NewFake(knftables.IPv4Family, nftables.DefaultTableName),
		nftables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}}})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkSyncFirst measures the first sync of a new writer, into a
// table that does not exist: every element claimed from empty tables and
// rendered.
func BenchmarkSyncFirst(b *testing.B) {
	for _, size := range []benchSize{{1000, 10}, {10000, 10}} {
		b.Run(size.String(), func(b *testing.B) {
			in := benchCluster(size).input()
			ctx := context.Background()
			b.ReportAllocs()
			var res nftables.SyncResult
			for b.Loop() {
				w := benchWriter(b)
				res = w.Sync(ctx, in)
			}
			b.ReportMetric(float64(res.Transaction.NumOperations()), "ops")
		})
	}
}

// BenchmarkSyncFull measures a full sync of a loaded cluster by a writer
// that synced it before (as periodic full syncs are).
func BenchmarkSyncFull(b *testing.B) {
	for _, size := range []benchSize{{1000, 10}, {10000, 10}} {
		b.Run(size.String(), func(b *testing.B) {
			c := benchCluster(size)
			in := c.input()
			w := benchWriter(b)
			ctx := context.Background()
			w.Sync(ctx, in)
			w.Applied(nil)
			b.ReportAllocs()
			var res nftables.SyncResult
			for b.Loop() {
				w.RequestFullSync()
				res = w.Sync(ctx, in)
				w.Applied(nil)
			}
			if !res.Full {
				b.Fatal("sync was not full")
			}
			b.ReportMetric(float64(res.Transaction.NumOperations()), "ops")
		})
	}
}

// BenchmarkSyncPartial measures a partial sync after one endpoint of one
// service turned not ready (or back), trackers' Update included, and
// reports the writer's part alone as writer-ns/op and the transaction's
// size in bytes of nft text.
func BenchmarkSyncPartial(b *testing.B) {
	for _, size := range []benchSize{{1000, 10}, {10000, 10}, {30000, 10}} {
		b.Run(size.String(), func(b *testing.B) {
			c := benchCluster(size)
			slices := c.Slices
			w := benchWriter(b)
			ctx := context.Background()
			w.Sync(ctx, c.input())
			w.Applied(nil)
			names := make([]string, 0, len(slices))
			for name := range slices {
				names = append(names, name)
			}
			changed := map[string]*discoveryv1.EndpointSlice{}
			for name, s := range slices {
				changed[name] = s.DeepCopy()
				changed[name].Endpoints[0].Conditions.Ready = ptr.To(false)
			}
			b.ReportAllocs()
			var ops, bytes, i int
			var writerTime time.Duration
			for b.Loop() {
				name := names[(i/2)%len(names)]
				s := slices[name]
				if i%2 == 0 {
					s = changed[name]
				}
				i++
				c.EndpointTracker.EndpointSliceUpdate(s, false)
				in := c.input()
				start := time.Now()
				res := w.Sync(ctx, in)
				writerTime += time.Since(start)
				w.Applied(nil)
				if res.Full || res.ServicePortsWritten != 1 {
					b.Fatalf("full=%v, %d ports written; want a partial sync of 1", res.Full, res.ServicePortsWritten)
				}
				ops += res.Transaction.NumOperations()
				if i <= 2 {
					bytes = len(res.Transaction.String())
				}
			}
			b.ReportMetric(float64(ops)/float64(i), "ops")
			b.ReportMetric(float64(bytes), "tx-B")
			b.ReportMetric(float64(writerTime.Nanoseconds())/float64(i), "writer-ns/op")
		})
	}
}

// BenchmarkSyncPartialWithoutWalk measures partial syncs whose changed
// Service's ports the writer once found by walking the whole map:
// "service", after one Service object changed (its session affinity
// turned on, or off), which writes its one port; "portless", after the
// endpoints of a Service without ports in the map (headless) changed,
// which writes nothing. Trackers' Update is included. Both cost the
// change whatever the number of services.
func BenchmarkSyncPartialWithoutWalk(b *testing.B) {
	changes := []struct {
		name   string
		change func(c *cluster, services, i int)
		ports  int // written by each sync
	}{
		{"service", func(c *cluster, services, i int) {
			n := (i / 2) % services
			svc := writertest.Service("bench", fmt.Sprintf("svc-%d", n), fmt.Sprintf("10.96.%d.%d", n/250, n%250+1))
			if i%2 == 0 {
				writertest.WithAffinity(100)(svc)
			}
			c.SetService(svc)
		}, 1},
		{"portless", func(c *cluster, _, i int) {
			c.SetEndpoints("bench", "headless", tcp8080, ep{IP: fmt.Sprintf("10.0.0.%d", 1+i%2), Node: "node-1"})
		}, 0},
	}
	for _, ch := range changes {
		for _, size := range []benchSize{{1000, 10}, {30000, 10}} {
			b.Run(ch.name+"/"+size.String(), func(b *testing.B) {
				c, w := loadedWriter(b, size)
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					ch.change(c, size.services, i)
					i++
					res := w.Sync(ctx, c.input())
					w.Applied(nil)
					if res.Full || res.ServicePortsWritten != ch.ports {
						b.Fatalf("full=%v, %d ports written; want a partial sync of %d", res.Full, res.ServicePortsWritten, ch.ports)
					}
				}
			})
		}
	}
}
