package nftables_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// TestWriterRefusesClusterIPOutsideServiceCIDRs syncs one writer with a
// service inside 10.96.0.0/16 and one outside it through changes of
// SyncInput.ServiceCIDRs alone: while the ranges are known and do not
// hold the outside service's cluster IP, its port is not programmed,
// with a log naming it; once they do (or are unknown again) it is, and
// the other way round, without any service change: every change of
// ranges is a full sync that judges each port again.
func TestWriterRefusesClusterIPOutsideServiceCIDRs(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "inside", writertest.ServiceCIDRInside))
	c.setEndpoints("ns", "inside", tcp8080, local("10.0.1.1"))
	c.setService(makeService("ns", "outside", writertest.ServiceCIDROutside))
	c.setEndpoints("ns", "outside", tcp8080, local("10.0.1.2"))
	outside := svcPortName("ns", "outside", "p")
	fake, w := newFake(t, baseConfig())
	for i, step := range writertest.ServiceCIDRSteps() {
		in := c.input()
		in.ServiceCIDRs = step.CIDRs
		logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
		res := syncFakeCtx(t, klog.NewContext(context.Background(), logger), w, fake, in)
		if i > 0 && !res.Full {
			t.Errorf("%s: a change of service CIDRs made a partial sync", step.Name)
		}
		d := fake.Dump()
		if !strings.Contains(d, writertest.ServiceCIDRInside+" . tcp . 80") {
			t.Errorf("%s: the inside port is not programmed:\n%s", step.Name, d)
		}
		if got := strings.Contains(d, writertest.ServiceCIDROutside+" . tcp . 80"); got != step.OutsideKept {
			t.Errorf("%s: the outside port programmed: %v, want %v", step.Name, got, step.OutsideKept)
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
