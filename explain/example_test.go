package explain_test

import (
	"fmt"
	"net/netip"
	"os"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/explain"
)

// Trace a pod's DNS query through the rules of a dry run (proxier
// --dry-run --mode nftables); ReadKernel reads a live node's instead.
func ExampleRuleset_Trace() {
	out, err := os.ReadFile("testdata/demo.nftables.dry-run")
	if err != nil {
		panic(err)
	}
	rulesets, err := explain.ParseDryRun(out, "", false)
	if err != nil {
		panic(err)
	}
	node := explain.Node{
		Addrs:   []netip.Addr{netip.MustParseAddr("192.168.10.11")},
		PodAddr: []netip.Addr{netip.MustParseAddr("10.244.1.5")},
	}
	for _, dest := range []string{"10.96.0.53:53", "10.96.0.50:80"} {
		p := explain.Packet{From: explain.FromPod(), Dest: netip.MustParseAddrPort(dest), Protocol: v1.ProtocolTCP}
		ex, err := rulesets[v1.IPv4Protocol].Trace(p, node)
		if err != nil {
			panic(err)
		}
		fmt.Println(ex.Packet)
		for _, o := range ex.Outcomes {
			fmt.Println(" ", o.Summary())
		}
	}
	// Output:
	// tcp 10.244.1.5 (pod) -> 10.96.0.53:53
	//   p=0.5 ACCEPT, DNAT to 10.244.1.53:53, no masquerade
	//   p=0.5 ACCEPT, DNAT to 10.244.2.53:53, no masquerade
	// tcp 10.244.1.5 (pod) -> 10.96.0.50:80
	//   p=1 REJECT
}
