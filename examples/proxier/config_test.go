package main

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxy"
)

// kubeadmDefaults are the options from the configuration kubeadm writes
// by default (testdata/config/kubeadm-default.yaml): kube-proxy's
// defaults, and the kubeconfig kubeadm mounts.
func kubeadmDefaults(file string) options {
	o := flagDefaults()
	o.config = file
	o.kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
	o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}
	return o
}

func TestConfigFile(t *testing.T) {
	const (
		kubeadm     = "testdata/config/kubeadm-default.yaml"
		ipvsFile    = "testdata/config/ipvs.yaml"
		unsupported = "testdata/config/unsupported.yaml"
		nftFile     = "testdata/config/nftables.yaml"
	)
	nftAll := configWith(t, nftFile, "nodePortAddresses: null", "nodePortAddresses: [all]")
	unsupportedIPTables := configWith(t, unsupported, "mode: ipvs", "mode: iptables")
	ipvsSettings := configWith(t, ipvsFile, "  excludeCIDRs: null", "  excludeCIDRs: [10.200.0.1/16, 'fd00:200::/64']",
		"  strictARP: false", "  strictARP: true", "  tcpTimeout: 0s", "  tcpTimeout: 1h", "  tcpFinTimeout: 0s", "  tcpFinTimeout: 30s",
		"  udpTimeout: 0s", "  udpTimeout: 10.5s")
	bridgeFile := configWith(t, kubeadm, `  bridgeInterface: ""`, "  bridgeInterface: cni0", `detectLocalMode: ""`, "detectLocalMode: BridgeInterface")
	with := func(file string, f func(*options)) *options {
		o := kubeadmDefaults(file)
		f(&o)
		return &o
	}
	bit15 := 15
	ipvsWant := func(o *options) {
		o.mode = modeIPVS
		o.clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
		// IPVS mode's sync periods are the ipvs section's, and
		// kube-proxy leaves its minSyncPeriod at 0 when unset; the
		// iptables section's syncPeriod is not read.
		o.syncPeriod, o.minSyncPeriod = time.Minute, 0
		// masqueradeAll and masqueradeBit are read from the iptables
		// section in both modes.
		o.masqueradeAll, o.masqueradeBit = true, &bit15
		o.nodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("fd00:192::/64")}
		o.metricsBindAddress = "0.0.0.0:10249"
		o.client = clientSettings{QPS: 50, Burst: 100}
		o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 2 * time.Hour, TCPCloseWaitTimeout: time.Hour, UDPTimeout: 45 * time.Second}
		o.ipvsScheduler = "lc"
	}
	for _, tc := range []struct {
		name string
		args []string
		want *options
	}{
		{
			name: "kubeadm's default",
			args: []string{"--config", kubeadm},
			want: with(kubeadm, func(*options) {}),
		},
		{
			// As kubeadm's DaemonSet runs kube-proxy.
			name: "kubeadm's DaemonSet command",
			args: []string{"--config=" + kubeadm, "--hostname-override=node-a"},
			want: with(kubeadm, func(o *options) { o.hostnameOverride = "node-a" }),
		},
		{
			// kube-proxy ignores the flags that fill the file's fields.
			name: "an empty address in the file is the default, and a flag beside the file is ignored",
			args: []string{"--config", kubeadm, "--healthz-bind-address", ""},
			want: with(kubeadm, func(o *options) { o.ignoredFlags = []string{"--healthz-bind-address"} }),
		},
		{
			name: "ipvs mode",
			args: []string{"--config", ipvsFile},
			want: with(ipvsFile, ipvsWant),
		},
		{
			name: "ipvs mode: excludeCIDRs, strictARP and the timeouts",
			args: []string{"--config", ipvsSettings},
			want: with(ipvsSettings, func(o *options) {
				ipvsWant(o)
				o.ipvsExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16"), netip.MustParsePrefix("fd00:200::/64")}
				// Whole seconds, as kube-proxy hands them to the kernel.
				o.ipvsTuning = ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour, TCPFin: 30 * time.Second, UDP: 10 * time.Second}}
			}),
		},
		{
			// nftables mode reads the nftables section's periods and
			// masquerading, and serves node ports on the node's own
			// addresses by default, as kube-proxy.
			name: "nftables mode",
			args: []string{"--config", nftFile},
			want: with(nftFile, func(o *options) {
				bit16 := 16
				o.mode, o.syncPeriod, o.minSyncPeriod = modeNFTables, 45*time.Second, 2*time.Second
				o.masqueradeAll, o.masqueradeBit = true, &bit16
				o.nodePortPrimary = true
			}),
		},
		{
			name: "nftables mode, nodePortAddresses all",
			args: []string{"--config", nftAll},
			want: with(nftAll, func(o *options) {
				bit16 := 16
				o.mode, o.syncPeriod, o.minSyncPeriod = modeNFTables, 45*time.Second, 2*time.Second
				o.masqueradeAll, o.masqueradeBit = true, &bit16
				o.nodePortAddresses = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
			}),
		},
		{
			// As in kube-proxy, the file wins over the flags that fill
			// its fields, before or after --config; they are named for
			// a warning. --hostname-override and -v win over the file.
			name: "flags beside the file are ignored",
			args: []string{"--mode", "iptables", "--config", ipvsFile, "--min-sync-period", "2s", "--masquerade-all=false",
				"--nodeport-addresses", "primary", "--kubeconfig", "/etc/other.conf", "--cluster-cidr", "10.0.0.0/8",
				"--hostname-override", "node-b", "--iptables-drift-check-period", "1m"},
			want: with(ipvsFile, func(o *options) {
				ipvsWant(o)
				o.hostnameOverride, o.driftCheckPeriod = "node-b", time.Minute
				o.ignoredFlags = []string{"--cluster-cidr", "--kubeconfig", "--masquerade-all", "--min-sync-period", "--mode", "--nodeport-addresses"}
			}),
		},
		{
			name: "detectLocalMode and detectLocal",
			args: []string{"--config", bridgeFile},
			want: with(bridgeFile, func(o *options) { o.detectLocalMode, o.bridgeInterface = proxy.LocalModeBridgeInterface, "cni0" }),
		},
		{
			name: "unsupported fields",
			args: []string{"--config", unsupported},
			want: with(unsupported, func(o *options) {
				o.mode = modeIPVS
				o.minSyncPeriod = 0
				o.ipvsTuning.StrictARP = true
				// detectLocalMode NodeCIDR is read now.
				o.detectLocalMode = proxy.LocalModeNodeCIDR
				o.unsupported = []string{"featureGates", "logging.format", "logging.flushFrequency", "bindAddress", "enableProfiling",
					"winkernel", "oomScoreAdj", "configSyncPeriod"}
			}),
		},
		{
			// kube-proxy reads only the running mode's section.
			name: "the ipvs section is not read in iptables mode",
			args: []string{"--config", unsupportedIPTables},
			want: with(unsupportedIPTables, func(o *options) {
				o.detectLocalMode = proxy.LocalModeNodeCIDR
				o.unsupported = []string{"featureGates", "logging.format", "logging.flushFrequency", "bindAddress", "enableProfiling",
					"winkernel", "oomScoreAdj", "configSyncPeriod"}
			}),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOptions(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(options{}), cmpopts.IgnoreFields(options{}, "names"),
				cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConfigFileInvalid checks that a bad file fails and that the error
// names the field.
func TestConfigFileInvalid(t *testing.T) {
	base, err := os.ReadFile("testdata/config/kubeadm-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// edit replaces one line of kubeadm's default.
	edit := func(old, new string) string {
		if !strings.Contains(string(base), old+"\n") {
			t.Fatalf("kubeadm-default.yaml has no line %q", old)
		}
		return strings.Replace(string(base), old+"\n", new+"\n", 1)
	}
	for _, tc := range []struct {
		name, file string
		args       []string
		wantErr    string
	}{
		{name: "negative minSyncPeriod", file: edit("  minSyncPeriod: 0s", "  minSyncPeriod: -1s"),
			wantErr: "iptables.minSyncPeriod: -1s: must be greater than or equal to 0"},
		{name: "minSyncPeriod over syncPeriod", file: edit("  minSyncPeriod: 0s", "  minSyncPeriod: 1m"),
			wantErr: "iptables.minSyncPeriod: 1m0s: must not be longer than iptables.syncPeriod (30s)"},
		{name: "duplicate field", file: string(base) + "mode: ipvs\n", wantErr: `"mode"`},
		{name: "unknown field in ipvs", file: edit("  scheduler: \"\"", "  scheduler: \"\"\n  x: 1"),
			wantErr: `ipvs.x: unknown field`},
		{name: "unknown field", file: edit("  masqueradeAll: false", "  masqueradeAll: false\n  masqueradeAl: true"),
			wantErr: `iptables.masqueradeAl: unknown field`},
		{name: "unknown top-level field", file: string(base) + "proxyMode: ipvs\n", wantErr: "proxyMode: unknown field"},
		{name: "wrong type", file: edit("  masqueradeAll: false", `  masqueradeAll: "yes"`),
			wantErr: `iptables.masqueradeAll: "yes" is a string, want bool`},
		{name: "wrong type in a list", file: edit("nodePortAddresses: null", "nodePortAddresses: [10.0.0.0/8, 1]"),
			wantErr: "nodePortAddresses[1]: 1 is a number, want string"},
		{name: "negative verbosity", file: edit("  verbosity: 0", "  verbosity: -1"),
			wantErr: "logging.verbosity: -1 is a number, want v1.VerbosityLevel"},
		{name: "bad duration", file: edit("  tcpFinTimeout: 0s", "  tcpFinTimeout: soon"),
			wantErr: `ipvs.tcpFinTimeout: "soon": time: invalid duration`},
		{name: "masqueradeBit", file: edit("  masqueradeBit: null", "  masqueradeBit: 32"),
			wantErr: "iptables.masqueradeBit: 32: must be within the range [0, 31]"},
		{name: "clusterCIDR", file: edit(`clusterCIDR: ""`, "clusterCIDR: 10.244.0.0"), wantErr: "clusterCIDR: "},
		{name: "two clusterCIDRs of a family", file: edit(`clusterCIDR: ""`, "clusterCIDR: 10.244.0.0/16,10.245.0.0/16"),
			wantErr: "clusterCIDR: 10.244.0.0/16 and 10.245.0.0/16 are both IPv4"},
		{name: "nodePortAddresses", file: edit("nodePortAddresses: null", "nodePortAddresses: [10.0.0.0/8, nodes]"),
			wantErr: "nodePortAddresses[1]: want a CIDR"},
		{name: "nodePortAddresses localhost", file: edit("nodePortAddresses: null", "nodePortAddresses: [localhost]"),
			wantErr: `nodePortAddresses[0]: "localhost" is not supported`},
		{name: "healthzBindAddress", file: edit(`healthzBindAddress: ""`, "healthzBindAddress: localhost:10256"),
			wantErr: "healthzBindAddress"},
		{name: "mode", file: edit(`mode: ""`, "mode: kernelspace"), wantErr: `mode: "kernelspace" is not a mode this proxier has`},
		{name: "detectLocalMode BridgeInterface without a bridge", file: edit(`detectLocalMode: ""`, "detectLocalMode: BridgeInterface"),
			wantErr: "detectLocal.bridgeInterface: interface name must not be empty"},
		{name: "detectLocal.interfaceNamePrefix not an interface name", file: edit(`  interfaceNamePrefix: ""`, `  interfaceNamePrefix: "veth;"`),
			wantErr: `detectLocal.interfaceNamePrefix: interface name "veth;" has a character other than`},
		{name: "nftables.masqueradeBit", file: strings.Replace(edit(`mode: ""`, "mode: nftables"),
			"nftables:\n  masqueradeAll: false\n  masqueradeBit: null\n", "nftables:\n  masqueradeAll: false\n  masqueradeBit: 32\n", 1),
			wantErr: "nftables.masqueradeBit: 32: must be within the range [0, 31]"},
		{name: "nftables.minSyncPeriod", file: strings.Replace(edit(`mode: ""`, "mode: nftables"),
			"  minSyncPeriod: 0s\n  syncPeriod: 0s\nnodePortAddresses", "  minSyncPeriod: 1m\n  syncPeriod: 0s\nnodePortAddresses", 1),
			wantErr: "nftables.minSyncPeriod: 1m0s: must not be longer than nftables.syncPeriod (30s)"},
		{name: "ipvs.scheduler", file: strings.Replace(edit(`  scheduler: ""`, "  scheduler: fastest"), "mode: \"\"\n", "mode: ipvs\n", 1),
			wantErr: "ipvs.scheduler: unknown IPVS scheduler \"fastest\""},
		{name: "ipvs.tcpTimeout", file: strings.Replace(edit("  tcpTimeout: 0s", "  tcpTimeout: -1s"), "mode: \"\"\n", "mode: ipvs\n", 1),
			wantErr: "ipvs.tcpTimeout: -1s: must be greater than or equal to 0"},
		{name: "ipvs.excludeCIDRs", file: strings.Replace(edit("  excludeCIDRs: null", "  excludeCIDRs: [10.0.0.0/8, 10.1.0.1]"), "mode: \"\"\n", "mode: ipvs\n", 1),
			wantErr: "ipvs.excludeCIDRs[1]: must be a valid CIDR"},
		{name: "conntrack.min", file: edit("  min: null", "  min: -1"), wantErr: "conntrack.min: -1: must be greater than or equal to 0"},
		{name: "apiVersion", file: edit("apiVersion: kubeproxy.config.k8s.io/v1alpha1", "apiVersion: kubeproxy.config.k8s.io/v1beta1"),
			wantErr: `apiVersion: "kubeproxy.config.k8s.io/v1beta1", want "kubeproxy.config.k8s.io/v1alpha1"`},
		{name: "kind", file: edit("kind: KubeProxyConfiguration", "kind: KubeletConfiguration"), wantErr: `kind: "KubeletConfiguration"`},
		{name: "empty", file: "\n", wantErr: "the file is empty"},
		{name: "not an object", file: "- a\n", wantErr: "want a KubeProxyConfiguration object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.conf")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := parseOptions(append([]string{"--config", path}, tc.args...), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := parseOptions([]string{"--config", "testdata/config/no-such-file"}, io.Discard); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: got %v, want os.ErrNotExist", err)
	}
}

// TestConfigFileVerbosity checks that logging.verbosity sets klog's
// verbosity, and that -v wins over it; klog's verbosity is global, so the
// test puts it back.
func TestConfigFileVerbosity(t *testing.T) {
	t.Cleanup(func() {
		if _, err := parseOptions([]string{"-v", "0"}, io.Discard); err != nil {
			t.Error(err)
		}
	})
	path := kubeadmConfigWith(t, "  verbosity: 0", "  verbosity: 3")
	for _, tc := range []struct {
		args []string
		want klog.Level
	}{
		{args: []string{"--config", path}, want: 3},
		{args: []string{"-v", "1", "--config", path}, want: 1},
	} {
		if _, err := parseOptions(tc.args, io.Discard); err != nil {
			t.Fatal(err)
		}
		if !klog.V(tc.want).Enabled() || klog.V(tc.want+1).Enabled() {
			t.Errorf("%q: V(%d) enabled %v, V(%d) enabled %v; want true, false", tc.args, tc.want, klog.V(tc.want).Enabled(), tc.want+1, klog.V(tc.want+1).Enabled())
		}
	}
}

// TestConfigFileIPv6BindAddress checks kube-proxy's defaulting of the
// servers' addresses to the family of an (unspecified) IPv6 bindAddress,
// which is then not reported as unsupported.
func TestConfigFileIPv6BindAddress(t *testing.T) {
	path := kubeadmConfigWith(t, "bindAddress: 0.0.0.0", "bindAddress: '::'")
	got, err := parseOptions([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := kubeadmDefaults(path)
	want.healthzBindAddress, want.metricsBindAddress = "[::]:10256", "[::1]:10249"
	if diff := cmp.Diff(&want, got, cmp.AllowUnexported(options{}), cmpopts.IgnoreFields(options{}, "names")); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
}

// TestConfigFileDryRun checks that the file's settings that have no flag
// reach the rules: the masquerade bit in both modes, and the scheduler of
// IPVS mode's virtual servers.
func TestConfigFileDryRun(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want []string
	}{
		{modeIPTables, []string{"-A KUBE-MARK-MASQ -j MARK --or-mark 0x00008000\n"}},
		{modeIPVS, []string{"-A KUBE-MARK-MASQ -j MARK --or-mark 0x00008000\n", "TCP 10.96.0.53:53 lc bound\n"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			path := kubeadmConfigWith(t, "  masqueradeBit: null", "  masqueradeBit: 15", "  scheduler: \"\"", "  scheduler: lc", `mode: ""`, "mode: "+tc.mode)
			var out bytes.Buffer
			args := append(demoArgs(t, demoCommand, true), "--config", path)
			if log, err := runArgs(t, dryRunEnvironment(t, &out), args...); err != nil {
				t.Fatalf("dry run: %v\n%s", err, log)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("the dry run does not show %q:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "0x00004000") || strings.Contains(out.String(), " rr ") {
				t.Errorf("the dry run still shows the default mark or scheduler:\n%s", out.String())
			}
		})
	}
}

// TestConfigFileOnFakeNode runs IPVS mode from testdata/config/ipvs.yaml
// on the fakes: the kernel check asks for ipvs.scheduler's module, the
// virtual servers use that scheduler, and the conntrack section's
// timeouts are set.
func TestConfigFileOnFakeNode(t *testing.T) {
	node := newFakeNode(t).withIPVS(t)
	args := []string{"--config", "testdata/config/ipvs.yaml", "--once", "--manifests", "testdata", "--hostname-override", "node-a"}
	log, err := runArgs(t, node.environment(t, io.Discard), args...)
	var missing *kernel.IPVSUnavailableError
	if !errors.As(err, &missing) || !slices.Equal(missing.Schedulers, []string{"ip_vs_lc"}) {
		t.Fatalf("on a kernel without ip_vs_lc: got %v, want the kernel check's refusal naming ip_vs_lc\n%s", err, log)
	}

	v, err := kernel.ParseVersion("6.1.0")
	if err != nil {
		t.Fatal(err)
	}
	kernelTree(t, node.root, append(kernel.RequiredIPVSModules(v), append(kernel.IPSetModules(), "ip_vs_lc")...))
	// The kernel's default, which the file changes.
	if err := os.WriteFile(filepath.Join(node.root, "proc/sys/net/netfilter/nf_conntrack_udp_timeout"), []byte("30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if log, err := runArgs(t, node.environment(t, io.Discard), args...); err != nil {
		t.Fatalf("--once: %v\n%s", err, log)
	}
	if want := "TCP 10.96.0.10:80 lc\n"; !strings.Contains(node.lb.Dump(), want) {
		t.Errorf("virtual servers do not show %q:\n%s", want, node.lb.Dump())
	}
	for name, want := range map[string]string{
		"net/netfilter/nf_conntrack_tcp_timeout_established": "7200",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
		"net/netfilter/nf_conntrack_udp_timeout":             "45",
	} {
		if got := readSysctl(t, node.root, name); got != want {
			t.Errorf("sysctl %s = %s, want %s", name, got, want)
		}
	}
}

// kubeadmConfigWith writes kubeadm's default configuration with lines
// replaced (old, new, old, new, ...; the first match of each) to a
// temporary file, and returns its path.
func kubeadmConfigWith(t *testing.T, replace ...string) string {
	t.Helper()
	return configWith(t, "testdata/config/kubeadm-default.yaml", replace...)
}

// configWith writes the file base with lines replaced (old, new, ...) to a
// temporary file, and returns its path.
func configWith(t *testing.T, base string, replace ...string) string {
	t.Helper()
	data, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	file := string(data)
	for i := 0; i+1 < len(replace); i += 2 {
		if !strings.Contains(file, replace[i]+"\n") {
			t.Fatalf("%s has no line %q", base, replace[i])
		}
		file = strings.Replace(file, replace[i]+"\n", replace[i+1]+"\n", 1)
	}
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestWarnUnsupported checks that the ignored fields are named in one
// warning, and that a file without any gives none.
func TestWarnUnsupported(t *testing.T) {
	for _, tc := range []struct {
		file string
		want int
	}{{"testdata/config/unsupported.yaml", 1}, {"testdata/config/kubeadm-default.yaml", 0}} {
		o, err := parseOptions([]string{"--config", tc.file}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var log logBuffer
		warnUnsupported(klog.FromContext(testLogger(&log, 0)), o)
		got := log.String()
		if n := strings.Count(got, "Warning:"); n != tc.want {
			t.Errorf("%s: %d warnings, want %d:\n%s", tc.file, n, tc.want, got)
		}
		for _, field := range o.unsupported {
			if !strings.Contains(got, `"`+field+`"`) {
				t.Errorf("%s: the warning does not name %s:\n%s", tc.file, field, got)
			}
		}
	}
}
