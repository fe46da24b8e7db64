package iptables_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// otherPrefix is the chain prefix of the second proxy in these tests.
const otherPrefix = "PROXYB"

func mustNames(t testing.TB, prefix string) *iptables.ChainNames {
	t.Helper()
	n, err := iptables.NewChainNames(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestChainNames(t *testing.T) {
	web := portName("ns", "web", "http", v1.ProtocolTCP)
	type names struct {
		Services, External, NodePorts, Postrouting, MarkMasq, Forward, Firewall, Canary iptables.Chain
		SVC, SVL, EXT, FW, SEP                                                          iptables.Chain
	}
	get := func(n *iptables.ChainNames) names {
		return names{
			n.Services(), n.ExternalServices(), n.NodePorts(), n.Postrouting(), n.MarkMasq(), n.Forward(), n.ProxyFirewall(), n.Canary(),
			n.ServiceCluster(web), n.ServiceLocal(web), n.ServiceExternal(web), n.ServiceFirewall(web), n.Endpoint(web, "10.0.0.1:80"),
		}
	}
	// kube-proxy's names, from the package's constants and DefaultChainNames.
	kube := names{
		iptables.KubeServicesChain, iptables.KubeExternalServicesChain, iptables.KubeNodePortsChain, iptables.KubePostroutingChain,
		iptables.KubeMarkMasqChain, iptables.KubeForwardChain, iptables.KubeProxyFirewallChain, iptables.ProxyCanaryChain,
		kubeChains.ServiceCluster(web), kubeChains.ServiceLocal(web), kubeChains.ServiceExternal(web),
		kubeChains.ServiceFirewall(web), kubeChains.Endpoint(web, "10.0.0.1:80"),
	}
	if !strings.HasPrefix(string(kube.SVC), "KUBE-SVC-") {
		t.Fatalf("ServiceCluster = %s", kube.SVC)
	}
	hash := func(c iptables.Chain) string { return string(c[len(c)-16:]) }
	for _, tc := range []struct {
		prefix string
		want   names
	}{
		{"", kube},
		{"KUBE", kube},
		{"PROXYB", names{
			"PROXYB-SERVICES", "PROXYB-EXTERNAL-SERVICES", "PROXYB-NODEPORTS", "PROXYB-POSTROUTING",
			"PROXYB-MARK-MASQ", "PROXYB-FORWARD", "PROXYB-PROXY-FIREWALL", "PROXYB-PROXY-CANARY",
			// The hashes are kube-proxy's; only the prefix changes.
			iptables.Chain("PROXYB-SVC-" + hash(kube.SVC)), iptables.Chain("PROXYB-SVL-" + hash(kube.SVL)),
			iptables.Chain("PROXYB-EXT-" + hash(kube.EXT)), iptables.Chain("PROXYB-FW-" + hash(kube.FW)),
			iptables.Chain("PROXYB-SEP-" + hash(kube.SEP)),
		}},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			n := mustNames(t, tc.prefix)
			if diff := cmp.Diff(tc.want, get(n)); diff != "" {
				t.Errorf("names (-want +got):\n%s", diff)
			}
			if !n.IsServiceChain(n.Endpoint(web, "10.0.0.1:80")) || n.IsServiceChain(n.Services()) {
				t.Error("IsServiceChain does not tell service chains from top-level ones")
			}
		})
	}
	if got := iptables.DefaultChainNames().Prefix(); got != iptables.DefaultChainPrefix {
		t.Errorf("DefaultChainNames().Prefix() = %q", got)
	}
}

func TestNewChainNamesValidates(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   string // "" for accepted
	}{
		{"A", ""},
		{"k8s_b", ""},
		{"ABCDEFG", ""},
		{"ABCDEFGH", "longer than 7"},
		{"KUBE-B", `character '-'`},
		{"1PROXY", "must start with a letter"},
		{"_PROXY", "must start with a letter"},
		{"A B", `character ' '`},
		{`A"B`, `character '"'`},
		{"A\nB", `character '\n'`},
		{"ÄB", "must start with a letter"},
		{"AÄ", "only letters, digits and underscores"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			n, err := iptables.NewChainNames(tc.prefix)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "chain prefix") {
					t.Fatalf("got %v, want an error naming the chain prefix and %q", err, tc.want)
				}
				_, werr := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol, ChainPrefix: tc.prefix})
				if werr == nil || !strings.Contains(werr.Error(), tc.want) {
					t.Errorf("NewWriter: got %v, want %q", werr, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The longest names must fit iptables' 28 characters.
			longest := n.Endpoint(portName("ns", "svc", "p", v1.ProtocolTCP), "10.0.0.1:80")
			for _, c := range []iptables.Chain{longest, n.ExternalServices(), n.ProxyFirewall(), n.Canary()} {
				if len(c) > 28 {
					t.Errorf("chain %s has %d characters", c, len(c))
				}
			}
		})
	}
}

