package main

// End-to-end tests of IPVS mode: the built proxier (statically, beforehand,
// in the VM tier; see proxierBinary) in a node namespace of the VM's
// kernel, with the same namespaces, cluster and checks as the iptables
// mode's tests in e2e_test.go. They run in the VM tier only
// (hack/vmtest/run.sh ./examples/proxier:^TestVM): the machines of the
// other tiers have no IPVS.

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
)

// TestVMIPVS runs the proxier in IPVS mode through the core scenarios of
// the iptables mode's TestE2E: every kind of service, churn that traffic
// follows, and SIGTERM leaving the rules in place.
func TestVMIPVS(t *testing.T) {
	kerneltest.RequireVM(t, e2eTools(iptables.BackendLegacy)...)
	k := newE2ENode(t, iptables.BackendLegacy, e2eScenario(), false)
	k.start(k.proxierArgs("--mode", "ipvs")...)

	t.Run("services", func(t *testing.T) {
		k.checkServices(t, roundRobinCounts)
		// A port no service has on a service address: the address is the
		// node's (on kube-ipvs0), and refused rather than left to whatever
		// listens on the node (kubernetes#72236).
		check(t, k.refused("tcp", e2eClientIP, "10.96.0.10", 81))
	})

	t.Run("churn", func(t *testing.T) {
		k.churn(t, roundRobinCounts, false)

		// The Local service loses its endpoint on this node: the
		// health-check node port says so, which keeps load balancers
		// away, and the node falls back to the cluster's endpoints
		// (kubernetes#97081).
		k.cluster.service("local").pods = []string{"pod-b"}
		k.writeManifest()
		k.eventually(e2eChange, "health check without local endpoints", func() error {
			return expectGet(k, "http://"+e2eNodeIP+":30185/", 503, `"localEndpoints":0`)
		})
		check(t, k.reaches("tcp", e2eNodeIP, 30085, 2, "pod-b"))

		if got := k.metric(restoreFails); got != 0 {
			t.Errorf("%v restore failures", got)
		}
		if got := k.metric(partialSyncs); got != 0 {
			t.Errorf("%v partial syncs, want none: IPVS mode always syncs in full", got)
		}
	})

	t.Run("SIGTERM", func(t *testing.T) {
		k.terminate(t)
		// Rules, virtual servers and addresses stay.
		check(t, k.reaches("tcp", "10.96.0.10", 80, 6, "pod-a", "pod-b", "pod-c"))
		check(t, k.reaches("tcp", "10.96.0.20", 80, 2, "pod-c"))
	})
}

