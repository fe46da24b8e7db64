package main

import (
	"errors"
	"flag"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/kubeproxy"
	"github.com/proxykit/proxykit/proxy"
)

// kubeProxyV137Flags are the flags kube-proxy v1.37.2 registers on Linux
// (cmd/kube-proxy/app/options.go AddFlags, the logging flags of
// component-base, and --version), but --help.
var kubeProxyV137Flags = []string{
	"config", "write-config-to", "cleanup", "feature-gates", "kubeconfig", "master", "kube-api-content-type",
	"kube-api-burst", "kube-api-qps", "hostname-override", "bind-address", "healthz-bind-address",
	"metrics-bind-address", "bind-address-hard-fail", "profiling", "show-hidden-metrics-for-version", "init-only",
	"proxy-mode", "iptables-masquerade-bit", "masquerade-all", "iptables-localhost-nodeports",
	"iptables-sync-period", "iptables-min-sync-period", "ipvs-sync-period", "ipvs-min-sync-period",
	"ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp", "ipvs-tcp-timeout", "ipvs-tcpfin-timeout",
	"ipvs-udp-timeout", "detect-local-mode", "pod-bridge-interface", "pod-interface-name-prefix", "cluster-cidr",
	"nodeport-addresses", "oom-score-adj", "conntrack-max-per-core", "conntrack-min",
	"conntrack-tcp-timeout-established", "conntrack-tcp-timeout-close-wait", "conntrack-tcp-be-liberal",
	"conntrack-udp-timeout", "conntrack-udp-timeout-stream", "config-sync-period", "healthz-port", "metrics-port",
	"logging-format", "log-flush-frequency", "v", "vmodule", "log-text-split-stream", "log-text-info-buffer-size",
	"log-json-split-stream", "log-json-info-buffer-size", "version",
}

// flagCase is one command line of a flag's row: the options it gives,
// as a change to the defaults, or the error it fails with.
type flagCase struct {
	args    []string
	set     func(*options)
	wantErr string
}

func ptrInt(i int) *int { return &i }