// prefixedSync syncs w and applies the result to f with w's jump rules.
func prefixedSync(t *testing.T, w *iptables.Writer, f *iptablestest.Fake, in *proxy.FamilyInput) iptables.SyncResult {
	t.Helper()
	ctx := context.Background()
	res := w.Sync(ctx, in)
	var err error
	if res.Full {
		err = w.EnsureJumpRules(ctx, f)
	}
	if err == nil && len(res.Payload) > 0 {
		err = f.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
	}
	w.Applied(err)
	if err != nil {
		t.Fatalf("applying the %s sync:\n%s\nerror: %v", syncKind(res), res.Payload, err)
	}
	return res
}

// TestWriterChainPrefixPayloads checks that a writer with another prefix
// writes, in full and partial syncs alike, exactly what a writer with
// kube-proxy's names writes, with every name renamed and no KUBE- name
// left.
func TestWriterChainPrefixPayloads(t *testing.T) {
	cfg := scnConfig()
	cfg.ChainsPerCommit = 5
	other := cfg
	other.ChainPrefix = otherPrefix
	kw, ow := mustWriter(t, cfg), mustWriter(t, other)
	kf, of := iptablestest.NewFake(), iptablestest.NewFake()
	c := scnCluster()
	for _, s := range []struct {
		name   string
		change func(*cluster)
		full   bool
	}{
		{"initial", func(*cluster) {}, true},
		{"remove endpoint", scnRemoveEndpoint, false},
		{"add service", scnAddService, false},
		{"delete service", scnDeleteService, false},
		{"no change", func(*cluster) {}, false},
		{"full again", func(*cluster) { kw.RequestFullSync(); ow.RequestFullSync() }, true},
	} {
		s.change(c)
		in := c.input()
		kres := syncFake(t, kw, kf, in)
		ores := prefixedSync(t, ow, of, in)
		if kres.Full != s.full || ores.Full != s.full {
			t.Fatalf("%s: full = %v and %v, want %v", s.name, kres.Full, ores.Full, s.full)
		}
		if strings.Contains(string(ores.Payload), "KUBE-") {
			t.Errorf("%s: payload with prefix %s names a KUBE- chain:\n%s", s.name, otherPrefix, ores.Payload)
		}
		renamed := strings.ReplaceAll(string(ores.Payload), otherPrefix+"-", "KUBE-")
		if diff := cmp.Diff(string(kres.Payload), renamed); diff != "" {
			t.Errorf("%s: payload differs from kube-proxy's names' beyond the prefix (-KUBE +%s renamed):\n%s", s.name, otherPrefix, diff)
		}
		if ores.ChainsDeleted != kres.ChainsDeleted || ores.Lines != kres.Lines {
			t.Errorf("%s: deleted %d, %d lines; want %d, %d", s.name, ores.ChainsDeleted, ores.Lines, kres.ChainsDeleted, kres.Lines)
		}
	}
	// The kernel state follows, built-in chains included, except for the
	// jumps' comments, which name the prefix.
	renamed := strings.ReplaceAll(of.Dump(), otherPrefix+"-", "KUBE-")
	renamed = strings.ReplaceAll(renamed, " ("+otherPrefix+")", "")
	if diff := cmp.Diff(canonical(kf.Dump()), canonical(renamed)); diff != "" {
		t.Errorf("rules differ beyond the prefix (-KUBE +%s renamed):\n%s", otherPrefix, diff)
	}
}

