package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// TestChainPrefixBesideKUBE runs a proxier with --chain-prefix PXYB, in
// both modes and with --cleanup, on a node where a proxier with kube-proxy's
// names runs in iptables mode: the KUBE rules stay as they were throughout,
// and PXYB's cleanup removes its own chains and sets only.
func TestChainPrefixBesideKUBE(t *testing.T) {
	node := newFakeNode(t).withIPVS(t)
	unchanged := node.withForeignState(t)
	env := node.environment(t, io.Discard)
	run := func(t *testing.T, args ...string) {
		t.Helper()
		if log, err := runArgs(t, env, args...); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, log)
		}
	}
	// Without localhost node ports: their KUBE-FIREWALL is the kubelet's
	// chain too, which --cleanup leaves, so the round trip would not end
	// where it started (see TestLocalhostNodePorts).
	once := []string{"--once", "--manifests", "testdata", "--hostname-override", "node-a", "--iptables-localhost-nodeports=false"}
	run(t, append(once, "--mode", "iptables")...)
	kube := iptablestest.PrefixLines(node.ipt4.Dump(), "KUBE")
	kubeSets := node.sets.Dump()

	for _, mode := range []string{modeIPTables, modeIPVS} {
		run(t, append(once, "--mode", mode, "--chain-prefix", "PXYB")...)
		if diff := cmp.Diff(kube, iptablestest.PrefixLines(node.ipt4.Dump(), "KUBE")); diff != "" {
			t.Errorf("PXYB in %s mode changed KUBE's rules (-before +after):\n%s", mode, diff)
		}
		if !strings.Contains(node.ipt4.Dump(), ":PXYB-SERVICES") {
			t.Errorf("PXYB in %s mode wrote no PXYB-SERVICES:\n%s", mode, node.ipt4.Dump())
		}
	}
	if !strings.Contains(node.sets.Dump(), "create PXYB-CLUSTER-IP") {
		t.Errorf("IPVS mode with PXYB made no PXYB-CLUSTER-IP set:\n%s", node.sets.Dump())
	}
	vs := node.lb.Dump()

	run(t, "--cleanup", "--chain-prefix", "PXYB")
	if left := iptablestest.PrefixLines(node.ipt4.Dump(), "PXYB"); len(left) > 0 {
		t.Errorf("--cleanup --chain-prefix PXYB left:\n%s", strings.Join(left, ""))
	}
	if diff := cmp.Diff(kube, iptablestest.PrefixLines(node.ipt4.Dump(), "KUBE")); diff != "" {
		t.Errorf("--cleanup --chain-prefix PXYB changed KUBE's rules (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(kubeSets, node.sets.Dump()); diff != "" {
		t.Errorf("--cleanup --chain-prefix PXYB left or removed sets (-before PXYB +after):\n%s", diff)
	}
	// Virtual servers carry no prefix: they could be kube-proxy's.
	if vs == "" || node.lb.Dump() != vs {
		t.Errorf("--cleanup --chain-prefix PXYB changed the virtual servers from %q to %q", vs, node.lb.Dump())
	}

	run(t, "--cleanup")
	unchanged(t, "both proxiers' --cleanup")
}

// TestDryRunChainPrefix checks that --chain-prefix renames everything a
// dry run prints, in both modes, but KUBE-FIREWALL: localhost node ports'
// guard is the node's, shared with the kubelet and every proxy, and keeps
// its name.
func TestDryRunChainPrefix(t *testing.T) {
	for _, mode := range []string{modeIPTables, modeIPVS} {
		t.Run(mode, func(t *testing.T) {
			var out bytes.Buffer
			log, err := runArgs(t, dryRunEnvironment(t, &out), "--dry-run", "--mode", mode, "--manifests", "testdata", "--hostname-override", "node-a", "--chain-prefix", "PXYB")
			if err != nil {
				t.Fatalf("dry run: %v\n%s", err, log)
			}
			renamed := strings.ReplaceAll(out.String(), "KUBE-FIREWALL", "")
			if strings.Contains(renamed, "KUBE-") || !strings.Contains(out.String(), "-A PXYB-SERVICES") {
				t.Errorf("dry run with --chain-prefix PXYB names KUBE- or lacks PXYB-SERVICES:\n%s", out.String())
			}
		})
	}
}