// TestVMIPVSModeSwitchAndCleanup switches a dual-stack node between the
// modes with --once, each run serving both families and leaving nothing of
// the other mode, and then --cleanup leaves the node as it was: other
// programs' rules and sets kept, no chain, set, virtual server or dummy
// interface of the proxier's.
func TestVMIPVSModeSwitchAndCleanup(t *testing.T) {
	kerneltest.RequireVM(t, append(e2eTools(iptables.BackendLegacy), "ip6tables-legacy", "ip6tables-legacy-save", "ip6tables-legacy-restore")...)
	ctx := context.Background()
	c := e2eDualStackCluster(e2eService{name: "empty", spec: e2eClusterIP("10.96.0.17")})
	k := newE2ENode(t, iptables.BackendLegacy, c, true)
	path := "/run/netns/" + k.node.Name
	sets, err := ipset.New(ipset.WithNetNSPath(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sets.Close)
	lb, err := ipvs.New(ctx, ipvs.WithNetNSPath(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close)
	binder, err := ipvs.NewDummyBinder(ipvs.WithNetNSPath(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(binder.Close)

	// Other programs' state, which must outlive all of it.
	k.iptables(t, v1.IPv4Protocol, "-t", "filter", "-N", "KUBE-FIREWALL")
	k.iptables(t, v1.IPv4Protocol, "-t", "filter", "-A", "KUBE-FIREWALL", "-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-j", "DROP")
	k.iptables(t, v1.IPv4Protocol, "-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL")
	k.iptables(t, v1.IPv6Protocol, "-t", "nat", "-A", "POSTROUTING", "-s", "fd00:244::/64", "!", "-d", "fd00:244::/64", "-j", "MASQUERADE")
	if err := sets.Create(ctx, ipset.Set{Name: "calico-things", Type: ipset.HashIP}); err != nil {
		t.Fatal(err)
	}
	saveAll := func() string {
		var all string
		for _, p := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			for _, table := range []string{"filter", "nat", "mangle"} {
				all += k.iptables(t, p, "-t", table, "-S")
			}
		}
		return all
	}
	setNames := func() []string {
		infos, err := sets.ListSets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, i := range infos {
			names = append(names, i.Name)
		}
		return names
	}
	before := saveAll()

	once := func(mode string) {
		t.Helper()
		// Without localhost node ports, as in TestE2EOnceAndCleanup: their
		// KUBE-FIREWALL is the kubelet's chain too, which --cleanup leaves.
		if err := k.runProxier("--once", "--mode", mode, "--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR+",fd00:244::/64",
			"--iptables-localhost-nodeports=false"); err != nil {
			t.Fatalf("--once --mode %s: %v\n%s", mode, err, k.log.String())
		}
		// IPVS's round robin spreads 4 connections over both pods;
		// iptables mode picks at random, and misses one pod in 20 with a
		// chance of one in half a million.
		n := 4
		if mode == modeIPTables {
			n = 20
		}
		check(t, k.reaches("tcp", "10.96.0.10", 80, n, "pod-a", "pod-b"))
		check(t, k.reaches("tcp", e2eNodeIP, 30080, n, "pod-a", "pod-b"))
		for _, dst := range []string{"[fd00:96::10]:80", "[fd00:1::1]:30080"} {
			got := map[string]int{}
			for range n {
				r, err := kerneltest.Dial(k.client, "tcp", netip.MustParseAddrPort(dst), 2*time.Second)
				if err != nil {
					t.Fatalf("--mode %s: tcp to %s: %v", mode, dst, err)
				}
				got[r.Name]++
			}
			if len(got) != 2 {
				t.Errorf("--mode %s: tcp to %s reached %v, want pod-a and pod-b", mode, dst, got)
			}
		}
		check(t, k.refused("tcp", e2eClientIP, "10.96.0.17", 80))
		for _, p := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			nat := k.iptables(t, p, "-t", "nat", "-S")
			if mode == modeIPVS && strings.Contains(nat, "KUBE-SVC-") {
				t.Errorf("--mode ipvs: iptables mode's chains are left in %s:\n%s", p, nat)
			}
			if mode == modeIPTables && strings.Contains(nat, "KUBE-NODE-PORT ") {
				t.Errorf("--mode iptables: IPVS mode's chains are left in %s:\n%s", p, nat)
			}
		}
	}
	noIPVS := func(after string) {
		t.Helper()
		if list, err := lb.ListVirtualServers(ctx); err != nil || len(list) != 0 {
			t.Errorf("after %s virtual servers are left: %v (%v)", after, list, err)
		}
		if _, err := binder.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
			t.Errorf("after %s %s: %v, want it gone", after, ipvs.DummyDevice, err)
		}
		if diff := cmp.Diff([]string{"calico-things"}, setNames()); diff != "" {
			t.Errorf("ipsets after %s (-want +got):\n%s", after, diff)
		}
	}

	once(modeIPTables)
	once(modeIPVS)
	if n := setNames(); !slices.Contains(n, "KUBE-CLUSTER-IP") || !slices.Contains(n, "KUBE-6-CLUSTER-IP") {
		t.Errorf("IPVS mode's sets of both families are missing: %v", n)
	}
	once(modeIPTables)
	noIPVS("switching back to iptables mode")
	once(modeIPVS)

	if err := k.runProxier("--cleanup"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, k.log.String())
	}
	if after := saveAll(); after != before {
		t.Errorf("after --cleanup the tables differ:\n%s", cmp.Diff(before, after))
	}
	noIPVS("--cleanup")
	check(t, k.unanswered("tcp", e2eClientIP, "10.96.0.10", 80))
	if t.Failed() {
		t.Logf("proxier log:\n%s", k.log.String())
	}
}
