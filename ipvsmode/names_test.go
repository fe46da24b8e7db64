package ipvsmode_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// otherPrefix is the chain prefix of the second proxy in these tests: as
// long as KUBE, so that IPv6 set names are cut at the same place.
const otherPrefix = "PXYB"

// richPort uses every chain and most sets of IPVS mode.
var richPort = svcPort{
	name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080,
	lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"203.0.113.0/24"},
	hcNodePort: 32000, etpLocal: true, endpoints: []endpoint{localPod, remotePod},
}

func mustModeNames(t *testing.T, prefix string) *ipvsmode.Names {
	t.Helper()
	n, err := ipvsmode.NewNames(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTranslateChainPrefix checks that a translation with another prefix
// is kube-proxy's with every chain and set renamed, in both families.
func TestTranslateChainPrefix(t *testing.T) {
	cfg6 := ipvsmode.WriterConfig{Family: v1.IPv6Protocol, Node: proxy.NodeConfig{ClusterCIDRs: []netip.Prefix{prefix("fd00:244::/64")}}}
	port6 := svcPort{name: "default/web", clusterIP: "fd00:96::10", port: 80, nodePort: 30080, lbVIPs: []string{"fd00:198::10"},
		sourceRanges: []string{"fd00:203::/64"}, endpoints: []endpoint{{ip: "fd00:244::5", local: true}}}
	for _, tc := range []struct {
		name string
		cfg  ipvsmode.WriterConfig
		port svcPort
	}{
		{"ipv4", modeCfg, richPort},
		{"ipv6", cfg6, port6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := translate(t, tc.cfg, tc.port)
			cfg := tc.cfg
			cfg.ChainPrefix = otherPrefix
			other := translate(t, cfg, tc.port)
			if strings.Contains(string(other.Payload), "KUBE-") {
				t.Errorf("payload with prefix %s names KUBE-:\n%s", otherPrefix, other.Payload)
			}
			rename := func(s string) string { return strings.ReplaceAll(s, otherPrefix+"-", "KUBE-") }
			if diff := cmp.Diff(string(kube.Payload), rename(string(other.Payload))); diff != "" {
				t.Errorf("payload differs beyond the prefix (-KUBE +%s renamed):\n%s", otherPrefix, diff)
			}
			var kubeSets, otherSets []string
			for i := range kube.Sets {
				kubeSets = append(kubeSets, kube.Sets[i].Set.Name)
				otherSets = append(otherSets, rename(other.Sets[i].Set.Name))
				if !strings.HasPrefix(other.Sets[i].Set.Name, mustModeNames(t, otherPrefix).SetPrefix()) {
					t.Errorf("set %s lacks the prefix", other.Sets[i].Set.Name)
				}
			}
			if diff := cmp.Diff(kubeSets, otherSets); diff != "" {
				t.Errorf("set names differ beyond the prefix (-KUBE +%s renamed):\n%s", otherPrefix, diff)
			}
			if diff := cmp.Diff(ipvsmode.DefaultNames().JumpRules(), kube.JumpRules); diff != "" {
				t.Errorf("default translation's jump rules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(mustModeNames(t, otherPrefix).JumpRules(), other.JumpRules); diff != "" {
				t.Errorf("%s translation's jump rules (-want +got):\n%s", otherPrefix, diff)
			}
			var want []iptables.JumpRule
			for _, j := range kube.JumpRules {
				j.Target = iptables.Chain(strings.Replace(string(j.Target), "KUBE-", otherPrefix+"-", 1))
				j.Args = slices.Clone(j.Args)
				j.Args[len(j.Args)-3] += " (" + otherPrefix + ")"
				j.Args[len(j.Args)-1] = string(j.Target)
				want = append(want, j)
			}
			if diff := cmp.Diff(want, other.JumpRules); diff != "" {
				t.Errorf("%s jump rules are not KUBE's renamed, with the prefix in the comment (-want +got):\n%s", otherPrefix, diff)
			}
		})
	}
}

func TestNewModeNamesValidates(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   string
	}{
		{"", ""},
		{"ABCDE", ""},
		{"ABCDEF", "ABCDEF-SOURCE-RANGES-FIREWALL is longer than iptables' 28"},
		{"A-B", "character '-'"},
		{"9A", "must start with a letter"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			_, err := ipvsmode.NewNames(tc.prefix)
			_, terr := ipvsmode.NewWriter(ipvsmode.WriterConfig{Family: v1.IPv4Protocol, ChainPrefix: tc.prefix})
			cerr := ipvsmode.Cleanup(context.Background(), ipvsmode.CleanupConfig{ChainPrefix: tc.prefix})
			for what, err := range map[string]error{"NewModeNames": err, "NewTranslator": terr, "Cleanup": cerr} {
				if tc.want == "" {
					if err != nil {
						t.Errorf("%s: %v", what, err)
					}
				} else if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: got %v, want an error with %q", what, err, tc.want)
				}
			}
		})
	}
}

