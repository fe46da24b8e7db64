package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/internal/testkit/clustertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// BenchmarkPipeline times what a Proxier does for one EndpointSlice update,
// from the API's write to the Backend having rendered it: the client-go
// fake clientset's watch, the informer, the event handler and the
// endpoints change tracker, then the sync with the maps' updates, a
// Backend that renders the iptables rule writer's partial sync (as
// iptables.Mode's dry run does, without printing), and the service
// health bookkeeping. The runner's min-sync-period wait is left out: it is
// a deliberate delay, not work. Each iteration flips the readiness of one
// endpoint of another service.
func BenchmarkPipeline(b *testing.B) {
	for _, size := range []struct{ services, endpoints int }{{1000, 10}, {10000, 10}, {30000, 10}} {
		b.Run(fmt.Sprintf("%dx%d", size.services, size.endpoints), func(b *testing.B) {
			benchPipeline(b, size.services, size.endpoints)
		})
	}
}

func benchPipeline(b *testing.B, services, endpoints int) {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	defer cancel()
	bf := startBenchFamily(ctx, b, services, endpoints, nil)
	// The informers stop with ctx, which stop waits for.
	defer func() { cancel(); bf.stop() }()
	client, slices, g, rec, queued := bf.client, bf.slices, bf.g, bf.rec, bf.queued
	sliceClient := client.DiscoveryV1().EndpointSlices("bench")
	var inSync time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s := slices[i%len(slices)]
		ready := s.Endpoints[1].Conditions.Ready
		s.Endpoints[1].Conditions.Ready = ptr.To(!*ready)
		if _, err := sliceClient.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		<-queued
		start := time.Now()
		if err := g.sync(ctx); err != nil {
			b.Fatal(err)
		}
		inSync += time.Since(start)
	}
	b.StopTimer()
	// The sync's share: the trackers' map updates and the writer.
	b.ReportMetric(float64(inSync.Nanoseconds())/float64(b.N), "sync-ns/op")
	if rec.full != 1 || rec.partial != b.N {
		b.Errorf("%d full and %d partial syncs, want the first full and %d partial", rec.full, rec.partial, b.N)
	}
}

// benchFamily is one family of a Proxier over a fake clientset of a
// generated cluster, as the benchmarks drive it: its informers running,
// its first sync done, and each change's request for a sync signalled on
// queued instead of waking a runner.
type benchFamily struct {
	client *fake.Clientset
	slices []*discoveryv1.EndpointSlice
	g      *syncGroup
	fp     *familyProxier
	rec    *recordingBackend
	queued chan struct{}
	stop   func()
}

// startBenchFamily starts the IPv4 family of node-a in a cluster of
// services with endpoints each, rendering through newWriterBackend, with
// hs as its proxy health server (nil: none).
func startBenchFamily(ctx context.Context, b *testing.B, services, endpoints int, hs *healthz.ProxyHealthServer) *benchFamily {
	b.Helper()
	objs := clustertest.Cluster(services, endpoints)
	// As the manifests package does: NewClientset's field management
	// would add to every write a cost of the fake alone.
	client := fake.NewSimpleClientset(objs...)
	m, err := newMetrics(nil, func() int { return 0 }, func() int { return 0 })
	if err != nil {
		b.Fatal(err)
	}
	bf := &benchFamily{client: client, rec: &recordingBackend{Backend: newWriterBackend(b)}, queued: make(chan struct{}, 1)}
	bf.fp = newFamilyProxier(ctx, v1.IPv4Protocol, "node-a", changetracker.NewNodeTopology("node-a"), m)
	newFamilyShare(v1.IPv4Protocol, hs, m).join(bf.fp)
	// No Service of the cluster has a health-check node port, so the
	// server opens nothing; it still gets every Service's local endpoint
	// count, as a long-running proxier's does.
	var reporter healthz.HealthReporter
	if hs != nil {
		reporter = hs
	}
	bf.fp.svcHealth = newServiceHealth(healthz.NewServiceHealthServer("node-a", reporter,
		healthz.WithListenFunc(func(context.Context, string, string) (net.Listener, error) {
			return nil, errors.New("the benchmark opens no health-check node port")
		})))
	bf.g = &syncGroup{backend: bf.rec, families: []*familyProxier{bf.fp}}
	bf.fp.requestSync = func() {
		select {
		case bf.queued <- struct{}{}:
		default:
		}
	}
	stop, err := watchServices(ctx, client, &handlers{families: []*familyProxier{bf.fp}, metrics: m}, "")
	bf.stop = stop
	if err != nil {
		b.Fatal(err) // the caller's ctx stops the informers
	}
	if err := bf.g.sync(ctx); err != nil {
		b.Fatal(err)
	}
	if n := len(bf.fp.svcMap); n != services {
		b.Fatalf("%d service ports after the first sync, want %d", n, services)
	}
	<-bf.queued // the initial list's
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			bf.slices = append(bf.slices, s)
		}
	}
	return bf
}

