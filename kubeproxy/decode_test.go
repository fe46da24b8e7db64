package kubeproxy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestDecode: Decode is strict and names the field at fault by its path.
func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       *kubeproxyconfig.KubeProxyConfiguration
		wantErr    string
	}{
		{name: "empty", data: " \n", wantErr: "the file is empty"},
		{name: "not an object", data: "- a\n", wantErr: "want a KubeProxyConfiguration object"},
		{name: "apiVersion", data: "apiVersion: v1\nkind: KubeProxyConfiguration\n", wantErr: `apiVersion: "v1", want "kubeproxy.config.k8s.io/v1alpha1"`},
		{name: "kind", data: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Pod\n", wantErr: `kind: "Pod", want KubeProxyConfiguration`},
		{name: "unknown field", data: header + "iptables:\n  minSyncPeriods: 1s\n", wantErr: `iptables.minSyncPeriods: unknown field`},
		{name: "duration", data: header + "iptables:\n  minSyncPeriod: soon\n", wantErr: `iptables.minSyncPeriod: "soon": time: invalid duration "soon"`},
		{name: "type", data: header + "nodePortAddresses: [1]\n", wantErr: `nodePortAddresses[0]: 1 is a number, want string`},
		{name: "defaults are not applied", data: header + "mode: ipvs\nipvs:\n  syncPeriod: 1m\n", want: &kubeproxyconfig.KubeProxyConfiguration{
			TypeMeta: metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
			Mode:     "ipvs",
			IPVS:     kubeproxyconfig.KubeProxyIPVSConfiguration{SyncPeriod: metav1.Duration{Duration: time.Minute}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.data))
			if diff := cmp.Diff(tc.wantErr, errString(err)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("configuration (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNodePortAddresses(t *testing.T) {
	for _, tc := range []struct {
		name        string
		list        []string
		want        []netip.Prefix
		wantPrimary bool
		wantErr     string
	}{
		{name: "none"},
		{name: "CIDRs, masked", list: []string{"192.168.0.7/24", "fd00::1/64"}, want: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("fd00::/64")}},
		{name: "all", list: []string{"all"}, want: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}},
		{name: "primary", list: []string{"primary"}, wantPrimary: true},
		{name: "primary with a CIDR", list: []string{"primary", "10.0.0.0/8"}, wantErr: `nodePortAddresses: this proxier takes "primary" alone, not with CIDRs or "all"`},
		{name: "localhost", list: []string{"10.0.0.0/8", "localhost"}, wantErr: `nodePortAddresses[1]: "localhost" is not supported; iptables.localhostNodePorts serves IPv4 node ports on localhost in iptables mode (nftables mode never serves node ports on localhost)`},
		{name: "not a CIDR", list: []string{"10.0.0.1"}, wantErr: `nodePortAddresses[0]: want a CIDR or one of primary, all: netip.ParsePrefix("10.0.0.1"): no '/'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, primary, err := NodePortAddresses(tc.list)
			if diff := cmp.Diff(tc.wantErr, errString(err)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("prefixes (-want +got):\n%s", diff)
			}
			if primary != tc.wantPrimary {
				t.Errorf("primary = %v, want %v", primary, tc.wantPrimary)
			}
		})
	}
}

func TestConntrackTuning(t *testing.T) {
	i32 := func(v int32) *int32 { return &v }
	d := func(v time.Duration) *metav1.Duration { return &metav1.Duration{Duration: v} }
	for _, tc := range []struct {
		name    string
		section kubeproxyconfig.KubeProxyConntrackConfiguration
		want    conntrack.Tuning
		wantErr string
	}{
		{name: "unset: kube-proxy's timeouts, nf_conntrack_max left alone",
			want: conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}},
		{name: "set", section: kubeproxyconfig.KubeProxyConntrackConfiguration{
			MaxPerCore: i32(1000), Min: i32(2000), TCPEstablishedTimeout: d(time.Hour), TCPCloseWaitTimeout: d(0),
			TCPBeLiberal: true, UDPTimeout: metav1.Duration{Duration: time.Second}, UDPStreamTimeout: metav1.Duration{Duration: time.Minute},
		}, want: conntrack.Tuning{MaxPerCore: 1000, Min: 2000, TCPEstablishedTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: time.Second, UDPStreamTimeout: time.Minute}},
		{name: "negative maxPerCore", section: kubeproxyconfig.KubeProxyConntrackConfiguration{MaxPerCore: i32(-1)},
			wantErr: "conntrack.maxPerCore: -1: must be greater than or equal to 0"},
		{name: "negative timeout", section: kubeproxyconfig.KubeProxyConntrackConfiguration{UDPTimeout: metav1.Duration{Duration: -time.Second}},
			wantErr: "conntrack.udpTimeout: -1s: must be greater than or equal to 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConntrackTuning(tc.section)
			if diff := cmp.Diff(tc.wantErr, errString(err)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tuning (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIPVSSettings(t *testing.T) {
	d := func(v time.Duration) metav1.Duration { return metav1.Duration{Duration: v} }
	for _, tc := range []struct {
		name        string
		section     kubeproxyconfig.KubeProxyIPVSConfiguration
		want        ipvsmode.Tuning
		wantExclude []netip.Prefix
		wantErr     string
	}{
		{name: "unset: nothing to set"},
		{name: "set", section: kubeproxyconfig.KubeProxyIPVSConfiguration{
			StrictARP: true, ExcludeCIDRs: []string{"10.0.0.1/8", "fd00::/64"},
			TCPTimeout: d(time.Hour), TCPFinTimeout: d(30 * time.Second), UDPTimeout: d(5 * time.Second),
		}, want: ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour, TCPFin: 30 * time.Second, UDP: 5 * time.Second}},
			wantExclude: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}},
		// kube-proxy hands the kernel whole seconds.
		{name: "fractions of a second are dropped", section: kubeproxyconfig.KubeProxyIPVSConfiguration{TCPTimeout: d(1500 * time.Millisecond), UDPTimeout: d(time.Millisecond)},
			want: ipvsmode.Tuning{Timeouts: ipvs.Timeouts{TCP: time.Second}}},
		{name: "negative tcpTimeout", section: kubeproxyconfig.KubeProxyIPVSConfiguration{TCPTimeout: d(-time.Second)},
			wantErr: "ipvs.tcpTimeout: -1s: must be greater than or equal to 0"},
		{name: "negative tcpFinTimeout", section: kubeproxyconfig.KubeProxyIPVSConfiguration{TCPFinTimeout: d(-time.Second)},
			wantErr: "ipvs.tcpFinTimeout: -1s: must be greater than or equal to 0"},
		{name: "negative udpTimeout", section: kubeproxyconfig.KubeProxyIPVSConfiguration{UDPTimeout: d(-time.Second)},
			wantErr: "ipvs.udpTimeout: -1s: must be greater than or equal to 0"},
		{name: "too long", section: kubeproxyconfig.KubeProxyIPVSConfiguration{UDPTimeout: d(100 * 365 * 24 * time.Hour)},
			wantErr: "ipvs.udpTimeout: 876000h0m0s: must be at most 2147483647s"},
		{name: "not a CIDR", section: kubeproxyconfig.KubeProxyIPVSConfiguration{ExcludeCIDRs: []string{"10.0.0.0/8", "10.1.0.1"}},
			wantErr: `ipvs.excludeCIDRs[1]: must be a valid CIDR: netip.ParsePrefix("10.1.0.1"): no '/'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, exclude, err := IPVSSettings(tc.section)
			if diff := cmp.Diff(tc.wantErr, errString(err)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tuning (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantExclude, exclude, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("excluded CIDRs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUnsupported(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		want []string
	}{
		{name: "kubeadm's default", data: header + "bindAddress: 0.0.0.0\ndetectLocalMode: ClusterCIDR\nlogging:\n  format: text\n"},
		{name: "set", data: header + "bindAddress: 10.0.0.1\nfeatureGates: {A: true}\noomScoreAdj: -999\nportRange: 1-2\n",
			want: []string{"featureGates", "bindAddress", "oomScoreAdj", "portRange"}},
		{name: "local detection", data: header + "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\n  bridgeInterface: cni0\n"},
		{name: "another mode's section is not read", data: header + "ipvs:\n  strictARP: true\n"},
		{name: "the ipvs section is implemented", data: header + "mode: ipvs\nipvs:\n  strictARP: true\n  excludeCIDRs: [10.0.0.0/8]\n  tcpTimeout: 1m\n  tcpFinTimeout: 1m\n  udpTimeout: 1m\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Decode([]byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, Unsupported(cfg)); diff != "" {
				t.Errorf("unsupported fields (-want +got):\n%s", diff)
			}
		})
	}
}
