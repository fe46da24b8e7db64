package ipvsmode_test

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

func ExampleWriter() {
	ctx := context.Background()

	// A proxier's maps for one family, as changetracker fills them: one
	// NodePort Service with one endpoint.
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080}},
		},
	}
	port, err := changetracker.NewBaseServicePort(klog.Background(), svc, &svc.Spec.Ports[0], v1.IPv4Protocol)
	if err != nil {
		panic(err)
	}
	name := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	pod := changetracker.NewBaseEndpoint(changetracker.EndpointInfo{IP: netip.MustParseAddr("10.244.1.5"), Port: 8080, Ready: true, Serving: true})

	w, err := ipvsmode.NewWriter(ipvsmode.WriterConfig{
		Family: v1.IPv4Protocol,
		Node: proxy.NodeConfig{
			Name:         "node-a",
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		},
	})
	if err != nil {
		panic(err)
	}
	out := w.Sync(ctx, &proxy.FamilyInput{
		Services:  changetracker.ServicePortMap{name: port},
		Endpoints: changetracker.EndpointsMap{name: {pod}},
		NodeIPs:   []netip.Addr{netip.MustParseAddr("192.168.0.10")}, // ipvs.DummyBinder.HostAddresses on a node
	})

	// On a node: ipvs.New, ipvs.NewDummyBinder, ipset.New and iptables.New
	// (one per family, all given to one Applier).
	lb, addrs, sets := ipvstest.NewFake(), ipvstest.NewBinder(), ipsettest.NewFake()
	ipt := iptablestest.NewFake(iptablestest.WithIPSetFake(sets))
	a := ipvsmode.NewApplier(ipvs.NewReconciler(lb, addrs), ipset.NewReconciler(sets, ipvsmode.SetPrefix), ipt)
	if _, err := a.Apply(ctx, out); err != nil {
		panic(err)
	}
	fmt.Print(lb.Dump())
	bound, _ := addrs.Addresses(ctx, ipvs.DummyDevice)
	fmt.Println(ipvs.DummyDevice, bound)
	members, _ := sets.ListEntries(ctx, "KUBE-NODE-PORT-TCP")
	fmt.Println("KUBE-NODE-PORT-TCP", members)
	for _, rule := range ipt.Rules(iptables.TableNAT, iptables.KubeServicesChain) {
		fmt.Println(rule)
	}
	// Output:
	// TCP 10.96.0.10:80 rr
	//   -> 10.244.1.5:8080 weight 1
	// TCP 192.168.0.10:30080 rr
	//   -> 10.244.1.5:8080 weight 1
	// kube-ipvs0 [10.96.0.10]
	// KUBE-NODE-PORT-TCP [30080]
	// -s 127.0.0.0/8 -j RETURN
	// ! -s 10.244.0.0/16 -m comment --comment "cluster IP traffic to masquerade" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
	// -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
	// -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
}
