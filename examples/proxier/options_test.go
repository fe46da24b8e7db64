package main

import (
	"errors"
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/kubeproxy"
)

func TestParseOptions(t *testing.T) {
	defaults := flagDefaults()
	with := func(f func(*options)) *options {
		o := defaults
		f(&o)
		return &o
	}
	for _, tc := range []struct {
		args    []string
		want    *options
		wantErr string
	}{
		{args: nil, want: &defaults},
		{
			// kube-proxy's double dashes, and Go's single ones.
			args: []string{"--kubeconfig=/etc/kube.conf", "-master", "https://10.0.0.1:6443", "--hostname-override", "Node-A",
				"--mode", "ipvs", "--masquerade-all", "--cleanup"},
			want: with(func(o *options) {
				o.kubeconfig, o.master, o.hostnameOverride = "/etc/kube.conf", "https://10.0.0.1:6443", "Node-A"
				o.mode, o.masqueradeAll, o.cleanup = modeIPVS, true, true
			}),
		},
		{
			args: []string{"--cluster-cidr", "10.244.0.0/16, fd00:244::/64", "--nodeport-addresses", "192.168.0.0/24,fd00::/64"},
			want: with(func(o *options) {
				o.clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/64")}
				o.nodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("fd00::/64")}
			}),
		},
		{args: []string{"--nodeport-addresses", "primary"}, want: with(func(o *options) { o.nodePortPrimary = true })},
		{args: []string{"--iptables-localhost-nodeports=false"}, want: with(func(o *options) { o.localhostNodePorts = false })},
		{
			// A bare IP gets the default port; empty disables.
			args: []string{"--healthz-bind-address", "10.0.0.5", "--metrics-bind-address", ""},
			want: with(func(o *options) { o.healthzBindAddress, o.metricsBindAddress = "10.0.0.5:10256", "" }),
		},
		{
			args: []string{"--manifests", "x", "--dry-run", "--sync-period", "5s", "--min-sync-period", "0"},
			want: with(func(o *options) { o.manifests, o.dryRun, o.syncPeriod, o.minSyncPeriod = "x", true, 5*time.Second, 0 }),
		},
		{args: []string{"--iptables-drift-check-period", "0"}, want: with(func(o *options) { o.driftCheckPeriod = 0 })},
		{args: []string{"--iptables-drift-check-period", "2m"}, want: with(func(o *options) { o.driftCheckPeriod = 2 * time.Minute })},
		{args: []string{"--iptables-drift-check-period", "-1s"}, wantErr: "--iptables-drift-check-period"},
		{args: []string{"--chain-prefix", "PXYB"}, want: with(func(o *options) { o.chainPrefix, o.nftTable = "PXYB", "pxyb-proxy" })},
		{args: []string{"--chain-prefix", "KUBE-B"}, wantErr: `--chain-prefix: IPVS mode: chain prefix "KUBE-B": character '-'`},
		{args: []string{"--chain-prefix", "PROXYB"}, wantErr: "--chain-prefix: IPVS mode: chain prefix \"PROXYB\": chain PROXYB-SOURCE-RANGES-FIREWALL is longer"},
		{args: []string{"--chain-prefix", ""}, want: &defaults},
		// nftables mode serves node ports on the node's own addresses
		// unless told otherwise, as kube-proxy's.
		{args: []string{"--mode", "nftables"}, want: with(func(o *options) { o.mode, o.nodePortPrimary = modeNFTables, true })},
		{
			args: []string{"--mode", "nftables", "--nodeport-addresses", "0.0.0.0/0"},
			want: with(func(o *options) {
				o.mode, o.nodePortAddresses = modeNFTables, []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
			}),
		},
		{args: []string{"--mode", "userspace"}, wantErr: `--mode "userspace"`},
		{args: []string{"--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"}, wantErr: "at most one per IP family"},
		{args: []string{"--cluster-cidr", "10.0.0.0"}, wantErr: "--cluster-cidr"},
		{args: []string{"--nodeport-addresses", "nonsense"}, wantErr: "--nodeport-addresses"},
		{args: []string{"--healthz-bind-address", "localhost:1"}, wantErr: "--healthz-bind-address"},
		{args: []string{"--sync-period", "0s"}, wantErr: "--sync-period"},
		{args: []string{"--min-sync-period", "1m"}, wantErr: "--min-sync-period"},
		{args: []string{"--dry-run", "--once"}, wantErr: "exclude each other"},
		{args: []string{"--cleanup", "--manifests", "x"}, wantErr: "--cleanup needs no cluster"},
		{args: []string{"extra"}, wantErr: "unexpected arguments"},
		{args: []string{"--no-such-flag"}, wantErr: "not defined"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got, err := parseOptions(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(options{}), cmpopts.IgnoreFields(options{}, "names"), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
			if p := got.names.Chains().Prefix(); p != tc.want.chainPrefix {
				t.Errorf("names have prefix %q, want %q", p, tc.want.chainPrefix)
			}
		})
	}
	if _, err := parseOptions([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v, want flag.ErrHelp", err)
	}
}

