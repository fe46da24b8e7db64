package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
)

// kernelTree writes a kernel of release 6.1.0 under root with the given
// modules loaded.
func kernelTree(t *testing.T, root string, modules []string) {
	t.Helper()
	files := map[string]string{
		"proc/sys/kernel/osrelease":          "6.1.0\n",
		"lib/modules/6.1.0/modules.builtin":  "",
		"proc/modules":                       "",
		"proc/sys/net/netfilter/placeholder": "",
		// Set by iptables mode for localhost node ports.
		"proc/sys/net/ipv4/conf/all/route_localnet": "0\n",
	}
	for _, m := range modules {
		files["proc/modules"] += m + " 16384 0 - Live 0x0000000000000000\n"
	}
	for name, content := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIPVSModeRefused: on a kernel without IPVS, --mode ipvs refuses with
// the kernel check's message and touches nothing; a dry run does not ask.
func TestIPVSModeRefused(t *testing.T) {
	node := newFakeNode(t)
	env := node.environment(t, io.Discard)
	log, err := runArgs(t, env, "--mode", "ipvs", "--manifests", "testdata", "--hostname-override", "node-a")
	var missing *kernel.IPVSUnavailableError
	if !errors.As(err, &missing) || !strings.Contains(err.Error(), "--mode ipvs: kernel 6.1.0 cannot run IPVS mode: missing") || !strings.Contains(err.Error(), "ip_vs") {
		t.Errorf("got %v, want the kernel check's refusal naming ip_vs\n%s", err, log)
	}
	if d := node.ipt4.Dump(); d != "" {
		t.Errorf("a refused --mode ipvs touched iptables:\n%s", d)
	}
	if node.ipvsOpens.Load() != 0 {
		t.Error("a refused --mode ipvs opened IPVS")
	}
	if got := readSysctl(t, node.root, "net/ipv4/vs/conntrack"); got != "0" {
		t.Errorf("a refused --mode ipvs set vs/conntrack to %s", got)
	}

	var out bytes.Buffer
	if log, err := runArgs(t, dryRunEnvironment(t, &out), "--mode", "ipvs", "--dry-run", "--manifests", "testdata", "--hostname-override", "node-a"); err != nil {
		t.Errorf("a dry run in IPVS mode on a kernel without IPVS: %v\n%s", err, log)
	}
}

// foreignRules are other programs' rules on the node: the kubelet's, and
// a firewall's.
const foreignRules = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -d 127.0.0.0/8 ! -s 127.0.0.0/8 -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
COMMIT
`

// withForeignState gives the node other programs' rules, an ipset of
// theirs and a link, and returns a function that checks they, and nothing
// else, are there.
func (n *fakeNode) withForeignState(t *testing.T) func(t *testing.T, after string) {
	t.Helper()
	ctx := context.Background()
	if err := n.ipt4.ParseDump(foreignRules); err != nil {
		t.Fatal(err)
	}
	if err := n.sets.Create(ctx, ipset.Set{Name: "calico-things", Type: ipset.HashIP}); err != nil {
		t.Fatal(err)
	}
	n.binder.AddOtherLink("eth0")
	rules, sets := n.ipt4.Dump(), n.sets.Dump()
	return func(t *testing.T, after string) {
		t.Helper()
		if diff := cmp.Diff(rules, n.ipt4.Dump()); diff != "" {
			t.Errorf("after %s the rules differ from before (-before +after):\n%s", after, diff)
		}
		if d := n.ipt6.Dump(); d != "" {
			t.Errorf("after %s the IPv6 tables, which held nothing of the proxier's, are:\n%s", after, d)
		}
		if diff := cmp.Diff(sets, n.sets.Dump()); diff != "" {
			t.Errorf("after %s the ipsets differ from before (-before +after):\n%s", after, diff)
		}
		if d := n.lb.Dump(); d != "" {
			t.Errorf("after %s virtual servers are left:\n%s", after, d)
		}
		if _, err := n.binder.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
			t.Errorf("after %s %s: %v, want it gone", after, ipvs.DummyDevice, err)
		}
		if _, err := n.binder.EnsureDevice(ctx, "eth0"); err == nil {
			t.Errorf("after %s eth0 is gone", after)
		}
	}
}

// TestOnceAndCleanup applies one sync in each mode to a node that has
// other programs' state, and cleans up: the node is then as it was. The
// mixed case has both modes' rules, as a node that switched modes under
// a proxier that leaves the other mode's rules behind would.
func TestOnceAndCleanup(t *testing.T) {
	// Localhost node ports rewrite the kubelet's KUBE-FIREWALL, which
	// cleanup leaves to the kubelet (as kube-proxy does): the round trip
	// is exact only without them (TestLocalhostNodePorts has them).
	once := []string{"--once", "--manifests", "testdata", "--hostname-override", "node-a", "--iptables-localhost-nodeports=false"}
	for _, tc := range []struct {
		name  string
		modes [][]string
	}{
		{"iptables", [][]string{{"--mode", "iptables"}}},
		{"ipvs", [][]string{{"--mode", "ipvs"}}},
		{"both modes' rules", [][]string{{"--mode", "iptables"}, {"--mode", "ipvs"}}},
		{"nftables", [][]string{{"--mode", "nftables"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newFakeNode(t).withIPVS(t)
			unchanged := node.withForeignState(t)
			env := node.environment(t, io.Discard)
			var iptablesRules string
			for _, mode := range tc.modes {
				log, err := runArgs(t, env, append(once, mode...)...)
				if err != nil {
					t.Fatalf("--once %s: %v\n%s", mode, err, log)
				}
				if mode[1] == modeIPTables {
					iptablesRules = node.ipt4.Dump()
				}
			}
			if iptablesRules != "" && len(tc.modes) > 1 {
				// IPVS mode removed them; put them back beside its own.
				if err := node.ipt4.RestoreAll(context.Background(), []byte(iptablesRules), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
					t.Fatal(err)
				}
			}
			l, err := ipvsmode.DefaultNames().FindLeftovers(context.Background(), node.ipt4)
			if err != nil {
				t.Fatal(err)
			}
			if want := (ipvsmode.Leftovers{IPTablesMode: iptablesRules != "", IPVSMode: slices.ContainsFunc(tc.modes, func(m []string) bool { return m[1] == modeIPVS })}); l != want {
				t.Fatalf("before --cleanup the node holds %+v, want %+v:\n%s", l, want, node.ipt4.Dump())
			}
			if len(node.listeners) != 0 {
				t.Errorf("--once opened listeners: %v", node.listeners)
			}
			nftablesMode := slices.ContainsFunc(tc.modes, func(m []string) bool { return m[1] == modeNFTables })
			if got := strings.Contains(node.nftDump(knftables.IPv4Family, "kube-proxy"), "10.96.0.10 . tcp . 80"); got != nftablesMode {
				t.Errorf("before --cleanup, nftables mode's table serves 10.96.0.10: %v, want %v:\n%s", got, nftablesMode, node.nftDump(knftables.IPv4Family, "kube-proxy"))
			}
			if log, err := runArgs(t, env, "--cleanup"); err != nil {
				t.Fatalf("--cleanup: %v\n%s", err, log)
			}
			unchanged(t, "--once and --cleanup")
			for _, f := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
				if d := node.nftDump(f, "kube-proxy"); d != "" {
					t.Errorf("after --cleanup the %s table is left:\n%s", f, d)
				}
			}
			if n := node.ipvsOpen.Load(); n != 0 {
				t.Errorf("%d IPVS nodes left open", n)
			}
		})
	}
}

// TestCleanupWithoutIPVS: --cleanup on a kernel without ip_vs removes the
// sets and the dummy interface without opening IPVS, which would load it.
func TestCleanupWithoutIPVS(t *testing.T) {
	ctx := context.Background()
	node := newFakeNode(t)
	kernelTree(t, node.root, kernel.IPSetModules())
	unchanged := node.withForeignState(t)
	if err := node.sets.Create(ctx, ipset.Set{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.binder.EnsureDevice(ctx, ipvs.DummyDevice); err != nil {
		t.Fatal(err)
	}
	if log, err := runArgs(t, node.environment(t, io.Discard), "--cleanup", "--mode", "ipvs"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, log)
	}
	unchanged(t, "--cleanup")
	if n := node.tableOpens.Load(); n != 0 {
		t.Errorf("--cleanup opened the IPVS table %d times on a kernel without ip_vs", n)
	}
}

// TestModeSwitch: a proxier started in one mode removes what the other
// mode left, so that switching modes needs no --cleanup, and leaves its
// own mode's state alone on a restart.
func TestModeSwitch(t *testing.T) {
	ctx := context.Background()
	node := newFakeNode(t).withIPVS(t)
	unchanged := node.withForeignState(t)
	env := node.environment(t, io.Discard)
	once := func(t *testing.T, mode string) string {
		t.Helper()
		// Without localhost node ports, as in TestOnceAndCleanup.
		log, err := runArgs(t, env, "--once", "--mode", mode, "--manifests", "testdata", "--hostname-override", "node-a",
			"--iptables-localhost-nodeports=false")
		if err != nil {
			t.Fatalf("--once --mode %s: %v\n%s", mode, err, log)
		}
		return log
	}
	leftovers := func(t *testing.T) ipvsmode.Leftovers {
		t.Helper()
		l, err := ipvsmode.DefaultNames().FindLeftovers(ctx, node.ipt4)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	const removing = "Removing the rules of a proxier that ran here in another mode"

	once(t, modeIPTables)
	iptablesRules := node.ipt4.Dump()
	if log := once(t, modeIPTables); strings.Contains(log, removing) || node.ipvsOpens.Load() != 0 {
		t.Errorf("a restart in iptables mode removed rules or opened IPVS:\n%s", log)
	}

	log := once(t, modeIPVS)
	if l := leftovers(t); l != (ipvsmode.Leftovers{IPVSMode: true}) {
		t.Errorf("after switching to IPVS mode the node holds %+v:\n%s\nlog:\n%s", l, node.ipt4.Dump(), log)
	}
	for _, c := range node.ipt4.Chains(iptables.TableNAT) {
		if iptables.DefaultChainNames().IsServiceChain(c) {
			t.Errorf("iptables mode's chain %s is left", c)
		}
	}
	if !strings.Contains(node.lb.Dump(), "TCP 10.96.0.10:80 rr") {
		t.Errorf("IPVS mode's virtual servers are missing:\n%s", node.lb.Dump())
	}
	node.lb.ResetCounts()
	writes := node.binder.Writes()
	if log := once(t, modeIPVS); strings.Contains(log, removing) {
		t.Errorf("a restart in IPVS mode removed rules:\n%s", log)
	}
	if c := node.lb.Counts(); c.Writes() != 0 || node.binder.Writes() != writes {
		t.Errorf("a restart in IPVS mode wrote %+v to IPVS and %d times to the dummy interface, want nothing", c, node.binder.Writes()-writes)
	}

	once(t, modeIPTables)
	if l := leftovers(t); l != (ipvsmode.Leftovers{IPTablesMode: true}) {
		t.Errorf("after switching back to iptables mode the node holds %+v:\n%s", l, node.ipt4.Dump())
	}
	if diff := cmp.Diff(iptablesRules, node.ipt4.Dump()); diff != "" {
		t.Errorf("iptables mode's rules differ from those of its first run (-first +now):\n%s", diff)
	}
	if d := node.lb.Dump(); d != "" {
		t.Errorf("IPVS mode's virtual servers are left:\n%s", d)
	}
	if strings.Contains(node.sets.Dump(), ipvsmode.SetPrefix) {
		t.Errorf("IPVS mode's sets are left:\n%s", node.sets.Dump())
	}
	if _, err := node.binder.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
		t.Errorf("%s: %v, want it gone", ipvs.DummyDevice, err)
	}

	if log, err := runArgs(t, env, "--cleanup"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, log)
	}
	unchanged(t, "switching modes and --cleanup")
}

// TestModeSwitchNFTables: nftables mode removes every rule of iptables and
// IPVS mode and IPVS mode's ipsets, virtual servers and dummy interface;
// iptables and IPVS mode remove nftables mode's tables; a restart in
// nftables mode keeps its table; and all of it is of --chain-prefix's
// names alone.
func TestModeSwitchNFTables(t *testing.T) {
	ctx := context.Background()
	node := newFakeNode(t).withIPVS(t)
	unchanged := node.withForeignState(t)
	env := node.environment(t, io.Discard)
	once := func(t *testing.T, mode string, extra ...string) {
		t.Helper()
		args := append([]string{"--once", "--mode", mode, "--manifests", "testdata", "--hostname-override", "node-a",
			"--iptables-localhost-nodeports=false"}, extra...)
		if log, err := runArgs(t, env, args...); err != nil {
			t.Fatalf("--once --mode %s: %v\n%s", mode, err, log)
		}
	}
	const served = "add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 "
	names, err := ipvsmode.NewNames(iptables.DefaultChainPrefix)
	if err != nil {
		t.Fatal(err)
	}
	nftServes := func() bool { return strings.Contains(node.nftDump(knftables.IPv4Family, "kube-proxy"), served) }
	noOtherModes := func(t *testing.T, after string) {
		t.Helper()
		if l, err := ipvsmode.DefaultNames().FindLeftovers(ctx, node.ipt4); err != nil || l != (ipvsmode.Leftovers{}) {
			t.Errorf("after %s the node holds %+v (%v):\n%s", after, l, err, node.ipt4.Dump())
		}
		for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter, iptables.TableMangle} {
			for _, c := range node.ipt4.Chains(table) {
				if names.Chains().IsWriterChain(table, c) || names.IsModeChain(table, c) {
					t.Errorf("after %s the other modes' chain %s %s is left", after, table, c)
				}
			}
		}
		if d := node.lb.Dump(); d != "" {
			t.Errorf("after %s IPVS mode's virtual servers are left:\n%s", after, d)
		}
		if strings.Contains(node.sets.Dump(), ipvsmode.SetPrefix) {
			t.Errorf("after %s IPVS mode's sets are left:\n%s", after, node.sets.Dump())
		}
		if _, err := node.binder.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
			t.Errorf("after %s %s: %v, want it gone", after, ipvs.DummyDevice, err)
		}
		if !nftServes() {
			t.Errorf("after %s nftables mode's table does not serve 10.96.0.10:\n%s", after, node.nftDump(knftables.IPv4Family, "kube-proxy"))
		}
	}
	noTables := func(t *testing.T, after string) {
		t.Helper()
		for _, f := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
			if d := node.nftDump(f, "kube-proxy"); d != "" {
				t.Errorf("after %s nftables mode's %s table is left:\n%s", after, f, d)
			}
		}
	}

	once(t, modeIPTables)
	once(t, modeNFTables)
	noOtherModes(t, "switching from iptables to nftables mode")
	once(t, modeNFTables)
	noOtherModes(t, "a restart in nftables mode")

	once(t, modeIPVS)
	noTables(t, "switching from nftables to IPVS mode")
	if !strings.Contains(node.lb.Dump(), "TCP 10.96.0.10:80 rr") {
		t.Errorf("IPVS mode's virtual servers are missing:\n%s", node.lb.Dump())
	}
	once(t, modeNFTables)
	noOtherModes(t, "switching from IPVS to nftables mode")

	once(t, modeIPTables)
	noTables(t, "switching from nftables to iptables mode")

	// Another prefix's proxier in nftables mode has a table of its own,
	// and leaves this one's rules, and this one leaves its table.
	once(t, modeNFTables, "--chain-prefix", "PK")
	if !strings.Contains(node.nftDump(knftables.IPv4Family, "pk-proxy"), "add table ip pk-proxy") {
		t.Errorf("--chain-prefix PK made no table pk-proxy:\n%s", node.nftDump(knftables.IPv4Family, "pk-proxy"))
	}
	if l, err := ipvsmode.DefaultNames().FindLeftovers(ctx, node.ipt4); err != nil || !l.IPTablesMode {
		t.Errorf("nftables mode of prefix PK removed the KUBE prefix's iptables rules: %+v, %v", l, err)
	}
	once(t, modeIPTables)
	if node.nftDump(knftables.IPv4Family, "pk-proxy") == "" {
		t.Error("iptables mode of prefix KUBE deleted the table of prefix PK")
	}
	if log, err := runArgs(t, env, "--cleanup", "--chain-prefix", "PK"); err != nil {
		t.Fatalf("--cleanup --chain-prefix PK: %v\n%s", err, log)
	}
	if d := node.nftDump(knftables.IPv4Family, "pk-proxy"); d != "" {
		t.Errorf("--cleanup --chain-prefix PK left its table:\n%s", d)
	}

	if log, err := runArgs(t, env, "--cleanup"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, log)
	}
	unchanged(t, "switching modes and --cleanup")
	noTables(t, "--cleanup")
}

// TestWithoutNFT checks that on a node where nft cannot be used, iptables
// mode starts and --cleanup succeeds (there is no nftables table to
// remove), and nftables mode refuses with the reason.
func TestWithoutNFT(t *testing.T) {
	node := newFakeNode(t)
	env := node.environment(t, io.Discard)
	env.NewNFTables = func(context.Context, knftables.Family, string) (knftables.Interface, error) {
		return nil, errors.New("could not run nft: exec: \"nft\": executable file not found in $PATH")
	}
	once := []string{"--once", "--manifests", "testdata", "--hostname-override", "node-a"}
	if log, err := runArgs(t, env, append(once, "--mode", "iptables")...); err != nil {
		t.Fatalf("--once in iptables mode: %v\n%s", err, log)
	}
	if log, err := runArgs(t, env, "--cleanup"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, log)
	}
	if _, err := runArgs(t, env, append(once, "--mode", "nftables")...); err == nil || !strings.Contains(err.Error(), "executable file not found") {
		t.Errorf("--once in nftables mode without nft: %v, want the reason", err)
	}
}

// TestCleanupWithoutIPTables checks that --cleanup fails when no family's
// iptables works, rather than reporting success.
func TestCleanupWithoutIPTables(t *testing.T) {
	env := newFakeNode(t).environment(t, io.Discard)
	env.NewIPTables = func(context.Context, v1.IPFamily, iptables.Backend) (iptables.Interface, error) {
		return nil, errors.New("iptables: not found")
	}
	if _, err := runArgs(t, env, "--cleanup"); err == nil || !strings.Contains(err.Error(), "no iptables of backend nft works here") {
		t.Errorf("got %v, want an error saying no iptables works", err)
	}
}

// TestLocalhostNodePorts: iptables mode serves IPv4 node ports on
// localhost by default, as kube-proxy does, so --once sets route_localnet
// and writes KUBE-FIREWALL with its jumps; with
// --iptables-localhost-nodeports=false it does neither.
func TestLocalhostNodePorts(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			node := newFakeNode(t)
			env := node.environment(t, io.Discard)
			args := []string{"--once", "--manifests", "testdata", "--hostname-override", "node-a", fmt.Sprintf("--iptables-localhost-nodeports=%v", on)}
			if log, err := runArgs(t, env, args...); err != nil {
				t.Fatalf("%v: %v\n%s", args, err, log)
			}
			want := map[bool]string{true: "1", false: "0\n"}[on]
			if v, err := os.ReadFile(filepath.Join(node.root, "proc/sys/net/ipv4/conf/all/route_localnet")); err != nil || string(v) != want {
				t.Errorf("route_localnet: %q, %v; want %q", v, err, want)
			}
			dump := node.ipt4.Dump()
			for _, rule := range []string{"-A INPUT -j KUBE-FIREWALL\n", "-A OUTPUT -j KUBE-FIREWALL\n", `--comment "block incoming localnet connections"`} {
				if strings.Contains(dump, rule) != on {
					t.Errorf("the rules hold %q: %v, want %v\n%s", rule, !on, on, dump)
				}
			}
		})
	}
	// nftables mode never serves node ports on localhost, as kube-proxy's
	// without its feature gate: the flag, on by default, changes nothing.
	t.Run("nftables", func(t *testing.T) {
		node := newFakeNode(t)
		args := []string{"--once", "--mode", "nftables", "--manifests", "testdata", "--hostname-override", "node-a", "--iptables-localhost-nodeports=true"}
		if log, err := runArgs(t, node.environment(t, io.Discard), args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, log)
		}
		if v, err := os.ReadFile(filepath.Join(node.root, "proc/sys/net/ipv4/conf/all/route_localnet")); err != nil || string(v) != "0\n" {
			t.Errorf("route_localnet: %q, %v; want it left at 0", v, err)
		}
		if dump := node.ipt4.Dump(); strings.Contains(dump, "KUBE-FIREWALL") {
			t.Errorf("nftables mode wrote iptables rules:\n%s", dump)
		}
		if d := node.nftDump(knftables.IPv4Family, "kube-proxy"); !strings.Contains(d, "service-nodeports") {
			t.Errorf("nftables mode's table has no node ports:\n%s", d)
		}
	})
}
