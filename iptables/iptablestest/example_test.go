package iptablestest_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// A restore is parsed like iptables-restore does and stored in
// iptables-save's canonical form.
func ExampleFake_Dump() {
	ipt := iptablestest.NewFake()
	err := ipt.RestoreAll(context.Background(), []byte(`*nat
:KUBE-SERVICES - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080
COMMIT
`), iptables.NoFlushTables, iptables.NoRestoreCounters)
	if err != nil {
		panic(err)
	}
	fmt.Print(ipt.Dump())
	// Output:
	// *nat
	// :PREROUTING ACCEPT [0:0]
	// :INPUT ACCEPT [0:0]
	// :OUTPUT ACCEPT [0:0]
	// :POSTROUTING ACCEPT [0:0]
	// :KUBE-SERVICES - [0:0]
	// -A PREROUTING -j KUBE-SERVICES
	// -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080
	// COMMIT
}

// A restore that the kernel would refuse fails with the line blamed, and
// nothing of the failing table is applied.
func ExampleFake_RestoreAll_error() {
	ipt := iptablestest.NewFake()
	err := ipt.RestoreAll(context.Background(), []byte(`*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -j KUBE-SVC-MISSING
COMMIT
`), iptables.NoFlushTables, iptables.NoRestoreCounters)
	var e *iptables.Error
	if errors.As(err, &e) {
		fmt.Println(e.Line, e.Stderr)
	}
	fmt.Printf("%q\n", ipt.Dump())
	// Output:
	// 3 iptables-restore: line 3 failed: Couldn't load target `KUBE-SVC-MISSING':No such file or directory
	// ""
}

// Trace shows where a packet goes: here a ClusterIP service with two
// endpoints, chosen at random.
func ExampleFake_Trace() {
	ipt := iptablestest.NewFake()
	err := ipt.RestoreAll(context.Background(), []byte(`*nat
:KUBE-SVC-A - [0:0]
-A PREROUTING -d 10.96.0.10 -p tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A -m statistic --mode random --probability 0.5 -p tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SVC-A -p tcp -j DNAT --to-destination 10.244.2.7:8080
COMMIT
`), iptables.NoFlushTables, iptables.NoRestoreCounters)
	if err != nil {
		panic(err)
	}
	outcomes, err := ipt.Trace(iptablestest.Packet{
		Protocol:        "tcp",
		Source:          netip.MustParseAddr("10.244.3.3"),
		Destination:     netip.MustParseAddr("10.96.0.10"),
		DestinationPort: 80,
	})
	if err != nil {
		panic(err)
	}
	for _, o := range outcomes {
		fmt.Println(o)
	}
	// Output:
	// ACCEPT to 10.244.1.5:8080 (DNAT) p=0.5
	// ACCEPT to 10.244.2.7:8080 (DNAT) p=0.5
}
