package changetracker

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testkit/benchcpu"
)

// Benchmarks for the cluster sizes in DESIGN.md. Run them by pattern, e.g.
//
//	go test -run XXX -bench 'InitialLoad/10000x10|SingleSliceChange/10000x10|RetainedMemory' -benchmem ./changetracker/

type benchSize struct{ services, endpoints int }

func (s benchSize) String() string { return fmt.Sprintf("%dx%d", s.services, s.endpoints) }

// benchCluster builds services with one TCP port each and, per service,
// EndpointSlices of at most 100 endpoints spread over 100 nodes in 3 zones,
// as the EndpointSlice controller would.
func benchCluster(size benchSize) ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*v1.Service, 0, size.services)
	var slices []*discoveryv1.EndpointSlice
	nodes := make([]string, 100)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i)
	}
	zones := []string{"zone-a", "zone-b", "zone-c"}
	n := 0
	for i := range size.services {
		name := fmt.Sprintf("svc-%d", i)
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		svcs = append(svcs, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: v1.ServiceSpec{
				Type:       v1.ServiceTypeClusterIP,
				ClusterIP:  ip,
				ClusterIPs: []string{ip},
				Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
			},
		})
		for start := 0; start < size.endpoints; start += 100 {
			slice := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: "bench",
					Name:      fmt.Sprintf("%s-%d", name, start/100),
					Labels:    map[string]string{discoveryv1.LabelServiceName: name},
				},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
			}
			for k := start; k < size.endpoints && k < start+100; k++ {
				slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+n>>16&63, n>>8&255, n&255)},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
					NodeName:   &nodes[n%len(nodes)],
					Zone:       &zones[n%len(zones)],
				})
				n++
			}
			slices = append(slices, slice)
		}
	}
	return svcs, slices
}

type loaded struct {
	svcTracker *ServiceChangeTracker
	epTracker  *EndpointsChangeTracker
	svcMap     ServicePortMap
	epMap      EndpointsMap
}

func loadCluster(svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) *loaded {
	quiet := WithLogger(klog.Background().V(10))
	l := &loaded{
		svcTracker: NewServiceChangeTracker(v1.IPv4Protocol, nil, quiet),
		epTracker:  NewEndpointsChangeTracker(v1.IPv4Protocol, "node-1", nil, quiet),
		svcMap:     ServicePortMap{},
		epMap:      EndpointsMap{},
	}
	for _, s := range svcs {
		l.svcTracker.Update(nil, s)
	}
	for _, s := range slices {
		l.epTracker.EndpointSliceUpdate(s, false)
	}
	l.svcMap.Update(l.svcTracker)
	l.epMap.Update(l.epTracker)
	return l
}

// BenchmarkInitialLoad feeds a whole cluster through fresh trackers and
// applies it to empty maps: what a proxy does at start-up.
func BenchmarkInitialLoad(b *testing.B) {
	for _, size := range []benchSize{{1000, 10}, {10000, 10}, {1000, 100}} {
		b.Run(size.String(), func(b *testing.B) {
			svcs, slices := benchCluster(size)
			b.ReportAllocs()
			cpu := benchcpu.Start()
			for b.Loop() {
				l := loadCluster(svcs, slices)
				if len(l.epMap) != size.services {
					b.Fatalf("loaded %d endpoint lists, want %d", len(l.epMap), size.services)
				}
			}
			cpu.Report(b)
		})
	}
}

// BenchmarkSingleSliceChange measures one EndpointSlice update (one endpoint
// turning not-ready and back) plus the Update that applies it, in a loaded
// cluster. It must not grow with the cluster.
func BenchmarkSingleSliceChange(b *testing.B) {
	for _, size := range []benchSize{{1000, 10}, {10000, 10}} {
		b.Run(size.String(), func(b *testing.B) {
			svcs, slices := benchCluster(size)
			l := loadCluster(svcs, slices)
			changed := make([]*discoveryv1.EndpointSlice, len(slices))
			for i, s := range slices {
				c := s.DeepCopy()
				c.Endpoints[0].Conditions.Ready = ptr.To(false)
				changed[i] = c
			}
			b.ReportAllocs()
			cpu := benchcpu.Start()
			i := 0
			for b.Loop() {
				k := (i / 2) % len(slices)
				s := slices[k]
				if i%2 == 0 {
					s = changed[k]
				}
				i++
				if !l.epTracker.EndpointSliceUpdate(s, false) {
					b.Fatal("change not recorded")
				}
				l.svcMap.Update(l.svcTracker)
				if res := l.epMap.Update(l.epTracker); res.UpdatedServices.Len() != 1 {
					b.Fatalf("%d services updated, want 1", res.UpdatedServices.Len())
				}
			}
			cpu.Report(b)
		})
	}
}

// BenchmarkRetainedMemory reports the heap the trackers and maps keep after a
// full load, once the API objects are gone ("retained-MB"). The time per op is
// that of a load and is not meaningful.
func BenchmarkRetainedMemory(b *testing.B) {
	for _, size := range []benchSize{{10000, 10}, {5000, 100}} {
		b.Run(size.String(), func(b *testing.B) {
			var retained float64
			for b.Loop() {
				retained = retainedBytes(size)
			}
			b.ReportMetric(retained/(1<<20), "retained-MB")
		})
	}
}

func retainedBytes(size benchSize) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := func() *loaded {
		svcs, slices := benchCluster(size)
		return loadCluster(svcs, slices)
	}()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(l)
	return float64(after.HeapAlloc) - float64(before.HeapAlloc)
}
