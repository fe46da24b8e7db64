package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
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
	objs := clustertest.Cluster(services, endpoints)
	// As the manifests package does: NewClientset's field management
	// would add to every write a cost of the fake alone.
	client := fake.NewSimpleClientset(objs...)

	m, err := newMetrics(nil, func() int { return 0 }, func() int { return 0 })
	if err != nil {
		b.Fatal(err)
	}
	rec := &recordingBackend{Backend: newWriterBackend(b)}
	fp := newFamilyProxier(ctx, v1.IPv4Protocol, "node-a", changetracker.NewNodeTopology("node-a"), m)
	// No Service of the cluster has a health-check node port, so the
	// server opens nothing; it still gets every Service's local endpoint
	// count, as a long-running proxier's does.
	fp.svcHealth = newServiceHealth(healthz.NewServiceHealthServer("node-a", nil,
		healthz.WithListenFunc(func(context.Context, string, string) (net.Listener, error) {
			return nil, errors.New("the benchmark opens no health-check node port")
		})))
	g := &syncGroup{backend: rec, families: []*familyProxier{fp}}
	queued := make(chan struct{}, 1)
	fp.requestSync = func() {
		select {
		case queued <- struct{}{}:
		default:
		}
	}
	stop, err := watchServices(ctx, client, &handlers{families: []*familyProxier{fp}, metrics: m}, "")
	defer func() { cancel(); stop() }()
	if err != nil {
		b.Fatal(err)
	}
	if err := g.sync(ctx); err != nil {
		b.Fatal(err)
	}
	if n := len(fp.svcMap); n != services {
		b.Fatalf("%d service ports after the first sync, want %d", n, services)
	}
	<-queued // the initial list's

	slices := make([]*discoveryv1.EndpointSlice, 0, services)
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slices = append(slices, s)
		}
	}
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
