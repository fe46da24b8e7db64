package iptables_test

import (
	"context"
	"net/netip"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// TestAppliedFullAllocs bounds the allocations of recording a first full
// payload as applied: the record of the chains it declares (for the drift
// check) is sized once for all of them, not grown, and holds no
// allocation per chain. At 1,000 services of 10 endpoints the payload
// declares about 11,000 chains.
func TestAppliedFullAllocs(t *testing.T) {
	in := benchCluster(benchSize{1000, 10}).input()
	w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}}})
	if err != nil {
		t.Fatal(err)
	}
	if res := w.Sync(context.Background(), in); !res.Full || res.ServicePorts != 1000 || res.Endpoints != 10000 {
		t.Fatalf("first sync: full %v, %d service ports, %d endpoints; want a full sync of 1000 and 10000", res.Full, res.ServicePorts, res.Endpoints)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	w.Applied(nil)
	runtime.ReadMemStats(&after)
	if n := after.Mallocs - before.Mallocs; n > 200 {
		t.Errorf("Applied after the first full sync allocated %d times; want at most 200", n)
	}
}
