package iptables_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterRefusesSpecialAddresses hands the writer, past the tracker, a
// caller's own service port whose cluster IP is the node's address or one
// no API server hands out, or whose external or load-balancer IP is a
// special address. That port alone gets no rules, with a log naming it;
// the good port is programmed. An external IP equal to the node's address
// is legal and programmed.
func TestWriterRefusesSpecialAddresses(t *testing.T) {
	nodeIP := addr("192.168.0.10")
	for _, tc := range writertest.SpecialAddressCases(nodeIP) {
		t.Run(tc.Name, func(t *testing.T) {
			_, in, bad := badInputCluster(t, func(p *skewedPort, e []changetracker.Endpoint) []changetracker.Endpoint {
				if tc.ClusterIP.IsValid() {
					p.clusterIP = &tc.ClusterIP
				}
				p.externalIPs, p.vips = tc.ExternalIPs, tc.VIPs
				return e
			})
			w := mustWriter(t, iptables.WriterConfig{
				Family: v1.IPv4Protocol,
				Node:   proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("10.1.0.0/16")}},
			})
			in.NodeIPs = []netip.Addr{nodeIP}
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			f := iptablestest.NewFake()
			res := w.Sync(klog.NewContext(context.Background(), logger), in)
			err := applyFake(f, w, res)
			w.Applied(err)
			if err != nil {
				t.Fatalf("applying the sync: %v\n%s", err, res.Payload)
			}
			hasBad := f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(bad)) != nil
			if hasBad != tc.Kept {
				t.Errorf("%s has rules: %v, want %v", bad, hasBad, tc.Kept)
			}
			if f.Rules(iptables.TableNAT, kubeChains.ServiceCluster(svcPortName("ns", "good", "p"))) == nil {
				t.Errorf("the good port has no rules")
			}
			var want []string
			if !tc.Kept {
				want = []string{bad.String()}
			}
			if diff := cmp.Diff(want, writertest.SkippedPorts(logger)); diff != "" {
				t.Errorf("ports logged as skipped (-want +got):\n%s", diff)
			}
		})
	}
}
