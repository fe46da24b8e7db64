package main

import (
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

const driftRepairs = `kubeproxy_sync_proxy_rules_iptables_drift_repairs_total{ip_family="IPv4"}`

// TestE2EDriftRepair deletes a service's KUBE-SVC chain and its
// KUBE-SERVICES jump by hand, as an operator might, and checks that the
// proxier puts them back within one drift-check period (here the sync
// period, 2 s), while a proxier whose rules are intact does no full sync
// for the check: partial syncs stay O(change).
func TestE2EDriftRepair(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, e2eTools(backend)...)
			k := newE2ENode(t, backend, e2eScenario(), false)
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

			victim := string(iptables.ServiceClusterChain(portName("victim", "http")))
			k.deleteRule(t, "KUBE-SERVICES", "e2e/victim:http cluster IP")
			k.iptables(t, iptables.ProtocolIPv4, "-t", "nat", "-F", victim)
			k.iptables(t, iptables.ProtocolIPv4, "-t", "nat", "-X", victim)
			deleted := time.Now()
			k.eventually(e2eSyncPeriod+5*time.Second, "the deleted service answering again", func() error {
				return k.reaches("tcp", "10.96.0.18", 80, 3, "pod-c")
			})
			t.Logf("%s: service repaired %v after its chain and jump were deleted", backend, time.Since(deleted).Round(100*time.Millisecond))
			if got := k.metric(driftRepairs); got != 1 {
				t.Errorf("%v drift repairs, want 1", got)
			}
			if got := k.metric(fullSyncs); got != fulls+1 {
				t.Errorf("%v full syncs, want %v", got, fulls+1)
			}
			if !strings.Contains(k.log.String(), "iptables rules differ from what was applied") || !strings.Contains(k.log.String(), "e2e/victim:http cluster IP") {
				t.Error("the proxier did not log the drift and the rule it found missing")
			}
			check(t, k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b"))
		})
	}
}

// TestE2EStaleChainsAfterRestart runs the proxier once with a Service,
// deletes the Service while no proxier runs, and runs it again: the
// second run's first sync must delete the chains of the deleted Service,
// which only the kernel still knows about, and keep every other one.
func TestE2EStaleChainsAfterRestart(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, e2eTools(backend)...)
			k := newE2ENode(t, backend, e2eScenario(), false)
			once := func() {
				t.Helper()
				if err := k.runProxier("--once", "--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR); err != nil {
					t.Fatalf("--once: %v\n%s", err, k.log.String())
				}
			}
			chains := func() []iptables.Chain {
				return iptables.ChainsFromSave([]byte(strings.ReplaceAll(k.iptables(t, iptables.ProtocolIPv4, "-t", "nat", "-S"), "-N ", ":")))
			}
			has := func(list []iptables.Chain, c iptables.Chain) bool {
				for _, x := range list {
					if x == c {
						return true
					}
				}
				return false
			}

			once()
			victim := portName("victim", "http")
			stale := []iptables.Chain{
				iptables.ServiceClusterChain(victim),
				iptables.EndpointChain(victim, "10.244.0.13:8080"),
			}
			live := []iptables.Chain{
				iptables.ServiceClusterChain(portName("ext", "http")),
				iptables.EndpointChain(portName("ext", "http"), "10.244.0.11:8080"),
			}
			before := chains()
			for _, c := range append(append([]iptables.Chain(nil), stale...), live...) {
				if !has(before, c) {
					t.Fatalf("chain %s missing after the first run; the test's chain names are wrong:\n%v", c, before)
				}
			}

			k.cluster.delete("victim")
			k.writeManifest()
			once()
			after := chains()
			for _, c := range stale {
				if has(after, c) {
					t.Errorf("chain %s of the deleted Service is still there after the restart", c)
				}
			}
			for _, c := range live {
				if !has(after, c) {
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
}

func countServiceChains(chains []iptables.Chain) int {
	n := 0
	for _, c := range chains {
		if iptables.IsServiceChain(c) {
			n++
		}
	}
	return n
}
