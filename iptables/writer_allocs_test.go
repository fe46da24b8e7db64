package iptables_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestAppliedFullAllocs bounds what recording a first full payload as
// applied allocates: the record of its chains (for the drift check), a
// map entry per chain, about 11,000 at 1,000 services of 10 endpoints, is
// read from the payload when a check first needs it, not when the payload
// is applied.
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
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Errorf("Applied after the first full sync allocated %d bytes; want at most 64 KiB", n)
	}
}

// TestWriterCheckDriftAfterPartialSyncs checks the record of applied
// chains when partial payloads follow the full one before a check reads
// them: kept unread while they are small beside it, and read at once when
// they grow past a quarter of it. Either way the check finds no drift
// where the kernel holds what was applied, and finds it in a chain that a
// partial payload wrote and that was then changed by hand.
func TestWriterCheckDriftAfterPartialSyncs(t *testing.T) {
	// At 40 services a partial payload of one service is about a
	// fortieth of the full one; 20 of them are half of it.
	for _, changes := range []int{1, 20} {
		for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
			t.Run(fmt.Sprintf("%s/%d", backend, changes), func(t *testing.T) {
				ctx := context.Background()
				c := newCluster(v1.IPv4Protocol, "node-1")
				c.LoadBench(40, 3)
				w := mustWriter(t, scnWriterConfig(true))
				f := iptablestest.NewFake(iptablestest.WithBackend(backend))
				apply := func(wantFull bool) {
					t.Helper()
					res := w.Sync(ctx, c.input())
					if res.Full != wantFull {
						t.Fatalf("sync full %v, want %v", res.Full, wantFull)
					}
					err := applyFake(f, w, res)
					w.Applied(err)
					if err != nil {
						t.Fatal(err)
					}
				}
				apply(true)
				for i := range changes {
					// A new endpoint chain for service i, and the
					// balancing chain that jumps to it rewritten.
					c.setEndpoints("bench", fmt.Sprintf("svc-%d", i), tcp8080, ep{IP: fmt.Sprintf("10.200.0.%d", i+1)}, ep{IP: "10.200.1.1"})
					apply(false)
				}
				if d, err := w.CheckDrift(ctx, f); err != nil || d.Found() {
					t.Fatalf("nothing changed by hand: drift %+v, error %v", d, err)
				}
				if backend == iptables.BackendNFT {
					// The next check that reads the service chains.
					for range iptables.NFTServiceChainCheckInterval - 1 {
						if _, err := w.CheckDrift(ctx, f); err != nil {
							t.Fatal(err)
						}
					}
				}

				_, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, `"bench/svc-0:p cluster IP"`)
				_, sep := findRule(t, f, iptables.TableNAT, iptables.Chain(svc), "-j KUBE-SEP-")
				spec, _ := findRule(t, f, iptables.TableNAT, iptables.Chain(sep), "-j DNAT")
				if !strings.Contains(spec, "10.200.") {
					t.Fatalf("endpoint chain %s of bench/svc-0 DNATs to %q, want an address the partial sync wrote", sep, spec)
				}
				restoreOrFail(t, f, iptables.TableNAT, "-D "+sep+" "+spec)
				d, err := w.CheckDrift(ctx, f)
				if err != nil {
					t.Fatal(err)
				}
				if d.Missing != 1 || d.Unexpected != 0 || !slicesContainPrefix(d.Examples, "changed nat "+sep) {
					t.Errorf("DNAT rule of %s deleted: missing %d, unexpected %d, examples %q; want 1, 0 and one about %s", sep, d.Missing, d.Unexpected, d.Examples, sep)
				}
			})
		}
	}
}
