package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/internal/testkit/apiservertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// TestAPIServerServiceCIDRs runs nftables mode against a real API server,
// as kube-proxy's user: the server's own ServiceCIDR (from
// --service-cluster-ip-range) reaches the cluster-ips-check chain, and so
// does one created through the API, with no complaint that the user may
// not list them; a cluster IP on a port its Service lacks is refused.
func TestAPIServerServiceCIDRs(t *testing.T) {
	kerneltest.Require(t, "nft")
	k := newAPINode(t, 1, apiservertest.Config{}, false)
	k.createService(t, apiService("web", "10.96.0.10"))
	k.putSlice(t, apiSlice("web", "pod-a"))
	k.mode = modeNFTables
	k.startProxier(t, "--mode", modeNFTables)
	k.eventually(apiChange, "web", func() error { return k.reach("tcp", "10.96.0.10", 80, 5, "pod-a") })
	chain := func(want string) func() error {
		return func() error {
			if got := k.nft(t, "list", "chain", "ip", "kube-proxy", "cluster-ips-check"); !strings.Contains(got, want) {
				return fmt.Errorf("cluster-ips-check lacks %q:\n%s", want, got)
			}
			return nil
		}
	}
	// nft lists a set of one as a plain match.
	k.eventually(apiChange, "the API server's ServiceCIDR", chain("ip daddr "+apiservertest.ServiceCIDR.String()+" drop"))
	check(t, k.refused("tcp", e2eClientIP, "10.96.0.10", 81))

	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.98.0.0/24"}}}
	if _, err := k.kube.NetworkingV1().ServiceCIDRs().Create(k.ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ServiceCIDR extra: %v", err)
	}
	start := time.Now()
	k.converge(t, apiChange, "a ServiceCIDR created", start, chain("ip daddr { "+apiservertest.ServiceCIDR.String()+", 10.98.0.0/24 } drop"))
	if log := k.log.String(); strings.Contains(log, "Cannot list ServiceCIDRs") {
		t.Errorf("kube-proxy's user could not list ServiceCIDRs:\n%s", grepLines(log, "ServiceCIDR"))
	}
}