// writerBackend is a Backend that renders each family's rules with the
// iptables rule writer and applies nothing, as iptables.Mode's dry run
// does without printing.
type writerBackend struct{ w *iptables.Writer }

// newWriterBackend returns the IPv4 writer backend of node-a in
// benchCluster.
func newWriterBackend(tb testing.TB) *writerBackend {
	tb.Helper()
	w, err := iptables.NewWriter(iptables.WriterConfig{
		Family:         v1.IPv4Protocol,
		Node:           proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/10")}},
		FullSyncPeriod: time.Hour,
		RandomFully:    true,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &writerBackend{w: w}
}

func (b *writerBackend) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	outs := make([]proxy.SyncResult, len(ins))
	for i, in := range ins {
		res := b.w.Sync(ctx, in)
		b.w.Applied(nil)
		outs[i] = proxy.SyncResult{Full: res.Full, ServicePorts: res.ServicePorts, Endpoints: res.Endpoints}
	}
	return outs, nil
}

func (b *writerBackend) Run(context.Context, func()) {}

// recordingBackend counts the syncs of the Backend it wraps.
type recordingBackend struct {
	proxy.Backend
	full, partial int
}

func (r *recordingBackend) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	outs, err := r.Backend.Sync(ctx, ins)
	for _, out := range outs {
		if out.Full {
			r.full++
		} else {
			r.partial++
		}
	}
	return outs, err
}

// BenchmarkIdleSync times what a Proxier does at a periodic sync when
// nothing changed since the last one, as it does every sync period on an
// idle cluster: the maps' updates with no change pending, a Backend that
// renders through the iptables rule writer (whose generation check finds
// nothing to write), then the service health, proxy health and metrics
// bookkeeping of a good sync.
func BenchmarkIdleSync(b *testing.B) {
	for _, services := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("%dx10", services), func(b *testing.B) { benchIdleSync(b, services, 10) })
	}
}

func benchIdleSync(b *testing.B, services, endpoints int) {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	defer cancel()
	bf := startBenchFamily(ctx, b, services, endpoints, healthz.NewProxyHealthServer("", time.Minute))
	// The informers stop with ctx, which stop waits for.
	defer func() { cancel(); bf.stop() }()
	g, rec := bf.g, bf.rec
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := g.sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if rec.full != 1 || rec.partial != b.N {
		b.Errorf("%d full and %d partial syncs, want the first full and %d partial", rec.full, rec.partial, b.N)
	}
}

// BenchmarkChurnHeap reports the heap that 100 one-endpoint changes leave
// live, each synced through a Proxier's family as BenchmarkPipeline
// syncs it: the live heap after a collection once they are synced, less
// the live heap after the first sync. A leak shows as retained bytes that
// grow with the changes; the maps themselves do not grow, since each
// change flips the readiness of an endpoint that exists.
func BenchmarkChurnHeap(b *testing.B) {
	b.Run("10000x10", func(b *testing.B) { benchChurnHeap(b, 10000, 10, 100) })
}

func benchChurnHeap(b *testing.B, services, endpoints, changes int) {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	defer cancel()
	bf := startBenchFamily(ctx, b, services, endpoints, healthz.NewProxyHealthServer("", time.Minute))
	// The informers stop with ctx, which stop waits for.
	defer func() { cancel(); bf.stop() }()
	client, slices, g, queued := bf.client, bf.slices, bf.g, bf.queued
	sliceClient := client.DiscoveryV1().EndpointSlices("bench")
	liveHeap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	churn := func() {
		// The same endpoints each time, so that what a change leaves
		// behind cannot pass for state of endpoints not touched before.
		for i := range changes {
			s := slices[i]
			ready := s.Endpoints[1].Conditions.Ready
			s.Endpoints[1].Conditions.Ready = ptr.To(!*ready)
			if _, err := sliceClient.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
				b.Fatal(err)
			}
			// The fake records every action; a real API client keeps
			// none.
			client.ClearActions()
			<-queued
			if err := g.sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	afterFirst := liveHeap()
	// What the first sync leaves for the first partial ones to drop
	// (the writer's full-sync buffers) is not churn's: the baseline is
	// taken after one round.
	churn()
	before := liveHeap()
	b.ResetTimer()
	for range b.N {
		churn()
	}
	b.StopTimer()
	after := liveHeap()
	// Live until the heap is read: the objects, the client, the sync.
	runtime.KeepAlive(slices)
	runtime.KeepAlive(g)
	runtime.KeepAlive(client)
	b.ReportMetric(float64(afterFirst), "live-after-first-sync-B")
	b.ReportMetric(float64(before), "live-B")
	b.ReportMetric(float64(int64(after)-int64(before))/float64(b.N), "retained-B/100changes")
}
