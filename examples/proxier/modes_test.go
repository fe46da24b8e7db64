package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/iptables"
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

func TestIPVSMode(t *testing.T) {
	v, err := kernel.ParseVersion("6.1.0")
	if err != nil {
		t.Fatal(err)
	}
	all := append(kernel.RequiredIPVSModules(v), kernel.IPSetModules()...)
	for _, tc := range []struct {
		name    string
		modules []string
		args    []string
		check   func(t *testing.T, err error)
	}{{
		name: "kernel without IPVS",
		args: []string{"--mode", "ipvs"},
		check: func(t *testing.T, err error) {
			var missing *kernel.IPVSUnavailableError
			if !errors.As(err, &missing) || !strings.Contains(err.Error(), "cannot run IPVS mode: missing") || !strings.Contains(err.Error(), "ip_vs") {
				t.Errorf("got %v, want the kernel check's refusal naming ip_vs", err)
			}
		},
	}, {
		name:    "kernel with IPVS",
		modules: all,
		args:    []string{"--mode", "ipvs"},
		check: func(t *testing.T, err error) {
			if !errors.Is(err, errIPVSNotReady) {
				t.Errorf("got %v, want errIPVSNotReady", err)
			}
		},
	}, {
		name:    "dry run, kernel with IPVS",
		modules: all,
		args:    []string{"--mode", "ipvs", "--dry-run", "--manifests", "testdata"},
		check: func(t *testing.T, err error) {
			if !errors.Is(err, errIPVSNotReady) {
				t.Errorf("got %v, want errIPVSNotReady", err)
			}
		},
	}, {
		name:    "cleanup refuses too",
		modules: all[1:],
		args:    []string{"--mode", "ipvs", "--cleanup"},
		check: func(t *testing.T, err error) {
			if err == nil || !strings.Contains(err.Error(), "cannot run IPVS mode: missing") {
				t.Errorf("got %v, want the kernel check's refusal", err)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			node := newFakeNode(t)
			kernelTree(t, node.root, tc.modules)
			env := node.environment(t, io.Discard)
			log, err := runArgs(t, env, tc.args...)
			tc.check(t, err)
			if node.ipt4.Dump() != "" {
				t.Errorf("--mode ipvs touched iptables:\n%s\nlog:\n%s", node.ipt4.Dump(), log)
			}
		})
	}
}

// TestOnceAndCleanup applies one sync to a node that has other programs'
// rules, and cleans up: the rules of the node are then what they were.
func TestOnceAndCleanup(t *testing.T) {
	node := newFakeNode(t)
	const foreign = `*filter
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
	if err := node.ipt4.ParseDump(foreign); err != nil {
		t.Fatal(err)
	}
	before := node.ipt4.Dump()
	env := node.environment(t, io.Discard)

	log, err := runArgs(t, env, "--once", "--manifests", "testdata", "--hostname-override", "node-a")
	if err != nil {
		t.Fatalf("--once: %v\n%s", err, log)
	}
	if !strings.Contains(node.ipt4.Dump(), "-A KUBE-SERVICES") {
		t.Fatalf("--once applied no service rules:\n%s", node.ipt4.Dump())
	}
	if len(node.listeners) != 0 {
		t.Errorf("--once opened listeners: %v", node.listeners)
	}

	log, err = runArgs(t, env, "--cleanup")
	if err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, log)
	}
	if diff := cmp.Diff(before, node.ipt4.Dump()); diff != "" {
		t.Errorf("after --once and --cleanup the rules differ from before (-before +after):\n%s", diff)
	}
	if d := node.ipt6.Dump(); d != "" {
		t.Errorf("--cleanup changed the IPv6 tables, which held nothing of the proxier's:\n%s", d)
	}
}

// TestCleanupWithoutIPTables checks that --cleanup fails when no family's
// iptables works, rather than reporting success.
func TestCleanupWithoutIPTables(t *testing.T) {
	env := newFakeNode(t).environment(t, io.Discard)
	env.newIPTables = func(context.Context, iptables.Protocol, iptables.Backend) (iptables.Interface, error) {
		return nil, errors.New("iptables: not found")
	}
	if _, err := runArgs(t, env, "--cleanup"); err == nil || !strings.Contains(err.Error(), "no iptables of backend nft works here") {
		t.Errorf("got %v, want an error saying no iptables works", err)
	}
}
