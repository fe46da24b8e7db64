package iptables_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterRefusesClusterIPOutsideServiceCIDRs syncs one writer with a
// service inside 10.96.0.0/16 and one outside it through changes of
// SyncInput.ServiceCIDRs alone: while the ranges are known and do not
// hold the outside service's cluster IP, its port gets no rules, with a
// log naming it; once they do (or are unknown again) it gets them, and
// the other way round, without any service change: every change of
// ranges is a full sync that judges each port again.
func TestWriterRefusesClusterIPOutsideServiceCIDRs(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, "node-a")
	c.setService(makeService("ns", "inside", writertest.ServiceCIDRInside))
	c.setEndpoints("ns", "inside", tcp8080, ep{IP: "10.1.0.1", Node: "node-a"})
	c.setService(makeService("ns", "outside", writertest.ServiceCIDROutside))
	c.setEndpoints("ns", "outside", tcp8080, ep{IP: "10.1.0.2", Node: "node-a"})
	inside, outside := svcPortName("ns", "inside", "p"), svcPortName("ns", "outside", "p")
	w := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("10.1.0.0/16")}}})
	f := iptablestest.NewFake()
	for i, step := range writertest.ServiceCIDRSteps() {
		in := c.input()
		in.ServiceCIDRs = step.CIDRs
		logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
		res := w.Sync(klog.NewContext(context.Background(), logger), in)
		err := applyFake(f, w, res)
		w.Applied(err)
		if err != nil {
			t.Fatalf("%s: applying the sync: %v\n%s", step.Name, err, res.Payload)
		}
		if i > 0 && !res.Full {
			t.Errorf("%s: a change of service CIDRs made a partial sync", step.Name)
		}
		if f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(inside)) == nil {
			t.Errorf("%s: the inside port has no rules", step.Name)
		}
		if got := f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(outside)) != nil; got != step.OutsideKept {
			t.Errorf("%s: the outside port has rules: %v, want %v", step.Name, got, step.OutsideKept)
		}
		var wantLogs []string
		if !step.OutsideKept {
			wantLogs = []string{outside.String()}
		}
		if diff := cmp.Diff(wantLogs, writertest.SkippedPorts(logger)); diff != "" {
			t.Errorf("%s: ports logged as skipped (-want +got):\n%s", step.Name, diff)
		}
	}
}
