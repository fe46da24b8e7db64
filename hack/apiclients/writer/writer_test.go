package writer_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/hack/apiclients/writer"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestApplyWithFake programs one Service through the writer into the
// iptables fake, then moves its endpoint, and traces a packet to the
// cluster IP after each sync: the first sync is full, the second partial,
// and the packet is DNATed to the endpoint of the moment.
func TestApplyWithFake(t *testing.T) {
	ctx := context.Background()
	ipt := iptablestest.NewFake()
	w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}})
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	svcs := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil)
	eps := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil)
	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
	svcs.Update(nil, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	})

	type step struct {
		Full bool
		To   string
	}
	var got []step
	for _, endpoint := range []string{"10.244.1.5", "10.244.2.7"} {
		eps.EndpointSliceUpdate(slice(endpoint), false)
		in := &proxy.FamilyInput{
			ServiceChanges:  svcMap.Update(svcs),
			EndpointChanges: epMap.Update(eps),
			Services:        svcMap,
			Endpoints:       epMap,
		}
		res, err := writer.Apply(ctx, w, ipt, in)
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		outs, err := ipt.Trace(iptablestest.Packet{
			Protocol: "tcp",
			Source:   netip.MustParseAddr("10.244.9.9"), SourcePort: 40000,
			Destination: netip.MustParseAddr("10.96.0.10"), DestinationPort: 80,
		})
		if err != nil {
			t.Fatalf("Trace: %v", err)
		}
		for _, o := range outs {
			got = append(got, step{Full: res.Full, To: netip.AddrPortFrom(o.Destination, o.DestinationPort).String()})
		}
	}
	want := []step{{Full: true, To: "10.244.1.5:8080"}, {Full: false, To: "10.244.2.7:8080"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("where the packet goes after each sync (-want +got):\n%s", diff)
	}
}

// slice is Service default/web's only EndpointSlice, with one ready
// endpoint at addr on port http (8080).
func slice(addr string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
}