// flagCases has at least one case per row of flagTable.
var flagCases = map[string][]flagCase{
	"config":          {{args: []string{"--config", "testdata/config/kubeadm-default.yaml"}, set: func(o *options) { *o = kubeadmDefaults("testdata/config/kubeadm-default.yaml") }}},
	"write-config-to": {{args: []string{"--write-config-to", "/tmp/x.yaml"}, set: func(o *options) { o.writeConfigTo = "/tmp/x.yaml" }}},
	"cleanup":         {{args: []string{"--cleanup"}, set: func(o *options) { o.cleanup = true }}},
	"init-only":       {{args: []string{"--init-only"}, set: func(o *options) { o.initOnly = true }}},
	"version":         {{args: []string{"--version"}, wantErr: flag.ErrHelp.Error()}},
	"feature-gates": {
		{args: []string{"--feature-gates", "NFTablesProxyMode=true"}, wantErr: "--feature-gates=NFTablesProxyMode=true: featureGates: not implemented"},
		{args: []string{"--feature-gates", ""}, set: func(*options) {}},
	},
	"kubeconfig":            {{args: []string{"--kubeconfig", "/etc/k.conf"}, set: func(o *options) { o.kubeconfig = "/etc/k.conf" }}},
	"master":                {{args: []string{"--master", "https://10.0.0.1:6443"}, set: func(o *options) { o.master = "https://10.0.0.1:6443" }}},
	"kube-api-content-type": {{args: []string{"--kube-api-content-type", "application/json"}, set: func(o *options) { o.client.ContentType = "application/json" }}},
	"kube-api-burst": {
		{args: []string{"--kube-api-burst", "20"}, set: func(o *options) { o.client.Burst = 20 }},
		{args: []string{"--kube-api-burst", "-1"}, wantErr: "--kube-api-burst=-1: clientConnection.burst: must not be negative"},
	},
	"kube-api-qps": {
		{args: []string{"--kube-api-qps", "7.5"}, set: func(o *options) { o.client.QPS = 7.5 }},
		{args: []string{"--kube-api-qps", "-1"}, wantErr: "--kube-api-qps=-1: clientConnection.qps: must not be negative"},
	},
	"hostname-override": {{args: []string{"--hostname-override", "node-b"}, set: func(o *options) { o.hostnameOverride = "node-b" }}},
	"bind-address": {
		{args: []string{"--bind-address", "::"}, set: func(*options) {}},
		{args: []string{"--bind-address", "10.0.0.5"}, wantErr: "--bind-address=10.0.0.5: bindAddress: not implemented: this proxier takes the node's IPs from its Node object"},
		{args: []string{"--bind-address", "x"}, wantErr: "--bind-address=x: bindAddress: want an IP address"},
	},
	"healthz-bind-address": {
		{args: []string{"--healthz-bind-address", "10.0.0.5:1"}, set: func(o *options) { o.healthzBindAddress = "10.0.0.5:1" }},
		{args: []string{"--healthz-bind-address", ""}, set: func(o *options) { o.healthzBindAddress = "" }},
	},
	"metrics-bind-address":   {{args: []string{"--metrics-bind-address", "0.0.0.0:9"}, set: func(o *options) { o.metricsBindAddress = "0.0.0.0:9" }}},
	"bind-address-hard-fail": {{args: []string{"--bind-address-hard-fail"}, set: func(*options) {}}},
	"profiling": {
		{args: []string{"--profiling"}, wantErr: "--profiling=true: enableProfiling: not implemented: no /debug/pprof handler"},
		{args: []string{"--profiling=false"}, set: func(*options) {}},
	},
	"show-hidden-metrics-for-version": {{args: []string{"--show-hidden-metrics-for-version", "1.36"}, wantErr: "--show-hidden-metrics-for-version=1.36: showHiddenMetricsForVersion: not implemented"}},
	"proxy-mode": {
		{args: []string{"--proxy-mode", "ipvs"}, set: func(o *options) { o.mode = modeIPVS }},
		{args: []string{"--proxy-mode", "kernelspace"}, wantErr: `--mode "kernelspace"`},
	},
	"mode": {
		{args: []string{"--mode", "nftables"}, set: func(o *options) { o.mode, o.nodePortPrimary = modeNFTables, true }},
		{args: []string{"--mode", "ebpf"}, wantErr: "--mode ebpf needs --ebpf-cgroup-path"},
	},
	"iptables-masquerade-bit": {
		{args: []string{"--iptables-masquerade-bit", "15"}, set: func(o *options) { o.masqueradeBit = ptrInt(15) }},
		{args: []string{"--iptables-masquerade-bit", "15", "--proxy-mode", "ipvs"}, set: func(o *options) { o.masqueradeBit, o.mode = ptrInt(15), modeIPVS }},
		{args: []string{"--iptables-masquerade-bit", "15", "--proxy-mode", "nftables"}, set: func(o *options) { o.mode, o.nodePortPrimary = modeNFTables, true }},
		{args: []string{"--iptables-masquerade-bit", "32"}, wantErr: "--iptables-masquerade-bit=32: iptables.masqueradeBit: must be within the range [0, 31]"},
	},
	"masquerade-all":               {{args: []string{"--masquerade-all"}, set: func(o *options) { o.masqueradeAll = true }}},
	"iptables-localhost-nodeports": {{args: []string{"--iptables-localhost-nodeports=false"}, set: func(o *options) { o.localhostNodePorts = false }}},
	"iptables-sync-period": {
		{args: []string{"--iptables-sync-period", "1m"}, set: func(o *options) { o.syncPeriod = time.Minute }},
		{args: []string{"--iptables-sync-period", "1m", "--proxy-mode", "ipvs"}, set: func(o *options) { o.mode = modeIPVS }},
		{args: []string{"--iptables-sync-period", "0s"}, wantErr: "--iptables-sync-period=0s: iptables.syncPeriod: must be greater than 0"},
	},
	"iptables-min-sync-period": {
		{args: []string{"--iptables-min-sync-period", "2s", "--proxy-mode", "nftables"}, set: func(o *options) {
			o.minSyncPeriod, o.mode, o.nodePortPrimary = 2*time.Second, modeNFTables, true
		}},
		{args: []string{"--iptables-min-sync-period", "1h"}, wantErr: "--iptables-min-sync-period=1h0m0s: iptables.minSyncPeriod: must be between 0 and the sync period (30s)"},
	},
	"ipvs-sync-period": {
		{args: []string{"--ipvs-sync-period", "1m", "--proxy-mode", "ipvs"}, set: func(o *options) { o.syncPeriod, o.mode = time.Minute, modeIPVS }},
		{args: []string{"--ipvs-sync-period", "1m"}, set: func(*options) {}},
	},
	"ipvs-min-sync-period": {{args: []string{"--ipvs-min-sync-period", "0s", "--proxy-mode", "ipvs"}, set: func(o *options) { o.minSyncPeriod, o.mode = 0, modeIPVS }}},
	"sync-period":          {{args: []string{"--sync-period", "5s"}, set: func(o *options) { o.syncPeriod = 5 * time.Second }}},
	"min-sync-period":      {{args: []string{"--min-sync-period", "0s"}, set: func(o *options) { o.minSyncPeriod = 0 }}},
	"ipvs-scheduler": {
		{args: []string{"--ipvs-scheduler", "lc", "--proxy-mode", "ipvs"}, set: func(o *options) { o.ipvsScheduler, o.mode = "lc", modeIPVS }},
		{args: []string{"--ipvs-scheduler", "fastest", "--proxy-mode", "ipvs"}, wantErr: `--ipvs-scheduler=fastest: ipvs.scheduler: unknown IPVS scheduler "fastest"`},
	},
	"ipvs-exclude-cidrs": {
		{args: []string{"--ipvs-exclude-cidrs", "10.0.0.1/8, fd00::/64", "--proxy-mode", "ipvs"}, set: func(o *options) {
			o.ipvsExcludeCIDRs, o.mode = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}, modeIPVS
		}},
		{args: []string{"--ipvs-exclude-cidrs", "10.0.0.0/8,10.1.0.1", "--proxy-mode", "ipvs"}, wantErr: "--ipvs-exclude-cidrs=10.0.0.0/8,10.1.0.1: ipvs.excludeCIDRs[1]: must be a valid CIDR"},
		// kube-proxy reads the ipvs section in IPVS mode only.
		{args: []string{"--ipvs-exclude-cidrs", "nonsense"}, set: func(*options) {}},
	},
	"ipvs-strict-arp": {
		{args: []string{"--ipvs-strict-arp", "--proxy-mode", "ipvs"}, set: func(o *options) { o.ipvsTuning.StrictARP, o.mode = true, modeIPVS }},
		{args: []string{"--ipvs-strict-arp"}, set: func(*options) {}},
	},
	"ipvs-tcp-timeout": {
		{args: []string{"--ipvs-tcp-timeout", "1m", "--proxy-mode", "ipvs"}, set: func(o *options) { o.ipvsTuning.Timeouts.TCP, o.mode = time.Minute, modeIPVS }},
		// As kube-proxy hands the kernel whole seconds.
		{args: []string{"--ipvs-tcp-timeout", "2.5s", "--proxy-mode", "ipvs"}, set: func(o *options) { o.ipvsTuning.Timeouts.TCP, o.mode = 2*time.Second, modeIPVS }},
		{args: []string{"--ipvs-tcp-timeout", "-1s", "--proxy-mode", "ipvs"}, wantErr: "--ipvs-tcp-timeout=-1s: ipvs.tcpTimeout: -1s: must be greater than or equal to 0"},
		{args: []string{"--ipvs-tcp-timeout", "-1s"}, set: func(*options) {}},
	},
	"ipvs-tcpfin-timeout": {
		{args: []string{"--ipvs-tcpfin-timeout", "30s", "--proxy-mode", "ipvs"}, set: func(o *options) { o.ipvsTuning.Timeouts.TCPFin, o.mode = 30*time.Second, modeIPVS }},
		{args: []string{"--ipvs-tcpfin-timeout", "-1s", "--proxy-mode", "ipvs"}, wantErr: "--ipvs-tcpfin-timeout=-1s: ipvs.tcpFinTimeout: -1s: must be greater than or equal to 0"},
	},
	"ipvs-udp-timeout": {
		{args: []string{"--ipvs-udp-timeout", "10s", "--proxy-mode", "ipvs"}, set: func(o *options) { o.ipvsTuning.Timeouts.UDP, o.mode = 10*time.Second, modeIPVS }},
		{args: []string{"--ipvs-udp-timeout", "-1s", "--proxy-mode", "ipvs"}, wantErr: "--ipvs-udp-timeout=-1s: ipvs.udpTimeout: -1s: must be greater than or equal to 0"},
	},
	"detect-local-mode": {
		{args: []string{"--detect-local-mode", "ClusterCIDR"}, set: func(*options) {}},
		{args: []string{"--detect-local-mode", "NodeCIDR"}, set: func(o *options) { o.detectLocalMode = proxy.LocalModeNodeCIDR }},
		{args: []string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"}, set: func(o *options) {
			o.detectLocalMode, o.bridgeInterface = proxy.LocalModeBridgeInterface, "cbr0"
		}},
		{args: []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth"}, set: func(o *options) {
			o.detectLocalMode, o.interfaceNamePrefix = proxy.LocalModeInterfaceNamePrefix, "veth"
		}},
		{args: []string{"--detect-local-mode", "PodCIDR"}, wantErr: "--detect-local-mode=PodCIDR: detectLocalMode: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix"},
		{args: []string{"--detect-local-mode", "BridgeInterface"}, wantErr: "--detect-local-mode=BridgeInterface: detectLocalMode: needs --pod-bridge-interface"},
		{args: []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-bridge-interface", "cbr0"}, wantErr: "--detect-local-mode=InterfaceNamePrefix: detectLocalMode: needs --pod-interface-name-prefix"},
	},
	"pod-bridge-interface": {
		{args: []string{"--pod-bridge-interface", "cbr0"}, set: func(o *options) { o.bridgeInterface = "cbr0" }},
		{args: []string{"--pod-bridge-interface", "cbr0 -j ACCEPT", "--detect-local-mode", "BridgeInterface"},
			wantErr: `--pod-bridge-interface=cbr0 -j ACCEPT: detectLocal.bridgeInterface: interface name "cbr0 -j ACCEPT" has a character other than`},
	},
	"pod-interface-name-prefix": {
		{args: []string{"--pod-interface-name-prefix", "veth"}, set: func(o *options) { o.interfaceNamePrefix = "veth" }},
		{args: []string{"--pod-interface-name-prefix", "veth+"}, wantErr: `--pod-interface-name-prefix=veth+: detectLocal.interfaceNamePrefix: interface name "veth+" has a character`},
		{args: []string{"--pod-interface-name-prefix", "abcdefghijklmno"}, wantErr: `detectLocal.interfaceNamePrefix: interface name prefix "abcdefghijklmno" is too long`},
	},
	"cluster-cidr": {
		{args: []string{"--cluster-cidr", "10.244.0.0/16"}, set: func(o *options) { o.clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")} }},
		{args: []string{"--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"}, wantErr: "at most one per IP family"},
	},
	"nodeport-addresses": {
		{args: []string{"--nodeport-addresses", "all"}, set: func(o *options) {
			o.nodePortAddresses = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
		}},
		{args: []string{"--nodeport-addresses", "primary"}, set: func(o *options) { o.nodePortPrimary = true }},
		{args: []string{"--nodeport-addresses", "localhost"}, wantErr: `--nodeport-addresses: nodePortAddresses[0]: "localhost" is not supported`},
	},
	"oom-score-adj": {
		{args: []string{"--oom-score-adj", "-999"}, set: func(*options) {}},
		{args: []string{"--oom-score-adj", "-500"}, wantErr: "--oom-score-adj=-500: oomScoreAdj: not implemented"},
	},
	"conntrack-max-per-core": {{args: []string{"--conntrack-max-per-core", "100"}, set: func(o *options) {
		o.conntrack = &conntrack.Tuning{MaxPerCore: 100, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}
	}}},
	"conntrack-min": {
		{args: []string{"--conntrack-min", "5", "--conntrack-max-per-core", "1"}, set: func(o *options) {
			o.conntrack = &conntrack.Tuning{MaxPerCore: 1, Min: 5, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}
		}},
		{args: []string{"--conntrack-min", "-5"}, wantErr: "--conntrack-min=-5: conntrack.min: must be greater than or equal to 0"},
	},
	"conntrack-tcp-timeout-established": {{args: []string{"--conntrack-tcp-timeout-established", "1h"}, set: func(o *options) {
		o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: time.Hour, TCPCloseWaitTimeout: time.Hour}
	}}},
	"conntrack-tcp-timeout-close-wait": {{args: []string{"--conntrack-tcp-timeout-close-wait", "0s"}, set: func(o *options) {
		o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour}
	}}},
	"conntrack-tcp-be-liberal": {{args: []string{"--conntrack-tcp-be-liberal"}, set: func(o *options) {
		o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true}
	}}},
	"conntrack-udp-timeout": {{args: []string{"--conntrack-udp-timeout", "30s"}, set: func(o *options) {
		o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour, UDPTimeout: 30 * time.Second}
	}}},
	"conntrack-udp-timeout-stream": {{args: []string{"--conntrack-udp-timeout-stream", "2m"}, set: func(o *options) {
		o.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour, UDPStreamTimeout: 2 * time.Minute}
	}}},
	"config-sync-period": {
		{args: []string{"--config-sync-period", "15m"}, set: func(*options) {}},
		{args: []string{"--config-sync-period", "1m"}, wantErr: "--config-sync-period=1m0s: configSyncPeriod: not implemented"},
	},
	"healthz-port": {
		{args: []string{"--healthz-port", "0"}, set: func(o *options) { o.healthzBindAddress = "" }},
		{args: []string{"--healthz-port", "1234", "--healthz-bind-address", "10.0.0.5"}, set: func(o *options) { o.healthzBindAddress = "10.0.0.5:1234" }},
		{args: []string{"--healthz-port", "1234"}, set: func(*options) {}},
	},
	"metrics-port": {
		{args: []string{"--metrics-port", "0"}, set: func(o *options) { o.metricsBindAddress = "" }},
		{args: []string{"--metrics-port", "99999"}, wantErr: "--metrics-port=99999: metricsBindAddress: want a port"},
	},
	"logging-format": {
		{args: []string{"--logging-format", "text"}, set: func(*options) {}},
		{args: []string{"--logging-format", "json"}, wantErr: "--logging-format=json: logging.format: not implemented: only text"},
	},
	"log-flush-frequency":         {{args: []string{"--log-flush-frequency", "1s"}, wantErr: "--log-flush-frequency=1s: logging.flushFrequency: not implemented"}},
	"v":                           {{args: []string{"-v", "0"}, set: func(*options) {}}},
	"vmodule":                     {{args: []string{"--vmodule", ""}, set: func(*options) {}}},
	"log-text-split-stream":       {{args: []string{"--log-text-split-stream"}, wantErr: "--log-text-split-stream=true: logging.options.text.splitStream: not implemented"}},
	"log-text-info-buffer-size":   {{args: []string{"--log-text-info-buffer-size", "1Ki"}, wantErr: "--log-text-info-buffer-size=1Ki: logging.options.text.infoBufferSize: not implemented"}},
	"log-json-split-stream":       {{args: []string{"--log-json-split-stream"}, wantErr: "--log-json-split-stream=true: logging.options.json.splitStream: not implemented"}},
	"log-json-info-buffer-size":   {{args: []string{"--log-json-info-buffer-size", "1Ki"}, wantErr: "--log-json-info-buffer-size=1Ki: logging.options.json.infoBufferSize: not implemented"}},
	"iptables-drift-check-period": {{args: []string{"--iptables-drift-check-period", "0"}, set: func(o *options) { o.driftCheckPeriod = 0 }}},
	"chain-prefix":                {{args: []string{"--chain-prefix", "PXYB"}, set: func(o *options) { o.chainPrefix, o.nftTable = "PXYB", "pxyb-proxy" }}},
	"manifests":                   {{args: []string{"--manifests", "testdata"}, set: func(o *options) { o.manifests = "testdata" }}},
	"dry-run":                     {{args: []string{"--dry-run"}, set: func(o *options) { o.dryRun = true }}},
	"once":                        {{args: []string{"--once"}, set: func(o *options) { o.once = true }}},
	"ebpf-cgroup-path":            {{args: []string{"--ebpf-cgroup-path", "/sys/fs/cgroup"}, set: func(o *options) { o.ebpf.CgroupPath = "/sys/fs/cgroup" }}},
	"ebpf-pin-path":               {{args: []string{"--ebpf-pin-path", "/run/bpf"}, set: func(o *options) { o.ebpf.PinPath = "/run/bpf" }}},
	"ebpf-name-prefix":            {{args: []string{"--ebpf-name-prefix", "px2"}, set: func(o *options) { o.ebpf.NamePrefix = "px2" }}},
	"exit-on-node-change":         {{args: []string{"--exit-on-node-change"}, set: func(o *options) { o.exitOnNodeChange = true }}},
}

