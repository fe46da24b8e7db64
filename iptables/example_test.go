package iptables_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	v1 "k8s.io/api/core/v1"
)

// A LineBuffer builds restore input from words; Words and EndLine write a
// rule from parts without joining slices.
func ExampleLineBuffer() {
	b := iptables.NewLineBuffer()
	b.Write("*nat")
	b.Write(":KUBE-SVC-A", "-", "[0:0]")
	args := []string{"-m", "statistic", "--mode", "random", "--probability", "0.50000000000"}
	b.Words("-A", "KUBE-SVC-A").Words(args...).Words("-j", "KUBE-SEP-1").EndLine()
	b.Write("-A", "KUBE-SVC-A", "-j", "KUBE-SEP-2")
	b.Write("COMMIT")
	fmt.Print(b.String())
	fmt.Println(b.Lines(), "lines")
	// Output:
	// *nat
	// :KUBE-SVC-A - [0:0]
	// -A KUBE-SVC-A -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-1
	// -A KUBE-SVC-A -j KUBE-SEP-2
	// COMMIT
	// 5 lines
}

// A discarding LineBuffer counts the lines of chains a partial sync leaves
// alone, without keeping their bytes.
func ExampleNewDiscardLineBuffer() {
	unchanged := iptables.NewDiscardLineBuffer()
	for i := 0; i < 3; i++ {
		unchanged.Write("-A", "KUBE-SVC-B", "-j", "KUBE-SEP-3")
	}
	fmt.Println(unchanged.Lines(), unchanged.Len())
	// Output: 3 0
}

// Code written against Interface runs unchanged against the Fake of
// package iptables/iptablestest, which is how it is unit-tested.
func ExampleInterface() {
	ctx := context.Background()
	var ipt iptables.Interface = iptablestest.NewFake()

	if _, err := ipt.EnsureChain(ctx, iptables.TableNAT, "KUBE-POSTROUTING"); err != nil {
		panic(err)
	}
	rule := []string{"-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING"}
	for i := 0; i < 2; i++ {
		existed, err := ipt.EnsureRule(ctx, iptables.Prepend, iptables.TableNAT, iptables.ChainPostrouting, rule...)
		if err != nil {
			panic(err)
		}
		fmt.Println("existed:", existed)
	}
	var save bytes.Buffer
	if err := ipt.SaveInto(ctx, iptables.TableNAT, &save); err != nil {
		panic(err)
	}
	fmt.Print(save.String())
	// Output:
	// existed: false
	// existed: true
	// *nat
	// :PREROUTING ACCEPT [0:0]
	// :INPUT ACCEPT [0:0]
	// :OUTPUT ACCEPT [0:0]
	// :POSTROUTING ACCEPT [0:0]
	// :KUBE-POSTROUTING - [0:0]
	// -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
	// COMMIT
}

// Errors are tested with helpers, not by their text.
func ExampleIsNotFound() {
	ipt := iptablestest.NewFake()
	err := ipt.FlushChain(context.Background(), iptables.TableFilter, "KUBE-GONE")
	fmt.Println(iptables.IsNotFound(err), iptables.IsLockTimeout(err))
	fmt.Println(err)
	// Output:
	// true false
	// iptables -t filter -F KUBE-GONE: exit status 1: iptables: No chain/target/match by that name.
}

// ChainsFromSave lists the chains of a table, for example to find stale
// ones after a full sync.
func ExampleChainsFromSave() {
	save := []byte("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-OLD - [0:0]\n-A PREROUTING -j KUBE-SVC-OLD\nCOMMIT\n")
	fmt.Println(iptables.ChainsFromSave(save))
	// Output: [PREROUTING KUBE-SVC-OLD]
}

// New finds the binaries and their features; run it, and the Interface's
// methods, in the network namespace whose rules they should change.
func ExampleNew() {
	ctx := context.Background()
	ipt, err := iptables.New(ctx, v1.IPv4Protocol)
	if err != nil {
		fmt.Println("no iptables here:", err)
		return
	}
	fmt.Println("backend:", ipt.Backend(), "version:", ipt.Version(), "random-fully:", ipt.HasRandomFully())
}
