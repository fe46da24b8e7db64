package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/iptables"
)

// benchCluster returns a cluster of services Services in namespace
// "bench", each with one TCP port and one EndpointSlice of endpoints
// endpoints, the first on node-a (this node), the others on node-b.
// Service i has cluster IP 10.96.0.0+i+1 and endpoints 10.128.0.0+10i+j.
// The objects carry their kind, so that they can be written as manifests.
func benchCluster(services, endpoints int) []runtime.Object {
	ip := func(base string, n int) string {
		b := netip.MustParseAddr(base).As4()
		binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+uint32(n))
		return netip.AddrFrom4(b).String()
	}
	objs := []runtime.Object{&v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.1"}}},
	}}
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		clusterIP := ip("10.96.0.0", i+1)
		objs = append(objs, &v1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: v1.ServiceSpec{
				ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
				Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}},
			},
		})
		slice := &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for j := range endpoints {
			node := "node-b"
			if j == 0 {
				node = "node-a"
			}
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{ip("10.128.0.0", 10*i+j)},
				NodeName:   ptr.To(node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			})
		}
		objs = append(objs, slice)
	}
	return objs
}

// BenchmarkPipeline times what a proxier does for one EndpointSlice update,
// from the API's write to the iptables-restore payload being ready: the
// client-go fake clientset's watch, the informer, the event handler and the
// endpoints change tracker, then the sync function with the maps' updates
// and the rule writer's partial sync, then the service health bookkeeping.
// It uses the example's own handlers, familyProxier, iptables backend and
// service health server, with a dry-run backend in place of the kernel. The runner's min-sync-period wait is left out: it is a
// deliberate delay, not work. Each iteration flips the readiness of one
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
	objs := benchCluster(services, endpoints)
	// As the manifests package does: NewClientset's field management
	// would add about 1.4ms to every write, a cost of the fake alone.
	client := fake.NewSimpleClientset(objs...)

	m := newMetrics(func() int { return 0 }, func() int { return 0 })
	rec := &recordingBackend{backend: newBenchBackend(b, m)}
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
	stop, err := watchServices(ctx, client, &handlers{families: []*familyProxier{fp}, metrics: m})
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

// newBenchBackend returns the IPv4 iptables backend of node-a in
// benchCluster, in a dry run that prints nothing.
func newBenchBackend(tb testing.TB, m *metrics) *iptablesBackend {
	tb.Helper()
	backend, err := newIPTablesBackend(context.Background(), iptables.WriterConfig{
		IPFamily:    v1.IPv4Protocol,
		NodeName:    "node-a",
		NodeIPs:     []netip.Addr{netip.MustParseAddr("192.168.0.1")},
		ClusterCIDR: netip.MustParsePrefix("10.128.0.0/10"),
	}, nil, io.Discard, m, 0, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return backend
}

// recordingBackend counts the syncs of the backend it wraps.
type recordingBackend struct {
	backend
	full, partial int
}

func (r *recordingBackend) sync(ctx context.Context, ins []*syncInput) ([]syncOutcome, error) {
	outs, err := r.backend.sync(ctx, ins)
	for _, out := range outs {
		if out.full {
			r.full++
		} else {
			r.partial++
		}
	}
	return outs, err
}
