package ebpf_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterNoLocalEndpointsInternal: a port under internalTrafficPolicy
// Local counts in NoLocalEndpointsInternal when it has usable endpoints,
// none of them on this node; with no usable endpoint anywhere it is
// refused for want of any endpoint, and kube-proxy does not count it.
func TestWriterNoLocalEndpointsInternal(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []writertest.Endpoint
		want int
	}{
		{"ready endpoint elsewhere", []writertest.Endpoint{{IP: "10.1.0.1", Node: "node-b"}}, 1},
		{"ready endpoint here", []writertest.Endpoint{{IP: "10.1.0.1", Node: writertest.Node}, {IP: "10.1.0.2", Node: "node-b"}}, 0},
		{"no usable endpoint anywhere", []writertest.Endpoint{{IP: "10.1.0.1", Node: writertest.Node, NotReady: true}, {IP: "10.1.0.2", Node: "node-b", NotReady: true}}, 0},
		{"no endpoints", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fk := ebpftest.NewFake(v1.IPv4Protocol, ebpf.Sizes{})
			w, err := ebpf.NewWriter(fk, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
			if err != nil {
				t.Fatal(err)
			}
			c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
			c.SetService(writertest.Service("ns", "web", "10.96.0.10", writertest.WithInternalLocal()))
			c.SetEndpoints("ns", "web", writertest.TCP8080, tc.eps...)
			r, err := w.Sync(context.Background(), c.Input())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, r.NoLocalEndpointsInternal); diff != "" {
				t.Errorf("NoLocalEndpointsInternal (-want +got):\n%s", diff)
			}
		})
	}
}