// TestTwoWritersShareTables runs two writers with different prefixes on one
// Fake, each for its own Services, and checks that neither's syncs,
// leftover handling or cleanup touch the other's rules.
func TestTwoWritersShareTables(t *testing.T) {
	ctx := context.Background()
	f := iptablestest.NewFake()
	kube := iptables.DefaultChainNames()
	names := mustNames(t, otherPrefix)

	kc := scnCluster()
	oc := newCluster(v1.IPv4Protocol, scnNode)
	oc.setService(makeService("other", "db", "10.96.1.10", withNodePort(30999), withLoadBalancer("203.0.113.99", scnClientIP+"/32")))
	oc.setEndpoints("other", "db", tcp8080, scnEP(scnPodC))
	ocfg := scnConfig()
	ocfg.ChainPrefix = otherPrefix
	kw, ow := mustWriter(t, scnConfig()), mustWriter(t, ocfg)

	prefixedSync(t, kw, f, kc.input())
	// The second proxy starts with the first one's chains in the tables:
	// they are not its leftovers.
	var save bytes.Buffer
	if err := f.SaveInto(ctx, iptables.TableNAT, &save); err != nil {
		t.Fatal(err)
	}
	ow.NoteExistingChains(iptables.ChainsFromSave(save.Bytes()))
	if res := prefixedSync(t, ow, f, oc.input()); res.ChainsDeleted != 0 {
		t.Errorf("the second writer's first sync deletes %d chains, want none", res.ChainsDeleted)
	}
	for _, n := range []*iptables.ChainNames{kube, names} {
		for _, table := range []iptables.Table{iptables.TableMangle, iptables.TableNAT} {
			if _, err := f.EnsureChain(ctx, table, n.Canary()); err != nil {
				t.Fatal(err)
			}
		}
	}
	kubeBefore, otherBefore := iptablestest.PrefixLines(f.Dump(), "KUBE"), iptablestest.PrefixLines(f.Dump(), otherPrefix)
	if len(otherBefore) == 0 || len(kubeBefore) == 0 {
		t.Fatal("a writer wrote nothing")
	}

	// The first proxy's full and partial syncs leave the second's rules
	// as they were.
	kw.RequestFullSync()
	prefixedSync(t, kw, f, kc.input())
	scnRemoveEndpoint(kc)
	scnDeleteService(kc)
	prefixedSync(t, kw, f, kc.input())
	if diff := cmp.Diff(otherBefore, iptablestest.PrefixLines(f.Dump(), otherPrefix)); diff != "" {
		t.Errorf("the KUBE writer's syncs changed %s's rules:\n%s", otherPrefix, diff)
	}
	kubeBefore = iptablestest.PrefixLines(f.Dump(), "KUBE")

	// And the other way round, ending with a cleanup of the second.
	ow.RequestFullSync()
	prefixedSync(t, ow, f, oc.input())
	n, err := names.Cleanup(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("cleanup of the second proxy deleted nothing")
	}
	if left := iptablestest.PrefixLines(f.Dump(), otherPrefix); len(left) > 0 {
		t.Errorf("cleanup left %s's rules:\n%s", otherPrefix, strings.Join(left, ""))
	}
	if diff := cmp.Diff(kubeBefore, iptablestest.PrefixLines(f.Dump(), "KUBE")); diff != "" {
		t.Errorf("the %s writer's syncs and cleanup changed KUBE's rules:\n%s", otherPrefix, diff)
	}
	if _, err := kubeChains.Cleanup(ctx, f); err != nil {
		t.Fatal(err)
	}
	if left := iptablestest.PrefixLines(f.Dump(), "KUBE"); len(left) > 0 {
		t.Errorf("cleanup left KUBE's rules:\n%s", strings.Join(left, ""))
	}
}

// TestChainNamesOwnership checks that each prefix owns its own chains and
// no other's, and that the jump rules' comments tell the proxies apart.
func TestChainNamesOwnership(t *testing.T) {
	kube, other := iptables.DefaultChainNames(), mustNames(t, otherPrefix)
	web := portName("ns", "web", "http", v1.ProtocolTCP)
	for _, tc := range []struct {
		table iptables.Table
		chain iptables.Chain
		kube  bool
		other bool
	}{
		{iptables.TableNAT, "KUBE-SERVICES", true, false},
		{iptables.TableNAT, "PROXYB-SERVICES", false, true},
		{iptables.TableNAT, "PROXYB-MARK-MASQ", false, true},
		{iptables.TableFilter, "PROXYB-EXTERNAL-SERVICES", false, true},
		{iptables.TableFilter, "PROXYB-PROXY-FIREWALL", false, true},
		{iptables.TableMangle, "PROXYB-PROXY-CANARY", false, true},
		{iptables.TableMangle, "KUBE-PROXY-CANARY", true, false},
		{iptables.TableNAT, kube.ServiceCluster(web), true, false},
		{iptables.TableNAT, other.ServiceCluster(web), false, true},
		{iptables.TableNAT, other.Endpoint(web, "10.0.0.1:80"), false, true},
		{iptables.TableFilter, "PROXYB-FIREWALL", false, false},
		{iptables.TableNAT, "KUBE-MARK-DROP", false, false},
	} {
		if got := kube.IsWriterChain(tc.table, tc.chain); got != tc.kube {
			t.Errorf("KUBE owns %s %s: %v, want %v", tc.table, tc.chain, got, tc.kube)
		}
		if got := other.IsWriterChain(tc.table, tc.chain); got != tc.other {
			t.Errorf("%s owns %s %s: %v, want %v", otherPrefix, tc.table, tc.chain, got, tc.other)
		}
	}

	ocfg := iptables.WriterConfig{Family: v1.IPv4Protocol, ChainPrefix: otherPrefix}
	kj, oj := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol}).JumpRules(), mustWriter(t, ocfg).JumpRules()
	var want []iptables.JumpRule
	for _, j := range kj {
		j.Target = iptables.Chain(strings.Replace(string(j.Target), "KUBE-", otherPrefix+"-", 1))
		j.Args = slices.Clone(j.Args)
		j.Args[len(j.Args)-3] += " (" + otherPrefix + ")"
		j.Args[len(j.Args)-1] = string(j.Target)
		want = append(want, j)
	}
	if diff := cmp.Diff(want, oj); diff != "" {
		t.Errorf("%s's jump rules (-want +got):\n%s", otherPrefix, diff)
	}
}
