package changetracker_test

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
)

// A proxier's typical use: informer handlers feed the trackers, and the sync
// function applies the pending changes and categorizes each changed
// service's endpoints.
func Example() {
	const nodeName = "node-a"
	svcTracker := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil)
	epTracker := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, nodeName, nil)
	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}

	// What the informer handlers (OnServiceAdd, OnEndpointSliceAdd, ...) do.
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			ClusterIP:             "10.96.0.10",
			ClusterIPs:            []string{"10.96.0.10"},
			Type:                  v1.ServiceTypeNodePort,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []v1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "web-abc12",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.1.5"}, NodeName: ptr.To("node-b")},
			{Addresses: []string{"10.0.0.7"}, NodeName: ptr.To(nodeName)},
		},
	}
	svcTracker.Update(nil, svc)
	epTracker.EndpointSliceUpdate(slice, false)

	// The sync function.
	svcResult := svcMap.Update(svcTracker)
	epResult := epMap.Update(epTracker)
	changed := svcResult.UpdatedServices.Union(epResult.UpdatedServices)
	for name, port := range svcMap {
		if !changed.Has(name.NamespacedName) {
			continue // a partial sync leaves unchanged services alone
		}
		cluster, local, _, hasAny := changetracker.CategorizeEndpoints(epMap[name], port, nodeName, nil)
		fmt.Println(name, port)
		fmt.Println("  cluster:", names(cluster))
		fmt.Println("  local:  ", names(local))
		fmt.Println("  any:    ", hasAny)
	}
	fmt.Println("health check ports:", svcMap.HealthCheckNodePorts())
	fmt.Println("local ready endpoints:", epMap.LocalReadyEndpoints())
	// Output:
	// default/web:http 10.96.0.10:80/TCP
	//   cluster: [10.0.0.7:8080 10.0.1.5:8080]
	//   local:   [10.0.0.7:8080]
	//   any:     true
	// health check ports: map[]
	// local ready endpoints: map[default/web:1]
}

func names(eps []changetracker.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		out = append(out, ep.String())
	}
	slices.Sort(out)
	return out
}

// CategorizeEndpoints on hand-made endpoints, as in a proxier's unit test.
func ExampleCategorizeEndpoints() {
	port, err := changetracker.NewBaseServicePort(klog.Background(), &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"},
		Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.20", Ports: []v1.ServicePort{{Port: 5432}}},
	}, &v1.ServicePort{Port: 5432}, v1.IPv4Protocol)
	if err != nil {
		fmt.Println(err)
		return
	}
	ep := func(ip string, ready bool) changetracker.Endpoint {
		return changetracker.NewBaseEndpoint(changetracker.EndpointInfo{
			IP: netip.MustParseAddr(ip), Port: 5432, Ready: ready, Serving: true, Terminating: !ready,
		})
	}
	// No endpoint is ready: traffic goes to the serving, terminating ones.
	cluster, _, _, _ := changetracker.CategorizeEndpoints([]changetracker.Endpoint{ep("10.0.0.1", false), ep("10.0.0.2", false)}, port, "node-a", nil)
	fmt.Println(names(cluster))
	// Output:
	// [10.0.0.1:5432 10.0.0.2:5432]
}