// flagDefaults are the options without flags.
func flagDefaults() options {
	return options{
		mode:               modeIPTables,
		healthzBindAddress: "0.0.0.0:10256",
		metricsBindAddress: "127.0.0.1:10249",
		syncPeriod:         30 * time.Second,
		minSyncPeriod:      time.Second,
		driftCheckPeriod:   30 * time.Second,
		chainPrefix:        "KUBE",
		nftTable:           "kube-proxy",
		localhostNodePorts: true,
		ebpf:               kubeproxy.EBPFConfig{PinPath: "/sys/fs/bpf", NamePrefix: "proxykit"},
	}
}

// TestFlagTable checks every row of flagTable (the README's flag table):
// the flag is registered, each of its cases parses to the options or the
// error wanted, a refusal names the flag and the configuration field, and
// beside a --config file the flag applies or is ignored as the row says,
// as kube-proxy's precedence has it.
func TestFlagTable(t *testing.T) {
	t.Cleanup(func() {
		if _, err := parseOptions([]string{"-v", "0", "--vmodule", ""}, io.Discard); err != nil {
			t.Error(err)
		}
	})
	const file = "testdata/config/kubeadm-default.yaml"
	opts := []cmp.Option{cmp.AllowUnexported(options{}), cmpopts.IgnoreFields(options{}, "names"), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}
	for _, row := range flagTable {
		cases := flagCases[row.name]
		if len(cases) == 0 {
			t.Errorf("--%s: no test case", row.name)
		}
		for _, tc := range cases {
			t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
				got, err := parseOptions(tc.args, io.Discard)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
					}
					if row.status == flagRefused && !strings.Contains(err.Error(), row.field) {
						t.Errorf("the refusal %q does not name %s", err, row.field)
					}
				} else {
					if err != nil {
						t.Fatal(err)
					}
					want := flagDefaults()
					tc.set(&want)
					if diff := cmp.Diff(&want, got, opts...); diff != "" {
						t.Errorf("options (-want +got):\n%s", diff)
					}
				}

				// Beside a file.
				if slices.Contains(tc.args, "--config") || slices.Contains(tc.args, "--version") {
					return
				}
				got, err = parseOptions(append([]string{"--config", file}, tc.args...), io.Discard)
				if tc.wantErr != "" && row.besideConfig {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("beside --config: got error %v, want one containing %q", err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("beside --config: %v", err)
				}
				want := kubeadmDefaults(file)
				if row.besideConfig {
					tc.set(&want)
				} else {
					// Every flag of the case: none applies beside a file.
					_, fs, _ := newFlagSet(io.Discard)
					if err := fs.Parse(tc.args); err != nil {
						t.Fatal(err)
					}
					fs.Visit(func(f *flag.Flag) { want.ignoredFlags = append(want.ignoredFlags, "--"+f.Name) })
				}
				if diff := cmp.Diff(&want, got, opts...); diff != "" {
					t.Errorf("beside --config: options (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestCleanupExcludeCIDRs checks that --cleanup, in any mode, takes
// --ipvs-exclude-cidrs, so that it leaves those virtual servers.
func TestCleanupExcludeCIDRs(t *testing.T) {
	o, err := parseOptions([]string{"--cleanup", "--ipvs-exclude-cidrs", "10.0.0.0/8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, o.kubeProxyConfig().IPVSExcludeCIDRs,
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("the excluded CIDRs of --cleanup (-want +got):\n%s", diff)
	}
}

// TestFlagTableCoversFlags checks that flagTable has a row for every
// registered flag and every kube-proxy v1.37 flag, and no other.
func TestFlagTableCoversFlags(t *testing.T) {
	_, fs, _ := newFlagSet(io.Discard)
	var registered, rows []string
	fs.VisitAll(func(f *flag.Flag) { registered = append(registered, f.Name) })
	for _, r := range flagTable {
		rows = append(rows, r.name)
	}
	slices.Sort(registered)
	slices.Sort(rows)
	if diff := cmp.Diff(registered, rows); diff != "" {
		t.Errorf("registered flags (-) against flagTable's rows (+):\n%s", diff)
	}
	for _, name := range kubeProxyV137Flags {
		if fs.Lookup(name) == nil {
			t.Errorf("kube-proxy's --%s is not registered", name)
		}
		if r, _ := flagRowOf(name); r.status == flagOwn {
			t.Errorf("kube-proxy's --%s is marked as this proxier's own", name)
		}
	}
}

// TestFlagTableInREADME checks that the README's flag table is the one
// flagTable gives.
func TestFlagTableInREADME(t *testing.T) {
	checkREADMETable(t, "flag table", flagTableMarkdown())
}

// TestVersionFlag checks that --version prints a version and asks for
// a clean exit.
func TestVersionFlag(t *testing.T) {
	var out strings.Builder
	if _, err := parseOptions([]string{"--version"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("got %v, want flag.ErrHelp", err)
	}
	if !strings.HasPrefix(out.String(), "proxier ") {
		t.Errorf("printed %q", out.String())
	}
}
