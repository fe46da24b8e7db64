// Package clustertest makes clusters of Kubernetes objects for the tests
// and benchmarks of the proxier package and the example proxier.
package clustertest

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// Cluster returns a cluster of services Services in namespace
// "bench", each with one TCP port and one EndpointSlice of endpoints
// endpoints, the first on node-a (this node), the others on node-b.
// Service i has cluster IP 10.96.0.0+i+1 and endpoints 10.128.0.0+10i+j.
// The objects carry their kind, so that they can be written as manifests.
func Cluster(services, endpoints int) []runtime.Object {
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
