package iptables

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestDetectBackend(t *testing.T) {
	const (
		fewRules  = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"
		manyRules = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j DROP\n-A INPUT -j RETURN\nCOMMIT\n"
		hint      = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
		oldHint   = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	)
	for _, tc := range []struct {
		name    string
		paths   []string
		saves   map[string]string
		version string
		want    Backend
		wantErr bool
	}{
		{name: "both installed, nothing anywhere: nft", paths: keys(allBinaries()), want: BackendNFT},
		{name: "both installed, legacy holds more rules", paths: keys(allBinaries()),
			saves: map[string]string{"iptables-legacy-save": manyRules, "iptables-nft-save": fewRules}, want: BackendLegacy},
		{name: "IPv6 rules count too", paths: keys(allBinaries()),
			saves: map[string]string{"ip6tables-legacy-save": manyRules, "iptables-nft-save": fewRules}, want: BackendLegacy},
		{name: "both installed, nft holds more rules", paths: keys(allBinaries()),
			saves: map[string]string{"iptables-legacy-save": fewRules, "iptables-nft-save": manyRules}, want: BackendNFT},
		{name: "a tie goes to nft", paths: keys(allBinaries()),
			saves: map[string]string{"iptables-legacy-save": fewRules, "iptables-nft-save": fewRules}, want: BackendNFT},
		{name: "kubelet's hint beats counts", paths: keys(allBinaries()),
			saves: map[string]string{"iptables-legacy-save": hint, "iptables-nft-save": manyRules}, want: BackendLegacy},
		{name: "older kubelet's canary", paths: keys(allBinaries()),
			saves: map[string]string{"ip6tables-nft-save": oldHint, "iptables-legacy-save": manyRules}, want: BackendNFT},
		{name: "only legacy installed", paths: []string{"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore"}, want: BackendLegacy},
		{name: "only nft installed", paths: []string{"iptables-nft", "iptables-nft-save", "iptables-nft-restore"}, want: BackendNFT},
		{name: "plain iptables, old", paths: []string{"iptables"}, version: "iptables v1.4.21", want: BackendLegacy},
		{name: "plain iptables, nft", paths: []string{"iptables"}, version: "iptables v1.8.4 (nf_tables)", want: BackendNFT},
		{name: "nothing", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &scriptExec{paths: map[string]bool{}}
			for _, p := range tc.paths {
				e.paths[p] = true
			}
			e.handle = func(name string, args []string, _ string) result {
				if len(args) == 1 && args[0] == "--version" {
					return result{stdout: tc.version}
				}
				if strings.HasSuffix(name, "-save") {
					return result{stdout: tc.saves[name]}
				}
				return result{status: 1}
			}
			got, err := DetectBackend(context.Background(), e)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("DetectBackend = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestResolveCommands(t *testing.T) {
	for _, tc := range []struct {
		name    string
		paths   []string
		version string
		backend Backend
		proto   v1.IPFamily
		want    commands
		wantErr bool
	}{
		{name: "suffixed", paths: keys(allBinaries()), version: "ip6tables v1.8.9 (legacy)", backend: BackendLegacy, proto: v1.IPv6Protocol,
			want: commands{"ip6tables-legacy", "ip6tables-legacy-save", "ip6tables-legacy-restore"}},
		{name: "plain legacy", paths: []string{"iptables"}, version: "iptables v1.6.1", backend: BackendLegacy, proto: v1.IPv4Protocol,
			want: commands{"iptables", "iptables-save", "iptables-restore"}},
		{name: "plain nft asked for legacy", paths: []string{"iptables"}, version: "iptables v1.8.4 (nf_tables)", backend: BackendLegacy, proto: v1.IPv4Protocol, wantErr: true},
		{name: "none", backend: BackendNFT, proto: v1.IPv4Protocol, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &scriptExec{paths: map[string]bool{}, handle: func(string, []string, string) result { return result{stdout: tc.version} }}
			for _, p := range tc.paths {
				e.paths[p] = true
			}
			got, _, err := resolveCommands(context.Background(), e, tc.backend, tc.proto)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("resolveCommands = %+v, %v; want %+v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func keys(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	return s
}