// TestParseOptionsVerbosity checks that -v sets klog's verbosity, which is
// global: the test puts it back.
func TestParseOptionsVerbosity(t *testing.T) {
	t.Cleanup(func() {
		if _, err := parseOptions([]string{"-v", "0"}, io.Discard); err != nil {
			t.Error(err)
		}
	})
	if _, err := parseOptions([]string{"-v", "3"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !klog.V(3).Enabled() || klog.V(4).Enabled() {
		t.Errorf("after -v 3: V(3) enabled %v, V(4) enabled %v; want true, false", klog.V(3).Enabled(), klog.V(4).Enabled())
	}
}

func TestOptionsNodeAndCIDR(t *testing.T) {
	o, err := parseOptions([]string{"--hostname-override", " Node-A ", "--cluster-cidr", "fd00:244::/64,10.244.0.0/16"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if name, err := o.nodeName(); name != "node-a" || err != nil {
		t.Errorf("nodeName() = %q, %v; want node-a", name, err)
	}
	if diff := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("fd00:244::/64"), netip.MustParsePrefix("10.244.0.0/16")}, o.kubeProxyConfig().ClusterCIDRs, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("cluster CIDRs (-want +got):\n%s", diff)
	}
}

// TestOptionsExitOnNodeChange checks that --exit-on-node-change reaches
// kubeproxy.Config, with and without --config (it is proxykit's own flag,
// which applies beside the file), and is off by default.
func TestOptionsExitOnNodeChange(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--exit-on-node-change"}, true},
		{[]string{"--config", "testdata/config/kubeadm-default.yaml", "--exit-on-node-change"}, true},
	} {
		o, err := parseOptions(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.kubeProxyConfig().ExitOnNodeChange; got != tc.want {
			t.Errorf("%q: ExitOnNodeChange %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestOptionsEBPF checks that the ebpf flags reach kubeproxy's Config,
// and that ebpf mode needs its cgroup only where it attaches programs.
func TestOptionsEBPF(t *testing.T) {
	o, err := parseOptions([]string{"--mode", "ebpf", "--ebpf-cgroup-path", "/sys/fs/cgroup/pods", "--ebpf-pin-path", "/run/bpf", "--ebpf-name-prefix", "px2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.kubeProxyConfig()
	want := kubeproxy.EBPFConfig{CgroupPath: "/sys/fs/cgroup/pods", PinPath: "/run/bpf", NamePrefix: "px2"}
	if c.Mode != kubeproxy.ModeEBPF || c.EBPF != want || !c.NodePortPrimary {
		t.Errorf("Config: mode %q, EBPF %+v, NodePortPrimary %v; want ebpf, %+v, true (nftables mode's default)", c.Mode, c.EBPF, c.NodePortPrimary, want)
	}
	for _, args := range [][]string{{"--cleanup"}, {"--dry-run"}, {"--init-only"}} {
		if _, err := parseOptions(append([]string{"--mode", "ebpf"}, args...), io.Discard); err != nil {
			t.Errorf("--mode ebpf %q without a cgroup: %v", args, err)
		}
	}
}
