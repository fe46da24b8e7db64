package ipset_test

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
)

func ExampleParseEntry() {
	e, err := ipset.ParseEntry(ipset.HashIPPortNet, "10.96.0.10,udp:53,10.244.1.7/16")
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Addr, e.Protocol, e.Port, e.Net)
	fmt.Println(e)

	_, err = ipset.ParseEntry(ipset.HashIPPort, "10.96.0.10,icmp:0")
	fmt.Println(err)
	// Output:
	// 10.96.0.10 UDP 53 10.244.0.0/16
	// 10.96.0.10,udp:53,10.244.0.0/16
	// ipset entry "10.96.0.10,icmp:0" for hash:ip,port: invalid: unknown protocol "icmp"
}

func ExampleReconciler() {
	ctx := context.Background()
	sets := ipsettest.NewFake() // ipset.New() on a real node
	_ = sets.Restore(`
create KUBE-CLUSTER-IP hash:ip,port
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.99,tcp:80
create KUBE-STALE hash:ip
`)
	r := ipset.NewReconciler(sets, "KUBE-")
	res, err := r.Reconcile(ctx, []ipset.Desired{{
		Set: ipset.Set{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort},
		Entries: []ipset.Entry{
			ipset.IPPortEntry(netip.MustParseAddr("10.96.0.1"), v1.ProtocolTCP, 443),
			ipset.IPPortEntry(netip.MustParseAddr("10.96.0.10"), v1.ProtocolUDP, 53),
		},
	}, {
		Set:     ipset.Set{Name: "KUBE-NODE-PORT-TCP", Type: ipset.BitmapPort},
		Entries: []ipset.Entry{ipset.PortEntry(30080)},
	}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", res)
	fmt.Print(sets.Dump())
	// Output:
	// {Created:1 Swapped:0 Recreated:0 Destroyed:1 Added:2 Deleted:1 InUse:[] Writes:5}
	// create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
	// add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
	// add KUBE-CLUSTER-IP 10.96.0.10,udp:53
	// create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
	// add KUBE-NODE-PORT-TCP 30080
}

func ExampleNew() {
	ctx := context.Background()
	sets, err := ipset.New(ipset.WithNetNSPath("/run/netns/test"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sets.Close()
	set := ipset.Set{Name: "ALLOWED", Type: ipset.HashNet, Family: ipset.FamilyIPv6}
	if err := sets.Create(ctx, set); err != nil && !ipset.IsAlreadyExists(err) {
		fmt.Println(err)
		return
	}
	err = sets.Add(ctx, set.Name, ipset.NetEntry(netip.MustParsePrefix("2001:db8::/32")))
	fmt.Println(err)
}
