package proxier_test

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// printBackend is a whole proxy mode: it prints every service port and the
// endpoints this node would send its cluster traffic to. A real one would
// program them into the kernel (or eBPF maps, or OVS flows) instead.
type printBackend struct{ nodeName string }

func (b printBackend) Sync(_ context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	results := make([]proxy.SyncResult, len(ins))
	for i, in := range ins {
		var names []changetracker.ServicePortName
		for name := range in.Services {
			names = append(names, name)
		}
		slices.SortFunc(names, func(a, b changetracker.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
		for _, name := range names {
			svc := in.Services[name]
			cluster, _, _, _ := changetracker.CategorizeEndpoints(in.Endpoints[name], svc, b.nodeName, in.NodeLabels)
			fmt.Printf("%s %s %s -> %v\n", in.Family, name, svc, cluster)
		}
		results[i] = proxy.SyncResult{Full: true, ServicePorts: len(names)}
	}
	return results, nil
}

// Run returns at once: nothing here can be removed by another program.
func (printBackend) Run(context.Context, func()) {}

// A proxy whose datapath prints, run once against a fake cluster: one
// dual-stack Service with an endpoint of each family, on a dual-stack
// node.
func Example() {
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
		exampleSlice("web-v4", discoveryv1.AddressTypeIPv4, "10.244.1.5"),
		exampleSlice("web-v6", discoveryv1.AddressTypeIPv6, "fd00:244::5"),
	)
	p, err := proxier.New(client, "node-a",
		func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
			// One backend for both families; a backend per family, each
			// with a group of its own, fits as well.
			return []proxier.BackendGroup{{Backend: printBackend{node.Name}, Families: node.Families}}, nil
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Run would go on syncing until its context is done.
	if err := p.RunOnce(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// IPv4 default/web:http 10.96.0.10:80/TCP -> [10.244.1.5:8080]
	// IPv6 default/web:http [fd00:96::10]:80/TCP -> [[fd00:244::5]:8080]
}

func exampleSlice(name string, at discoveryv1.AddressType, addr string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
}
