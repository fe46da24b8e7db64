package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// TestInitOnly runs --init-only in each mode on a node where another mode
// ran before: it needs no cluster (none is given), tunes conntrack, sets
// the mode's sysctls, removes the other mode's rules, and writes none of
// its own.
func TestInitOnly(t *testing.T) {
	once := []string{"--once", "--manifests", "testdata", "--hostname-override", "node-a"}
	for _, tc := range []struct {
		mode, before string
		sysctls      map[string]string
	}{
		{modeIPTables, modeNFTables, map[string]string{"net/ipv4/conf/all/route_localnet": "1"}},
		{modeIPVS, modeIPTables, map[string]string{"net/ipv4/vs/conntrack": "1"}},
		{modeNFTables, modeIPVS, nil},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			node := newFakeNode(t).withIPVS(t)
			env := node.environment(t, io.Discard)
			if log, err := runArgs(t, env, append(once, "--proxy-mode", tc.before)...); err != nil {
				t.Fatalf("--once in %s mode: %v\n%s", tc.before, err, log)
			}
			// Undo what the first run set, to see --init-only set it.
			for _, name := range []string{"net/netfilter/nf_conntrack_tcp_timeout_established", "net/ipv4/conf/all/route_localnet", "net/ipv4/vs/conntrack"} {
				if err := os.WriteFile(filepath.Join(node.root, "proc", "sys", name), []byte("0\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if log, err := runArgs(t, env, "--init-only", "--proxy-mode", tc.mode); err != nil {
				t.Fatalf("--init-only: %v\n%s", err, log)
			}
			want := map[string]string{"net/netfilter/nf_conntrack_tcp_timeout_established": "86400"}
			for k, v := range tc.sysctls {
				want[k] = v
			}
			for name, v := range want {
				if got := readSysctl(t, node.root, name); got != v {
					t.Errorf("%s = %s, want %s", name, got, v)
				}
			}
			if d := node.ipt4.Dump(); strings.Contains(d, "KUBE-SERVICES") {
				t.Errorf("iptables holds a proxier's rules after --init-only:\n%s", d)
			}
			if d := node.nftDump(knftables.IPv4Family, "kube-proxy"); d != "" {
				t.Errorf("nftables mode's table after --init-only:\n%s", d)
			}
			if d := node.lb.Dump(); d != "" {
				t.Errorf("virtual servers after --init-only:\n%s", d)
			}
		})
	}
}
