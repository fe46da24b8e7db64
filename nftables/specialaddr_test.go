package nftables_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables/nftablestest"
)

// TestWriterRefusesSpecialAddresses hands the writer, past the tracker, a
// caller's own service port whose cluster IP is the node's address or one
// no API server hands out, or whose external or load-balancer IP is a
// special address. That port alone is not programmed, with a log naming
// it; the good port is. An external IP equal to the node's address is
// legal and programmed.
func TestWriterRefusesSpecialAddresses(t *testing.T) {
	nodeIP := addr(baseNodeIP)
	for _, tc := range writertest.SpecialAddressCases(nodeIP) {
		t.Run(tc.Name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			// An external IP makes the ports externally accessible, as a
			// caller's port with external IPs would say it is.
			c.setService(makeService("ns", "good", "10.96.0.1", withExternalIPs("192.0.2.11")))
			c.setEndpoints("ns", "good", tcp8080, local("10.0.1.1"))
			c.NodeIPs = []netip.Addr{nodeIP}
			in := c.input()
			good := svcPortName("ns", "good", "p")
			bad := svcPortName("bad", "bad", "p")
			sp := &skewedPort{ServicePort: c.ServiceMap[good], externalIPs: tc.ExternalIPs, vips: tc.VIPs}
			if tc.ClusterIP.IsValid() {
				sp.clusterIP = &tc.ClusterIP
			}
			in.Services[bad] = sp
			in.Endpoints[bad] = in.Endpoints[good]

			fake, w := newFake(t, baseConfig())
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			res := w.Sync(klog.NewContext(context.Background(), logger), in)
			err := nftablestest.CheckTransaction(fake, res.Transaction)
			if err == nil {
				err = fake.Run(context.Background(), res.Transaction)
			}
			w.Applied(err)
			if err != nil {
				t.Fatalf("running the sync: %v\n%s", err, res.Transaction)
			}
			want := 1
			if tc.Kept {
				want = 2
			}
			if res.ServicePorts != want {
				t.Errorf("%d service ports programmed, want %d", res.ServicePorts, want)
			}
			d := fake.Dump()
			if tc.Kept && !strings.Contains(d, nodeIP.String()+" . tcp . 80") {
				t.Errorf("the node's address as external IP is not programmed:\n%s", d)
			}
			if ip := tc.ClusterIP; ip.IsValid() && strings.Contains(d, ip.String()+" . tcp . 80") {
				t.Errorf("the refused cluster IP %s reached the table:\n%s", ip, d)
			}
			if !strings.Contains(d, "10.96.0.1 . tcp . 80") {
				t.Errorf("the good port is not programmed:\n%s", d)
			}
			var wantLogs []string
			if !tc.Kept {
				wantLogs = []string{bad.String()}
			}
			if diff := cmp.Diff(wantLogs, writertest.SkippedPorts(logger)); diff != "" {
				t.Errorf("ports logged as skipped (-want +got):\n%s", diff)
			}
		})
	}
}
