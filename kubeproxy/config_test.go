package kubeproxy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

func TestValidate(t *testing.T) {
	bit := func(b int) *int { return &b }
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero"},
		{name: "every mode", cfg: Config{Mode: ModeNFTables, ChainPrefix: "PROXY", MasqueradeBit: bit(31), SyncPeriod: time.Minute, MinSyncPeriod: time.Minute}},
		{name: "mode", cfg: Config{Mode: "userspace"}, wantErr: `kubeproxy.Config: Mode "userspace": want "iptables", "ipvs", "nftables" or "ebpf"`},
		{name: "cluster CIDRs", cfg: Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}},
			wantErr: "kubeproxy.Config: ClusterCIDRs: 10.0.0.0/8 and 10.1.0.0/16 are both IPv4; give at most one per IP family"},
		{name: "local detection", cfg: Config{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth+"},
			wantErr: `kubeproxy.Config: InterfaceNamePrefix: interface name "veth+" has a character other than letters, digits, '_', '.' and '-'`},
		{name: "local detection mode", cfg: Config{DetectLocalMode: "Bridge"},
			wantErr: `kubeproxy.Config: DetectLocalMode "Bridge": want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix`},
		{name: "masquerade bit", cfg: Config{MasqueradeBit: bit(32)}, wantErr: "kubeproxy.Config: MasqueradeBit 32: must be within the range [0, 31]"},
		{name: "min sync period beyond the default sync period", cfg: Config{MinSyncPeriod: time.Hour},
			wantErr: "kubeproxy.Config: MinSyncPeriod 1h0m0s: must be between 0 and SyncPeriod (30s)"},
		{name: "negative periods", cfg: Config{SyncPeriod: -time.Second, DriftCheckPeriod: -time.Second},
			wantErr: "kubeproxy.Config: SyncPeriod -1s: must not be negative\nkubeproxy.Config: MinSyncPeriod 0s: must be between 0 and SyncPeriod (-1s)\nkubeproxy.Config: DriftCheckPeriod -1s: must not be negative"},
		// The blocks' own wording follows the field's name.
		{name: "chain prefix", cfg: Config{ChainPrefix: "TOOLONG"}, wantErr: "kubeproxy.Config: ChainPrefix: " + errOf(ipvsmode.NewNames("TOOLONG"))},
		{name: "scheduler", cfg: Config{IPVSScheduler: "nope"}, wantErr: "kubeproxy.Config: IPVSScheduler: " + errOf(kernel.IPVSSchedulerModule("nope"))},
		{name: "IPVS timeouts", cfg: Config{IPVSTuning: ipvsmode.Tuning{Timeouts: ipvs.Timeouts{UDP: -time.Second}}},
			wantErr: "kubeproxy.Config: IPVSTuning: IPVS timeouts: invalid: udp timeout -1s is not a whole number of seconds from 0 to 2^31-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.wantErr, errString(tc.cfg.Validate())); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}

// errOf is the text of a call's error.
func errOf[T any](_ T, err error) string { return errString(err) }

func TestNFTablesTable(t *testing.T) {
	for prefix, want := range map[string]string{"KUBE": "kube-proxy", "Proxy_2": "proxy_2-proxy"} {
		if got := NFTablesTable(prefix); got != want {
			t.Errorf("NFTablesTable(%q) = %q, want %q", prefix, got, want)
		}
	}
	if got := (&Config{}).nftTable(); got != "kube-proxy" {
		t.Errorf("the zero Config's table is %q, want kube-proxy's", got)
	}
}

// TestNodeAddresses: which addresses serve node ports and health checks,
// and whether iptables mode serves node ports on localhost.
func TestNodeAddresses(t *testing.T) {
	node := proxier.Node{
		Name:     "node-a",
		Families: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
		IPs: map[v1.IPFamily][]netip.Addr{
			v1.IPv4Protocol: {netip.MustParseAddr("192.168.10.11"), netip.MustParseAddr("10.0.0.11")},
			v1.IPv6Protocol: {netip.MustParseAddr("fd00::11")},
		},
	}
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		name          string
		cfg           Config
		wantV4        []netip.Prefix
		wantHealth    []netip.Addr
		wantLocalhost bool
	}{
		{name: "all", cfg: Config{LocalhostNodePorts: true}, wantLocalhost: true},
		{name: "all, no localhost", cfg: Config{}},
		{name: "primary", cfg: Config{NodePortPrimary: true, LocalhostNodePorts: true, NodePortAddresses: []netip.Prefix{p("127.0.0.0/8")}},
			wantV4:     []netip.Prefix{p("192.168.10.11/32"), p("10.0.0.11/32")},
			wantHealth: []netip.Addr{netip.MustParseAddr("192.168.10.11"), netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00::11")}},
		{name: "CIDRs", cfg: Config{LocalhostNodePorts: true, NodePortAddresses: []netip.Prefix{p("10.0.0.0/8"), p("fd00::/64")}},
			wantV4:     []netip.Prefix{p("10.0.0.0/8")},
			wantHealth: []netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00::11")}},
		{name: "CIDRs with loopback", cfg: Config{LocalhostNodePorts: true, NodePortAddresses: []netip.Prefix{p("127.0.0.0/8")}},
			wantV4: []netip.Prefix{p("127.0.0.0/8")}, wantLocalhost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmpPrefix := cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })
			if diff := cmp.Diff(tc.wantV4, tc.cfg.nodePortPrefixes(v1.IPv4Protocol, node.IPs[v1.IPv4Protocol]), cmpPrefix); diff != "" {
				t.Errorf("IPv4 node-port prefixes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantHealth, tc.cfg.healthCheckAddresses(node), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("health-check addresses (-want +got):\n%s", diff)
			}
			if got := tc.cfg.localhostNodePorts(); got != tc.wantLocalhost {
				t.Errorf("localhost node ports: %v, want %v", got, tc.wantLocalhost)
			}
		})
	}
}

func TestClusterCIDR(t *testing.T) {
	c := Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64"), netip.MustParsePrefix("10.244.0.0/16")}}
	for family, want := range map[v1.IPFamily]netip.Prefix{v1.IPv4Protocol: netip.MustParsePrefix("10.244.0.0/16"), v1.IPv6Protocol: netip.MustParsePrefix("fd00:244::/64")} {
		if got := c.clusterCIDR(family); got != want {
			t.Errorf("%s cluster CIDR = %v, want %v", family, got, want)
		}
	}
	if got := (&Config{}).clusterCIDR(v1.IPv4Protocol); got.IsValid() {
		t.Errorf("no ClusterCIDRs gives %v, want the zero Prefix", got)
	}
}
