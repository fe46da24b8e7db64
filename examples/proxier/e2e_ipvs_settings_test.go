package main

// kube-proxy's IPVS flags (--ipvs-strict-arp, --ipvs-exclude-cidrs and the
// timeouts) end to end, in the VM tier only, as e2e_ipvs_test.go.

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/kernel"
)

// TestVMIPVSSettings runs the proxier once in IPVS mode with kube-proxy's
// IPVS flags: strict ARP and the timeouts are set in the node's namespace,
// the sync deletes another program's virtual server outside the excluded
// CIDR and leaves the one inside, and so does --cleanup.
func TestVMIPVSSettings(t *testing.T) {
	kerneltest.RequireVM(t, e2eTools(iptables.BackendLegacy)...)
	ctx := context.Background()
	k := newE2ENode(t, iptables.BackendLegacy, e2eScenario(), false)
	lb, err := ipvs.New(ctx, ipvs.WithNetNSPath("/run/netns/"+k.node.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close)
	for _, a := range []string{"10.200.0.5", "10.201.0.5"} {
		if err := lb.AddVirtualServer(ctx, ipvs.VirtualServer{Address: netip.MustParseAddr(a), Protocol: v1.ProtocolTCP, Port: 80}); err != nil {
			t.Fatal(err)
		}
	}
	has := func(list []ipvs.VirtualServer, a string) bool {
		return slices.ContainsFunc(list, func(vs ipvs.VirtualServer) bool { return vs.Address == netip.MustParseAddr(a) })
	}

	exclude := []string{"--ipvs-exclude-cidrs", "10.200.0.0/16"}
	if err := k.runProxier(append([]string{"--once", "--mode", "ipvs", "--manifests", k.dir, "--hostname-override", "node-a",
		"--cluster-cidr", e2eClusterCIDR, "--ipvs-strict-arp", "--ipvs-tcp-timeout", "1h", "--ipvs-tcpfin-timeout", "30s",
		"--ipvs-udp-timeout", "10s"}, exclude...)...); err != nil {
		t.Fatalf("--once: %v\n%s", err, k.log.String())
	}
	var arp [2]int
	if err := k.node.Do(func() (err error) {
		kn := &kernel.Kernel{}
		if arp[0], err = kn.ReadSysctlInt(kernel.SysctlARPIgnore); err != nil {
			return err
		}
		arp[1], err = kn.ReadSysctlInt(kernel.SysctlARPAnnounce)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if arp != [2]int{1, 2} {
		t.Errorf("in the node: arp_ignore and arp_announce %v, want [1 2]", arp)
	}
	got, err := lb.Timeouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (ipvs.Timeouts{TCP: time.Hour, TCPFin: 30 * time.Second, UDP: 10 * time.Second}); got != want {
		t.Errorf("IPVS timeouts %s, want %s", got, want)
	}
	list, err := lb.ListVirtualServers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]bool{"10.200.0.5": true, "10.201.0.5": false, "10.96.0.10": true},
		map[string]bool{"10.200.0.5": has(list, "10.200.0.5"), "10.201.0.5": has(list, "10.201.0.5"), "10.96.0.10": has(list, "10.96.0.10")}); diff != "" {
		t.Errorf("virtual servers after the sync, by address (-want +got):\n%s", diff)
	}

	if err := k.runProxier(append([]string{"--cleanup"}, exclude...)...); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, k.log.String())
	}
	if list, err = lb.ListVirtualServers(ctx); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !has(list, "10.200.0.5") {
		t.Errorf("virtual servers after --cleanup: %v, want the excluded one alone", list)
	}
}
