package nftables_test

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// Example syncs one Service into a Fake table, then sends a packet to its
// cluster IP with the tracer. With a real node, nft would be
// knftables.New(knftables.IPv4Family, nftables.DefaultTableName).
func Example() {
	quiet := changetracker.WithLogger(klog.Background().V(10))
	svcs := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil, quiet)
	eps := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil, quiet)
	svcs.Update(nil, makeService("demo", "web", "10.96.0.10"))
	eps.EndpointSliceUpdate(makeSlice(v1.IPv4Protocol, "demo", "web", tcp8080, ep{IP: "10.0.1.5", Node: "node-a"}), false)
	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}

	nft := knftables.NewFake(knftables.IPv4Family, nftables.DefaultTableName)
	w, err := nftables.NewWriter(nft, nftables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	res := w.Sync(ctx, &proxy.FamilyInput{
		Services: svcMap, Endpoints: epMap,
		ServiceChanges: svcMap.Update(svcs), EndpointChanges: epMap.Update(eps),
	})
	w.Applied(nft.Run(ctx, res.Transaction))
	fmt.Println("full:", res.Full, "service ports:", res.ServicePorts)

	tr := nftablestest.NewTracer(nft, knftables.IPv4Family, nftables.DefaultTableName)
	outs, err := tr.Trace(nftablestest.Packet{Src: addr("10.0.2.7"), Dst: addr("10.96.0.10"), Protocol: v1.ProtocolTCP, DstPort: 80})
	if err != nil {
		panic(err)
	}
	for _, o := range outs {
		fmt.Println(o.Verdict, o.DNAT)
	}
	// Output:
	// full: true service ports: 1
	// accept 10.0.1.5:8080
}
