package iptables_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// cleanupForeign is what other programs keep in a node's tables, in the
// family cleanupForeign6 replaces: the kubelet's KUBE-* chains, a CNI
// plugin's chains (one with a comment that mentions a jump to KUBE-SERVICES,
// which is not one) and plain rules in built-in chains. Cleanup must leave
// all of it as it is.
const cleanupForeign = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -s 10.244.0.0/16 -j ACCEPT
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:KUBE-MARK-DROP - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -j MASQUERADE
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "sent on -j KUBE-SERVICES later" -m tcp --dport 8443 -j DNAT --to-destination 10.244.0.5:443
-A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
`

var cleanupForeign6 = strings.NewReplacer(
	"10.244.0.0/16", "fd00:244::/64",
	"127.0.0.0/8", "::1/128",
	"10.244.0.5:443", "[fd00:244::5]:443",
).Replace(cleanupForeign)

// installProxy applies a writer's full sync of c to f, with the jump rules
// and the canary a proxier adds, and fails t if anything fails.
func installProxy(t *testing.T, f *iptablestest.Fake, cfg iptables.WriterConfig, c *cluster) {
	t.Helper()
	ctx := context.Background()
	cfg.RandomFully = f.HasRandomFully()
	w := mustWriter(t, cfg)
	syncFake(t, w, f, c.input())
	for _, table := range []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter} {
		if _, err := f.EnsureChain(ctx, table, iptables.ProxyCanaryChain); err != nil {
			t.Fatal(err)
		}
		if _, err := f.EnsureRule(ctx, iptables.Append, table, iptables.ProxyCanaryChain, "-j", "RETURN"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCleanup(t *testing.T) {
	v6cluster := func() *cluster {
		c := newCluster(v1.IPv6Protocol, "node-a")
		c.setService(makeService("ns", "web", "fd00:96::10", withNodePort(30080), withExternalLocal()))
		c.setEndpoints("ns", "web", tcp8080, ep{IP: "fd00:244::11", Node: "node-a"}, ep{IP: "fd00:244::12", Node: "node-b"})
		c.setService(makeService("ns", "empty", "fd00:96::11"))
		return c
	}
	for _, tc := range []struct {
		name    string
		fake    *iptablestest.Fake
		foreign string
		cfg     iptables.WriterConfig
		cluster *cluster
	}{{
		name:    "IPv4",
		fake:    iptablestest.NewFake(),
		foreign: cleanupForeign,
		cfg:     scnWriterConfig(true),
		cluster: scnCluster(),
	}, {
		name:    "IPv4 legacy",
		fake:    iptablestest.NewFake(iptablestest.WithBackend(iptables.BackendLegacy)),
		foreign: cleanupForeign,
		cfg:     scnWriterConfig(true),
		cluster: scnCluster(),
	}, {
		name:    "IPv6",
		fake:    iptablestest.NewIPv6Fake(),
		foreign: cleanupForeign6,
		cfg:     iptables.WriterConfig{Family: v1.IPv6Protocol, Node: proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("fd00:244::/64")}}},
		cluster: v6cluster(),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := tc.fake
			if err := f.ParseDump(tc.foreign); err != nil {
				t.Fatal(err)
			}
			before := f.Dump()
			installProxy(t, f, tc.cfg, tc.cluster)
			if f.Dump() == before {
				t.Fatal("the proxy's rules did not change the tables")
			}

			n, err := kubeChains.Cleanup(ctx, f)
			if err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if diff := cmp.Diff(before, f.Dump()); diff != "" {
				t.Errorf("after Cleanup, the tables differ from before the proxy ran (-before +after):\n%s", diff)
			}
			if n < 10 {
				t.Errorf("Cleanup reports %d chains deleted, want the proxy's top-level, service and canary chains", n)
			}

			// A second cleanup finds nothing to do.
			if n, err := kubeChains.Cleanup(ctx, f); n != 0 || err != nil {
				t.Errorf("second Cleanup = %d, %v; want 0, nil", n, err)
			}
			if diff := cmp.Diff(before, f.Dump()); diff != "" {
				t.Errorf("second Cleanup changed the tables (-before +after):\n%s", diff)
			}
		})
	}
}

// TestCleanupNothingThere checks that Cleanup of tables that hold nothing
// of a proxy's restores nothing: the Fake would create the tables if it did.
func TestCleanupNothingThere(t *testing.T) {
	f := iptablestest.NewFake()
	if n, err := kubeChains.Cleanup(context.Background(), f); n != 0 || err != nil {
		t.Errorf("Cleanup = %d, %v; want 0, nil", n, err)
	}
	if d := f.Dump(); d != "" {
		t.Errorf("Cleanup of empty tables changed them:\n%s", d)
	}
}

// TestCleanupKeepsUsedChains checks that a chain of the proxy that another
// program's rule jumps to is kept, with what it jumps to, while the rest
// goes, and that the error names it.
func TestCleanupKeepsUsedChains(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// foreign is restored into the nat table once the proxy's
		// rules are in.
		foreign []string
		// kept are the proxy's nat chains expected to survive, besides
		// the service chains when keepServiceChains is set.
		kept              []iptables.Chain
		keepServiceChains bool
		wantErr           []string
	}{{
		name:    "CNI marks for masquerade",
		foreign: []string{":CNI-HOSTPORT-SETMARK - [0:0]", "-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ"},
		kept:    []iptables.Chain{iptables.KubeMarkMasqChain},
		wantErr: []string{"nat", "KUBE-MARK-MASQ (used by CNI-HOSTPORT-SETMARK)"},
	}, {
		name: "foreign chain sends traffic to the services",
		foreign: []string{":MY-SERVICES - [0:0]", "-A OUTPUT -j MY-SERVICES",
			"-A MY-SERVICES -m comment --comment \"before -j KUBE-NODEPORTS\" -g KUBE-SERVICES"},
		// KUBE-SERVICES leads to every service chain, KUBE-NODEPORTS and
		// KUBE-MARK-MASQ; KUBE-POSTROUTING is not reachable from it.
		kept:              []iptables.Chain{iptables.KubeServicesChain, iptables.KubeNodePortsChain, iptables.KubeMarkMasqChain},
		keepServiceChains: true,
		wantErr:           []string{"nat", "KUBE-SERVICES (used by MY-SERVICES)"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := iptablestest.NewFake()
			if err := f.ParseDump(cleanupForeign); err != nil {
				t.Fatal(err)
			}
			installProxy(t, f, scnWriterConfig(true), scnCluster())
			// The other program's rules come after the proxy's chains
			// exist, as they would have to.
			foreign := "*nat\n" + strings.Join(tc.foreign, "\n") + "\nCOMMIT\n"
			if err := f.RestoreAll(ctx, []byte(foreign), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
				t.Fatal(err)
			}
			natBefore := f.Chains(iptables.TableNAT)

			_, err := kubeChains.Cleanup(ctx, f)
			if err == nil {
				t.Fatal("Cleanup succeeded, want an error naming the kept chains")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			want := map[iptables.Chain]bool{}
			for _, c := range natBefore {
				if slices.Contains(tc.kept, c) || (tc.keepServiceChains && kubeChains.IsServiceChain(c)) {
					want[c] = true
				}
			}
			for _, c := range f.Chains(iptables.TableNAT) {
				if strings.HasPrefix(string(c), "KUBE-") && c != "KUBE-MARK-DROP" && !want[c] {
					t.Errorf("chain %s is still there", c)
				}
				delete(want, c)
			}
			for c := range want {
				t.Errorf("chain %s, which another program uses, was deleted", c)
			}
			// A kept chain keeps its rules.
			if got := f.Rules(iptables.TableNAT, iptables.KubeMarkMasqChain); len(got) != 1 {
				t.Errorf("KUBE-MARK-MASQ holds %q, want its one rule", got)
			}
			// The filter table and mangle's canary are gone all the same.
			for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableMangle} {
				for _, c := range f.Chains(table) {
					if c == iptables.ProxyCanaryChain || c == iptables.KubeForwardChain {
						t.Errorf("chain %s of table %s is still there", c, table)
					}
				}
			}
		})
	}
}
