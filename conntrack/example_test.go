package conntrack_test

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/conntrack/conntracktest"
)

func ExampleCleaner_CleanStaleEntries() {
	ctx := context.Background()
	// A UDP DNS service whose endpoint 10.0.1.2 has just gone away; the
	// proxier has already synced its rules to send new flows to 10.0.2.2.
	service := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dns"},
		Spec: v1.ServiceSpec{
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}},
		},
	}
	name := changetracker.ServicePortName{
		NamespacedName: types.NamespacedName{Namespace: "kube-system", Name: "dns"},
		Port:           "dns", Protocol: v1.ProtocolUDP,
	}
	port, err := changetracker.NewBaseServicePort(klog.Background(), service, &service.Spec.Ports[0], v1.IPv4Protocol)
	if err != nil {
		panic(err)
	}
	svcPortMap := changetracker.ServicePortMap{name: port}
	endpointsMap := changetracker.EndpointsMap{name: {changetracker.NewBaseEndpoint(changetracker.EndpointInfo{
		IP: netip.MustParseAddr("10.0.2.2"), Port: 53, Ready: true, Serving: true,
	})}}

	// On a node: ct := conntrack.New(). Here, a fake table with two flows.
	ct := conntracktest.NewFake()
	ap := netip.MustParseAddrPort
	_ = ct.AddFlows(
		conntracktest.NewFlow(conntrack.ProtocolUDP, ap("10.0.0.5:40001"), ap("10.96.0.10:53"), ap("10.0.1.2:53")),
		conntracktest.NewFlow(conntrack.ProtocolUDP, ap("10.0.0.5:40002"), ap("10.96.0.10:53"), ap("10.0.2.2:53")),
	)

	n, err := conntrack.NewCleaner(ct).CleanStaleEntries(ctx, v1.IPv4Protocol, svcPortMap, endpointsMap, nil)
	fmt.Println("deleted:", n, err)
	fmt.Print(ct.Dump())
	// Output:
	// deleted: 1 <nil>
	// udp src=10.0.0.5 dst=10.96.0.10 sport=40002 dport=53 src=10.0.2.2 dst=10.0.0.5 sport=53 dport=40002
}
