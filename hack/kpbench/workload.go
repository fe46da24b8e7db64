package main

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// nodeName is the node both sides proxy for; the workload's endpoints are
// spread over node-0 … node-99, so 1 % of them are local.
const nodeName = "node-1"

// workload is the cluster both sides are fed, object for object: the
// writers' benchmark cluster of writertest.LoadBench (ClusterIP Services
// of one TCP port, Service i at 10.96.<i/250>.<i%250+1>, one EndpointSlice
// of ready endpoints each, spread over 100 nodes), built as API objects so
// that kube-proxy's handlers and proxykit's trackers get the same ones.
type workload struct {
	services, endpoints int
	svcs                []*v1.Service
	slices              []*discoveryv1.EndpointSlice
	// next is the number of the next endpoint address to hand out.
	next int
}

func newWorkload(services, endpoints int) *workload {
	w := &workload{services: services, endpoints: endpoints}
	for i := range services {
		svc, slice := w.service(i)
		w.svcs = append(w.svcs, svc)
		w.slices = append(w.slices, slice)
	}
	return w
}

// service makes Service i and its slice, with fresh endpoint addresses.
func (w *workload) service(i int) (*v1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	svc := writertest.Service("bench", name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1))
	eps := make([]writertest.Endpoint, 0, w.endpoints)
	for range w.endpoints {
		eps = append(eps, w.endpoint())
	}
	return svc, writertest.Slice(v1.IPv4Protocol, "bench", name, writertest.TCP8080, eps...)
}

// endpoint hands out the next endpoint address: the n-th at
// 10.<128+(n>>16&63)>.<n>>8&255>.<n&255>, on node-<n%100>, as LoadBench.
func (w *workload) endpoint() writertest.Endpoint {
	n := w.next
	w.next++
	return writertest.Endpoint{IP: fmt.Sprintf("10.%d.%d.%d", 128+n>>16&63, n>>8&255, n&255), Node: fmt.Sprintf("node-%d", n%100)}
}

// moveEndpoint returns Service i's slice with its first endpoint replaced
// by one at a new address: one endpoint going and one coming, the number
// unchanged. The slice in w becomes the new one.
func (w *workload) moveEndpoint(i int) (old, cur *discoveryv1.EndpointSlice) {
	old = w.slices[i]
	cur = old.DeepCopy()
	ep := w.endpoint()
	fresh := writertest.Slice(v1.IPv4Protocol, "bench", w.svcs[i].Name, writertest.TCP8080, ep)
	cur.Endpoints[0] = fresh.Endpoints[0]
	w.slices[i] = cur
	return old, cur
}

// addService makes the next Service and its slice and keeps them in w.
func (w *workload) addService() (*v1.Service, *discoveryv1.EndpointSlice) {
	svc, slice := w.service(len(w.svcs))
	w.svcs = append(w.svcs, svc)
	w.slices = append(w.slices, slice)
	return svc, slice
}
