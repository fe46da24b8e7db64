package ipvs_test

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
)

func ExampleReconciler() {
	ctx := context.Background()
	lb, addrs := ipvstest.NewFake(), ipvstest.NewBinder() // ipvs.New and ipvs.NewDummyBinder on a node
	r := ipvs.NewReconciler(lb, addrs)

	svc := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: v1.ProtocolUDP, Port: 53}
	pods := []ipvs.RealServer{
		{Address: netip.MustParseAddr("10.244.1.5"), Port: 53, Weight: 1},
		{Address: netip.MustParseAddr("10.244.2.7"), Port: 53, Weight: 1},
	}
	res, err := r.Reconcile(ctx, []ipvs.Service{{VirtualServer: svc, RealServers: pods, Bind: true}})
	if err != nil {
		panic(err)
	}
	fmt.Println("first sync:", res.Writes, "writes")
	fmt.Print(lb.Dump())

	res, _ = r.Reconcile(ctx, []ipvs.Service{{VirtualServer: svc, RealServers: pods, Bind: true}})
	fmt.Println("resync:", res.Writes, "writes")

	// One pod goes away: a UDP real server is deleted at once.
	res, _ = r.Reconcile(ctx, []ipvs.Service{{VirtualServer: svc, RealServers: pods[:1], Bind: true}})
	fmt.Println("scale down:", res.RealServersDeleted, "deleted")
	bound, _ := addrs.Addresses(ctx, ipvs.DummyDevice)
	fmt.Println(ipvs.DummyDevice, bound)
	// Output:
	// first sync: 5 writes
	// UDP 10.96.0.10:53 rr
	//   -> 10.244.1.5:53 weight 1
	//   -> 10.244.2.7:53 weight 1
	// resync: 0 writes
	// scale down: 1 deleted
	// kube-ipvs0 [10.96.0.10]
}

func ExampleGracefulTerminator() {
	ctx := context.Background()
	lb := ipvstest.NewFake()
	web := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.1"), Protocol: v1.ProtocolTCP, Port: 80}
	pod := ipvs.RealServer{Address: netip.MustParseAddr("10.244.1.5"), Port: 8080, Weight: 1}
	_ = lb.AddVirtualServer(ctx, web)
	_ = lb.AddRealServer(ctx, web, pod)
	_ = lb.SetConnections(web, pod, 3, 0) // three open connections

	g := ipvs.NewGracefulTerminator(lb)
	listed, _ := lb.ListRealServers(ctx, web)
	how, _ := g.Terminate(ctx, web, listed[0])
	fmt.Println(how)
	fmt.Print(lb.Dump())

	n, _ := g.Sweep(ctx) // still connected: kept
	fmt.Println("deleted", n)
	_ = lb.SetConnections(web, pod, 0, 0)
	n, _ = g.Sweep(ctx)
	fmt.Println("deleted", n)
	fmt.Print(lb.Dump())
	// Output:
	// draining
	// TCP 10.96.0.1:80 rr
	//   -> 10.244.1.5:8080 weight 0 active 3 inactive 0
	// deleted 0
	// deleted 1
	// TCP 10.96.0.1:80 rr
}

func ExampleNew() {
	ctx := context.Background()
	lb, err := ipvs.New(ctx, ipvs.WithSchedulers("rr", "sh"))
	if err != nil {
		// On a kernel without IPVS: "ipvs: not supported: kernel
		// 6.1.0 cannot run IPVS mode: missing IPVS modules ip_vs, ..."
		fmt.Println(err)
		return
	}
	defer lb.Close()
	list, err := lb.ListVirtualServers(ctx)
	fmt.Println(len(list), err)
}