// TestTwoPrefixesShareNode applies the translations of two IPVS-mode
// proxies with different prefixes to one node's iptables and ipsets (their
// virtual servers kept apart, as WithExcludeCIDRs would) and checks that
// neither's apply, leftover check or cleanup touches the other's chains
// and sets.
func TestTwoPrefixesShareNode(t *testing.T) {
	ctx := context.Background()
	n := newNode(modeNodeIPs...)
	names := mustModeNames(t, otherPrefix)
	otherApplier := ipvsmode.NewApplier(ipvs.NewReconciler(ipvstest.NewFake(), ipvstest.NewBinder()),
		ipset.NewReconciler(n.sets, names.SetPrefix()), n.ipt[v1.IPv4Protocol])
	cfg := modeCfg
	cfg.ChainPrefix = otherPrefix
	otherPort := svcPort{name: "other/db", clusterIP: "10.96.1.10", port: 5432, nodePort: 30999, endpoints: []endpoint{remotePod}}
	ipt := n.ipt[v1.IPv4Protocol]

	n.apply(t, translate(t, modeCfg, richPort))
	if _, err := otherApplier.Apply(ctx, translate(t, cfg, otherPort)); err != nil {
		t.Fatal(err)
	}
	state := func(prefix string) []string {
		return append(iptablestest.PrefixLines(ipt.Dump(), prefix), iptablestest.PrefixLines(n.sets.Dump(), prefix)...)
	}
	kubeBefore, otherBefore := state("KUBE"), state(otherPrefix)
	if len(kubeBefore) < 20 || len(otherBefore) < 20 {
		t.Fatalf("too little state: %d KUBE lines, %d %s lines", len(kubeBefore), len(otherBefore), otherPrefix)
	}

	// The KUBE proxy's next apply leaves the other's state alone.
	n.apply(t, translate(t, modeCfg, richPort, svcPort{name: "default/new", clusterIP: "10.96.0.20", port: 80, endpoints: []endpoint{localPod}}))
	if diff := cmp.Diff(otherBefore, state(otherPrefix)); diff != "" {
		t.Errorf("KUBE's apply changed %s's state:\n%s", otherPrefix, diff)
	}
	// An iptables-mode chain of KUBE's is a leftover for KUBE alone.
	if _, err := ipt.EnsureChain(ctx, iptables.TableFilter, iptables.KubeExternalServicesChain); err != nil {
		t.Fatal(err)
	}
	kubeBefore = state("KUBE")
	leftovers := func(n *ipvsmode.Names) ipvsmode.Leftovers {
		t.Helper()
		l, err := n.FindLeftovers(ctx, ipt)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if got, want := leftovers(names), (ipvsmode.Leftovers{IPVSMode: true}); got != want {
		t.Errorf("%s's leftovers = %+v, want %+v", otherPrefix, got, want)
	}
	if got, want := leftovers(mustModeNames(t, "")), (ipvsmode.Leftovers{IPVSMode: true, IPTablesMode: true}); got != want {
		t.Errorf("KUBE's leftovers = %+v, want %+v", got, want)
	}

	if err := ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{ChainPrefix: otherPrefix, IPTables: []iptables.Interface{ipt}, IPSets: n.sets}); err != nil {
		t.Fatal(err)
	}
	if left := state(otherPrefix); len(left) > 0 {
		t.Errorf("cleanup left %s's state:\n%s", otherPrefix, strings.Join(left, ""))
	}
	if diff := cmp.Diff(kubeBefore, state("KUBE")); diff != "" {
		t.Errorf("%s's cleanup changed KUBE's state:\n%s", otherPrefix, diff)
	}
	if got := leftovers(names); got != (ipvsmode.Leftovers{}) {
		t.Errorf("%s's leftovers after its cleanup = %+v, want none", otherPrefix, got)
	}
}

// TestLongestPrefixSetNames checks that with the longest prefix IPVS mode
// takes, the sets of both families have distinct names the kernel takes.
func TestLongestPrefixSetNames(t *testing.T) {
	seen := map[string]bool{}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		tr := translate(t, ipvsmode.WriterConfig{Family: family, ChainPrefix: "ABCDE"})
		for _, s := range tr.Sets {
			if seen[s.Set.Name] || len(s.Set.Name) > ipset.MaxNameLen || !strings.HasPrefix(s.Set.Name, "ABCDE-") {
				t.Errorf("%s set %q: duplicate, too long or without the prefix", family, s.Set.Name)
			}
			seen[s.Set.Name] = true
		}
	}
	if len(seen) != 2*17 {
		t.Errorf("%d set names, want 34", len(seen))
	}
}
