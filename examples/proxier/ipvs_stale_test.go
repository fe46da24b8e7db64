package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
)

// TestIPVSModeRemovesStaleStateAtStart starts IPVS mode on a node that
// holds a virtual server and an ipset left by an earlier run, for a
// Service deleted meanwhile: the first sync deletes
// both, since the reconcilers compare with what the kernel lists rather
// than with what they remember, and keeps another program's set.
func TestIPVSModeRemovesStaleStateAtStart(t *testing.T) {
	ctx := context.Background()
	node := newFakeNode(t).withIPVS(t)
	stale := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.99"), Protocol: v1.ProtocolTCP, Port: 80}
	if err := node.lb.AddVirtualServer(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if err := node.lb.AddRealServer(ctx, stale, ipvs.RealServer{Address: netip.MustParseAddr("10.244.9.9"), Port: 8080, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ipvsmode.SetPrefix + "STALE-TEST", "OTHER-PROGRAM"} {
		if err := node.sets.Create(ctx, ipset.Set{Name: name, Type: ipset.HashIP}); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(node.lb.Dump(), "10.96.0.99:80") {
		t.Fatalf("the stale virtual server is not in the fake:\n%s", node.lb.Dump())
	}

	startOnFakes(t, node, "--mode", "ipvs")
	eventually(t, 10*time.Second, "first sync", func() error {
		servers, sets := node.lb.Dump(), node.sets.Dump()
		switch {
		case !strings.Contains(servers, "10.96.0.10:80"):
			return fmt.Errorf("no virtual server of the demo cluster yet:\n%s", servers)
		case strings.Contains(servers, "10.96.0.99:80"):
			return fmt.Errorf("the stale virtual server is still there:\n%s", servers)
		case strings.Contains(sets, ipvsmode.SetPrefix+"STALE-TEST"):
			return fmt.Errorf("the stale set is still there:\n%s", sets)
		}
		return nil
	})
	if sets := node.sets.Dump(); !strings.Contains(sets, "OTHER-PROGRAM") {
		t.Errorf("another program's set was destroyed:\n%s", sets)
	}
}
