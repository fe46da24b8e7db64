package ipset_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipset"
)

func TestKernelReconcile(t *testing.T) {
	for _, tc := range reconcileCases {
		t.Run(tc.name, func(t *testing.T) {
			n, _, ref := kernelIPSet(t)
			runReconcileCase(t, n, ref, tc)
		})
	}
}

func TestKernelReconcileConvergesMinimally(t *testing.T) {
	for seed := range uint64(25) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			n, _, ref := kernelIPSet(t)
			runRandomCase(t, n, ref, seed)
		})
	}
}

// TestKernelMatchSet checks that members of a set, and only they, get
// through an iptables rule that matches on the set, and that changes made
// by the reconciler, a swap included, take effect at once.
func TestKernelMatchSet(t *testing.T) {
	n, server, _ := kernelIPSet(t)
	ctx := context.Background()
	client := kerneltest.NewNS(t)
	v := kerneltest.Link(t, client, server, netip.MustParsePrefix("10.5.0.1/24"), netip.MustParsePrefix("10.5.0.2/24"))
	client.AddAddr(t, v.A, netip.MustParsePrefix("10.5.0.3/24"))
	kerneltest.StartBackend(t, server, "server", 8080)
	allowed, other := netip.MustParseAddr("10.5.0.1"), netip.MustParseAddr("10.5.0.3")
	dst := netip.MustParseAddrPort("10.5.0.2:8080")

	r := ipset.NewReconciler(n, "PK-")
	sync := func(hashSize uint32, members ...netip.Addr) {
		t.Helper()
		d := ipset.Desired{Set: ipset.Set{Name: "PK-ALLOW", Type: ipset.HashIPPort, HashSize: hashSize}}
		for _, m := range members {
			d.Entries = append(d.Entries, ipset.IPPortEntry(m, tcp, 8080))
		}
		if _, err := r.Reconcile(ctx, []ipset.Desired{d}); err != nil {
			t.Fatal(err)
		}
	}
	sync(0, allowed)
	server.MustExec(t, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "8080",
		"-m", "set", "--match-set", "PK-ALLOW", "src,dst", "-j", "ACCEPT")
	server.MustExec(t, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "8080",
		"-j", "REJECT", "--reject-with", "tcp-reset")

	check := func(step string, src netip.Addr, pass bool) {
		t.Helper()
		_, err := kerneltest.DialFrom(client, "tcp", src, dst, 5*time.Second)
		switch {
		case pass && err != nil:
			t.Errorf("%s: from %s: %v, want through", step, src, err)
		case !pass && !errors.Is(err, syscall.ECONNREFUSED):
			t.Errorf("%s: from %s: got %v, want refused", step, src, err)
		}
	}
	check("member", allowed, true)
	check("non-member", other, false)
	sync(0, allowed, other)
	check("added", other, true)
	sync(0, other)
	check("deleted", allowed, false)
	// A larger hash size is swapped in under the rule's reference.
	sync(8192, allowed)
	check("after swap", allowed, true)
	check("after swap", other, false)
	sets, err := n.ListSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != 1 || sets[0].HashSize != 8192 || sets[0].References != 1 {
		t.Errorf("after the swap the namespace has %+v, want PK-ALLOW alone, hash size 8192, one reference", sets)
	}
}
