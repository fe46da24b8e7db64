package ipvs_test

import (
	"context"
	"fmt"

	"github.com/proxykit/proxykit/ipvs"
)

func ExampleNew() {
	ctx := context.Background()
	lb, err := ipvs.New(ctx, ipvs.WithSchedulers("rr", "sh"))
	if err != nil {
		// On a kernel without IPVS: "ipvs: IPVS is not supported: kernel
		// 6.1.0 cannot run IPVS mode: missing IPVS modules ip_vs, ..."
		fmt.Println(err)
		return
	}
	defer lb.Close()
	list, err := lb.ListVirtualServers(ctx)
	fmt.Println(len(list), err)
}
