package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
)

const driftRepairs = `kubeproxy_sync_proxy_rules_iptables_drift_repairs_total{ip_family="IPv4"}`

// TestE2EDriftRepair deletes a service's rules by hand, as an operator
// might, and checks that the proxier puts them back within one check
// period (here the sync period, 2 s), while a proxier whose rules are
// intact does no full sync for the check: partial syncs stay O(change). In
// iptables mode the deletion is a KUBE-SVC chain and its KUBE-SERVICES
// jump, which the drift check finds; in nftables mode it is the whole
// table (nft delete table), which either the table check or the drift
// watcher (which sees the deletion as it is committed) finds first: both
// end in one full sync.
func TestE2EDriftRepair(t *testing.T) {
	forEachE2EMode(t, false, func(t *testing.T, m e2eMode) {
		k := newE2EModeNode(t, m, e2eScenario(), false)
		k.start(k.proxierArgs("--iptables-drift-check-period", e2eSyncPeriod.String())...)
		check(t, k.reaches("tcp", "10.96.0.18", 80, 3, "pod-c"))

		// Three check periods with nothing to repair.
		fulls := k.metric(fullSyncs)
		time.Sleep(3 * e2eSyncPeriod)
		if got := k.metric(fullSyncs); got != fulls {
			t.Errorf("%v full syncs while nothing changed, want %v", got, fulls)
		}
		if got := k.metric(driftRepairs); got != 0 {
			t.Errorf("%v drift repairs while nothing changed, want 0", got)
		}

		if m.mode == modeNFTables {
			k.nft(t, "delete", "table", "ip", "kube-proxy")
		} else {
			victim := string(iptables.DefaultChainNames().ServiceCluster(portName("victim", "http")))
			k.deleteRule(t, "KUBE-SERVICES", "e2e/victim:http cluster IP")
			k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-F", victim)
			k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-X", victim)
		}
		deleted := time.Now()
		k.eventually(e2eSyncPeriod+5*time.Second, "the deleted service answering again", func() error {
			return k.reaches("tcp", "10.96.0.18", 80, 3, "pod-c")
		})
		t.Logf("%s: service repaired %v after its rules were deleted", m.name, time.Since(deleted).Round(100*time.Millisecond))
		if got := k.metric(fullSyncs); got != fulls+1 {
			t.Errorf("%v full syncs, want %v", got, fulls+1)
		}
		if m.mode == modeNFTables {
			if log := k.log.String(); !strings.Contains(log, "The nftables table was deleted by another program") &&
				!strings.Contains(log, "The nftables table is missing; rewriting it") {
				t.Error("the proxier did not log the table's deletion")
			}
		} else {
			if got := k.metric(driftRepairs); got != 1 {
				t.Errorf("%v drift repairs, want 1", got)
			}
			if !strings.Contains(k.log.String(), "iptables rules differ from what was applied") || !strings.Contains(k.log.String(), "e2e/victim:http cluster IP") {
				t.Error("the proxier did not log the drift and the rule it found missing")
			}
		}
		check(t, k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b"))
	})
}

// TestE2EStaleChainsAfterRestart runs the proxier once with a Service,
// deletes the Service while no proxier runs, and runs it again: the
// second run's first sync must delete the chains of the deleted Service,
// which only the kernel still knows about, and keep every other one.
func TestE2EStaleChainsAfterRestart(t *testing.T) {
	forEachE2EMode(t, false, func(t *testing.T, m e2eMode) {
		k := newE2EModeNode(t, m, e2eScenario(), false)
		once := func() {
			t.Helper()
			if err := k.runProxier("--once", "--mode", m.mode, "--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR); err != nil {
				t.Fatalf("--once: %v\n%s", err, k.log.String())
			}
		}
		chains := func() []string {
			if m.mode == modeNFTables {
				return k.nftChains(t)
			}
			var names []string
			for _, c := range iptables.ChainsFromSave([]byte(strings.ReplaceAll(k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-S"), "-N ", ":"))) {
				names = append(names, string(c))
			}
			return names
		}

		once()
		victim := portName("victim", "http")
		var stale, live []string
		if m.mode == modeNFTables {
			stale = []string{k.nftChainOf(t, "service-", "-e2e/victim/tcp/http"), k.nftChainOf(t, "endpoint-", "-e2e/victim/tcp/http__10.244.0.13/8080")}
			// Only services with affinity (victim here: see
			// newE2EModeNode) or a Local external policy have chains.
			live = []string{k.nftChainOf(t, "service-", "-e2e/sticky/tcp/http"), k.nftChainOf(t, "endpoint-", "-e2e/sticky/tcp/http__10.244.0.11/8080")}
		} else {
			stale = []string{string(iptables.DefaultChainNames().ServiceCluster(victim)), string(iptables.DefaultChainNames().Endpoint(victim, "10.244.0.13:8080"))}
			live = []string{string(iptables.DefaultChainNames().ServiceCluster(portName("ext", "http"))), string(iptables.DefaultChainNames().Endpoint(portName("ext", "http"), "10.244.0.11:8080"))}
		}
		before := chains()
		for _, c := range append(append([]string(nil), stale...), live...) {
			if !slices.Contains(before, c) {
				t.Fatalf("chain %s missing after the first run; the test's chain names are wrong:\n%v", c, before)
			}
		}

		k.cluster.delete("victim")
		k.writeManifest()
		once()
		after := chains()
		for _, c := range stale {
			if slices.Contains(after, c) {
				t.Errorf("chain %s of the deleted Service is still there after the restart", c)
			}
		}
		for _, c := range live {
			if !slices.Contains(after, c) {
				t.Errorf("chain %s of a live Service was deleted", c)
			}
		}
		if n := countServiceChains(after); n != countServiceChains(before)-len(stale) {
			t.Errorf("%d service chains after the restart, want %d", n, countServiceChains(before)-len(stale))
		}
		check(t, k.reaches("tcp", "10.96.0.12", 80, 20, "pod-a", "pod-b"))
		check(t, k.unanswered("tcp", e2eClientIP, "10.96.0.18", 80))
	})
}

// countServiceChains counts the per-service chains: iptables mode's
// KUBE-SVC-* and the like, nftables mode's names with a "/".
func countServiceChains(chains []string) int {
	n := 0
	for _, c := range chains {
		if iptables.DefaultChainNames().IsServiceChain(iptables.Chain(c)) || strings.Contains(c, "/") {
			n++
		}
	}
	return n
}
