package kubeproxy

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

func TestFromConfiguration(t *testing.T) {
	defaults := func(f func(*Config)) *Config {
		c := &Config{
			Mode:               ModeIPTables,
			HealthzBindAddress: "0.0.0.0:10256",
			MetricsBindAddress: "127.0.0.1:10249",
			LocalhostNodePorts: true,
			SyncPeriod:         30 * time.Second,
			MinSyncPeriod:      time.Second,
			Conntrack:          &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour},
		}
		if f != nil {
			f(c)
		}
		return c
	}
	bit := func(b int) *int { return &b }
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		name    string
		data    string
		want    *Config
		wantErr string
	}{
		{name: "kube-proxy's defaults", data: "", want: defaults(nil)},
		{name: "IPv6 bindAddress", data: "bindAddress: '::'\nhealthzBindAddress: '::1'\n", want: defaults(func(c *Config) {
			c.HealthzBindAddress, c.MetricsBindAddress = "[::1]:10256", "[::1]:10249"
		})},
		{name: "IPVS mode reads the ipvs section's periods and the iptables section's masquerading",
			data: "mode: ipvs\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\niptables:\n  masqueradeAll: true\n  masqueradeBit: 15\n  syncPeriod: 1h\nipvs:\n  syncPeriod: 1m\n  scheduler: wrr\nnftables:\n  masqueradeAll: false\n",
			want: defaults(func(c *Config) {
				c.Mode, c.SyncPeriod, c.MinSyncPeriod, c.IPVSScheduler = ModeIPVS, time.Minute, 0, "wrr"
				c.MasqueradeAll, c.MasqueradeBit = true, bit(15)
				c.ClusterCIDRs = []netip.Prefix{p("10.244.0.0/16"), p("fd00:10:244::/56")}
			})},
		{name: "IPVS mode reads excludeCIDRs, strictARP and the timeouts",
			data: "mode: ipvs\nipvs:\n  excludeCIDRs: [10.200.0.0/16, 'fd00:200::/64']\n  strictARP: true\n  tcpTimeout: 1h\n  tcpFinTimeout: 30s\n  udpTimeout: 10s\n",
			want: defaults(func(c *Config) {
				c.Mode, c.MinSyncPeriod = ModeIPVS, 0
				c.IPVSExcludeCIDRs = []netip.Prefix{p("10.200.0.0/16"), p("fd00:200::/64")}
				c.IPVSTuning = ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour, TCPFin: 30 * time.Second, UDP: 10 * time.Second}}
			})},
		{name: "the ipvs section is neither read nor checked in another mode",
			data: "ipvs:\n  excludeCIDRs: [nonsense]\n  strictARP: true\n  tcpTimeout: -1s\n", want: defaults(nil)},
		{name: "ipvs.tcpFinTimeout", data: "mode: ipvs\nipvs:\n  tcpFinTimeout: -1s\n", wantErr: "ipvs.tcpFinTimeout: -1s: must be greater than or equal to 0"},
		{name: "ipvs.excludeCIDRs", data: "mode: ipvs\nipvs:\n  excludeCIDRs: [10.0.0.0/8, nonsense]\n", wantErr: "ipvs.excludeCIDRs[1]: must be a valid CIDR"},
		{name: "nftables mode: its section, node ports on the node's addresses",
			data: "mode: nftables\niptables:\n  masqueradeAll: true\nnftables:\n  masqueradeBit: 3\n  minSyncPeriod: 2s\n",
			want: defaults(func(c *Config) {
				c.Mode, c.MasqueradeBit, c.MinSyncPeriod, c.NodePortPrimary = ModeNFTables, bit(3), 2*time.Second, true
			})},
		{name: "nftables mode: every address", data: "mode: nftables\nnodePortAddresses: [all]\n",
			want: defaults(func(c *Config) {
				c.Mode, c.NodePortAddresses = ModeNFTables, []netip.Prefix{p("0.0.0.0/0"), p("::/0")}
			})},
		{name: "detectLocalMode ClusterCIDR is the default", data: "detectLocalMode: ClusterCIDR\ndetectLocal:\n  bridgeInterface: cni0\n",
			want: defaults(func(c *Config) { c.BridgeInterface = "cni0" })},
		{name: "detectLocalMode NodeCIDR", data: "detectLocalMode: NodeCIDR\n", want: defaults(func(c *Config) { c.DetectLocalMode = proxy.LocalModeNodeCIDR })},
		{name: "detectLocalMode BridgeInterface", data: "detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n",
			want: defaults(func(c *Config) { c.DetectLocalMode, c.BridgeInterface = proxy.LocalModeBridgeInterface, "cbr0" })},
		{name: "detectLocalMode InterfaceNamePrefix", data: "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\n",
			want: defaults(func(c *Config) { c.DetectLocalMode, c.InterfaceNamePrefix = proxy.LocalModeInterfaceNamePrefix, "veth" })},
		{name: "BridgeInterface without a bridge", data: "detectLocalMode: BridgeInterface\ndetectLocal:\n  interfaceNamePrefix: veth\n",
			wantErr: "detectLocal.bridgeInterface: interface name must not be empty"},
		{name: "InterfaceNamePrefix without a prefix", data: "detectLocalMode: InterfaceNamePrefix\n",
			wantErr: "detectLocal.interfaceNamePrefix: interface name must not be empty"},
		{name: "a bridge name that would end the rule", data: "detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: 'cni0 -j ACCEPT'\n",
			wantErr: `detectLocal.bridgeInterface: interface name "cni0 -j ACCEPT" has a character other than`},
		{name: "a prefix with the wildcard", data: "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth*\n",
			wantErr: `detectLocal.interfaceNamePrefix: interface name "veth*" has a character other than`},
		{name: "a prefix too long for the wildcard", data: "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: abcdefghijklmno\n",
			wantErr: `detectLocal.interfaceNamePrefix: interface name prefix "abcdefghijklmno" is too long`},
		{name: "a bad name of another mode", data: "detectLocal:\n  bridgeInterface: 'a\"b'\n", wantErr: `detectLocal.bridgeInterface: interface name "a\"b"`},
		{name: "detectLocalMode", data: "detectLocalMode: PodCIDR\n", wantErr: `detectLocalMode: "PodCIDR" is not a mode kube-proxy has; want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix`},
		{name: "detectLocalMode, hostile", data: "detectLocalMode: \"a\\nb\"\n", wantErr: `detectLocalMode: "a\nb" is not a mode`},
		{name: "mode", data: "mode: kernelspace\n", wantErr: `mode: "kernelspace" is not a mode this proxier has; want "iptables", "ipvs" or "nftables"`},
		{name: "masqueradeBit", data: "iptables:\n  masqueradeBit: 32\n", wantErr: "iptables.masqueradeBit: 32: must be within the range [0, 31]"},
		{name: "minSyncPeriod", data: "iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n", wantErr: "iptables.minSyncPeriod: 2s: must not be longer than iptables.syncPeriod (1s)"},
		{name: "clusterCIDR", data: "clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", wantErr: "clusterCIDR: 10.0.0.0/8 and 10.1.0.0/16 are both IPv4; give at most one per IP family"},
		{name: "healthzBindAddress", data: "healthzBindAddress: somewhere\n", wantErr: `healthzBindAddress "somewhere": want IP:port or an IP: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc, err := Decode([]byte(header + tc.data))
			if err != nil {
				t.Fatal(err)
			}
			got, err := FromConfiguration(kc)
			if gotErr := errString(err); tc.wantErr == "" && gotErr != "" || !strings.HasPrefix(gotErr, tc.wantErr) {
				t.Errorf("error %q, want %q", gotErr, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("Config (-want +got):\n%s", diff)
			}
			if got != nil {
				if err := got.Validate(); err != nil {
					t.Errorf("the Config does not validate: %v", err)
				}
			}
		})
	}
}

// TestConfigurationRoundTrip: a Config written as a KubeProxyConfiguration
// and read back with Decode and FromConfiguration is the same Config.
func TestConfigurationRoundTrip(t *testing.T) {
	bit := func(b int) *int { return &b }
	p := netip.MustParsePrefix
	for name, c := range map[string]*Config{
		"iptables": {Mode: ModeIPTables, HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "127.0.0.1:10249", LocalhostNodePorts: true,
			SyncPeriod: time.Minute, MinSyncPeriod: 2 * time.Second, MasqueradeAll: true, MasqueradeBit: bit(4),
			ClusterCIDRs: []netip.Prefix{p("10.244.0.0/16")}, NodePortAddresses: []netip.Prefix{p("192.168.0.0/24")},
			Conntrack: &conntrack.Tuning{TCPEstablishedTimeout: time.Hour, TCPCloseWaitTimeout: time.Minute}},
		"ipvs": {Mode: ModeIPVS, HealthzBindAddress: "[::]:1", MetricsBindAddress: "[::1]:2", SyncPeriod: time.Minute, IPVSScheduler: "lc",
			MasqueradeBit: bit(15), ClusterCIDRs: []netip.Prefix{p("10.244.0.0/16"), p("fd00::/64")},
			IPVSExcludeCIDRs: []netip.Prefix{p("10.200.0.0/16"), p("fd00:200::/64")},
			IPVSTuning:       ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour, UDP: 10 * time.Second}},
			Conntrack:        &conntrack.Tuning{MaxPerCore: 100, Min: 5, TCPEstablishedTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 30 * time.Second}},
		"bridge": {Mode: ModeIPTables, HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "127.0.0.1:10249", SyncPeriod: time.Minute, MinSyncPeriod: time.Second,
			DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "cni0", InterfaceNamePrefix: "veth",
			Conntrack: &conntrack.Tuning{TCPEstablishedTimeout: time.Hour}},
		"nftables": {Mode: ModeNFTables, HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "0.0.0.0:9", NodePortPrimary: true,
			SyncPeriod: 45 * time.Second, MinSyncPeriod: 3 * time.Second, MasqueradeAll: true,
			Conntrack: &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := yaml.Marshal(c.Configuration())
			if err != nil {
				t.Fatal(err)
			}
			kc, err := Decode(data)
			if err != nil {
				t.Fatalf("%v\n%s", err, data)
			}
			got, err := FromConfiguration(kc)
			if err != nil {
				t.Fatalf("%v\n%s", err, data)
			}
			if diff := cmp.Diff(c, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("read back (-written +read):\n%s\nfile:\n%s", diff, data)
			}
		})
	}
}
