package backend_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/hack/apiclients/backend"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// TestBackendWithProxier runs the out-of-tree Backend under a proxier,
// once, against a fake cluster with one dual-stack Service: each family's
// table holds the Service's address with its ready endpoint, and not the
// one that is not ready.
func TestBackendWithProxier(t *testing.T) {
	client := fake.NewClientset(
		&v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "192.168.0.1"},
				{Type: v1.NodeInternalIP, Address: "fd00::1"},
			}},
		},
		&v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
			Spec: v1.ServiceSpec{
				ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
				Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
			},
		},
		slice("web-v4", discoveryv1.AddressTypeIPv4, "10.244.1.5", "10.244.1.6"),
		slice("web-v6", discoveryv1.AddressTypeIPv6, "fd00:244::5", "fd00:244::6"),
	)
	b := &backend.Backend{NodeName: "node-a"}
	p, err := proxier.New(client, "node-a",
		func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
			return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
		})
	if err != nil {
		t.Fatalf("proxier.New: %v", err)
	}
	if err := p.RunOnce(context.Background()); err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	got := map[v1.IPFamily]backend.Table{v1.IPv4Protocol: b.Table(v1.IPv4Protocol), v1.IPv6Protocol: b.Table(v1.IPv6Protocol)}
	want := map[v1.IPFamily]backend.Table{
		v1.IPv4Protocol: {"10.96.0.10:80/TCP": {"10.244.1.5:8080"}},
		v1.IPv6Protocol: {"[fd00:96::10]:80/TCP": {"[fd00:244::5]:8080"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tables after one sync (-want +got):\n%s", diff)
	}
}

// slice is an EndpointSlice of Service default/web on port http (8080):
// ready is ready, notReady is not.
func slice(name string, at discoveryv1.AddressType, ready, notReady string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{ready}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{notReady}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		},
	}
}
