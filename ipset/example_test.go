package ipset_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/proxykit/proxykit/ipset"
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
