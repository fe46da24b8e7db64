package proxier_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testkit/clustertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// signallingBackend tells the benchmark when its Backend has synced, and
// whether fully.
type signallingBackend struct {
	proxy.Backend
	synced chan bool
}

func (b *signallingBackend) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	outs, err := b.Backend.Sync(ctx, ins)
	if err == nil {
		b.synced <- outs[0].Full
	}
	return outs, err
}

// BenchmarkRun times one EndpointSlice update through a running Proxier,
// from the write to the fake clientset to iptables.Mode's dry run (no
// output) having rendered the partial sync: what BenchmarkPipeline times,
// plus the runner waking up for the request (min sync period 0). Each
// iteration flips the readiness of one endpoint of another service.
func BenchmarkRun(b *testing.B) {
	for _, services := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("%dx10", services), func(b *testing.B) { benchRun(b, services, 10) })
	}
}

func benchRun(b *testing.B, services, endpoints int) {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	objs := clustertest.Cluster(services, endpoints)
	client := fake.NewSimpleClientset(objs...)
	sb := &signallingBackend{synced: make(chan bool, 1)}
	p, err := proxier.New(client, "node-a",
		func(ctx context.Context, node proxier.Node, m *proxy.Metrics) ([]proxier.BackendGroup, error) {
			ib, err := iptables.NewMode(ctx, iptables.WriterConfig{
				Family: v1.IPv4Protocol,
				Node:   proxy.NodeConfig{Name: node.Name, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/10")}},
			}, nil, iptables.WithMetrics(m))
			sb.Backend = ib
			return []proxier.BackendGroup{{Backend: sb, Families: []v1.IPFamily{v1.IPv4Protocol}}}, err
		}, proxier.WithSyncPeriods(0, time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()

	var slices []*discoveryv1.EndpointSlice
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slices = append(slices, s)
		}
	}
	sliceClient := client.DiscoveryV1().EndpointSlices("bench")
	if full := <-sb.synced; !full {
		b.Fatal("the first sync was partial")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s := slices[i%len(slices)]
		ready := s.Endpoints[1].Conditions.Ready
		s.Endpoints[1].Conditions.Ready = ptr.To(!*ready)
		if _, err := sliceClient.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		if full := <-sb.synced; full {
			b.Fatal("a one-endpoint change brought a full sync")
		}
	}
	b.StopTimer()
}
