package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/kubeproxy"
	"github.com/proxykit/proxykit/proxy"
)

// Flag statuses in flagTable.
const (
	// flagHonoured: the flag does what kube-proxy's does.
	flagHonoured = "honoured"
	// flagRefused: any value but the default fails at start, naming the
	// field and why.
	flagRefused = "refused unless default"
	// flagAccepted: accepted and without effect here, as explained.
	flagAccepted = "accepted, no effect"
	// flagOwn: this proxier's own flag, not kube-proxy's.
	flagOwn = "proxykit's own"
)

// flagRow describes one command-line flag: the KubeProxyConfiguration
// field it fills, what this proxier does with it, and whether it applies
// beside --config. It is the one source of the README's flag table and
// of the flag tests.
type flagRow struct {
	name string
	// field is the KubeProxyConfiguration (v1alpha1) field, by its path;
	// empty when the flag fills none.
	field  string
	status string
	note   string
	// besideConfig: the flag applies when --config is given. kube-proxy
	// replaces everything its flags set by the file, except
	// --hostname-override and the logging flags; the flags that fill no
	// field (--master, --cleanup, ...) and this proxier's own apply too.
	besideConfig bool
}

// flagTable is every flag, kube-proxy v1.37's (Linux) and this proxier's.
var flagTable = []flagRow{
	{"config", "", flagHonoured, "the KubeProxyConfiguration file; beside it, only the flags marked so here apply, as in kube-proxy", true},
	{"write-config-to", "", flagHonoured, "writes the effective configuration as a KubeProxyConfiguration (v1alpha1) YAML file and exits", true},
	{"cleanup", "", flagHonoured, "removes the rules of every mode and exits", true},
	{"init-only", "", flagHonoured, "does the privileged node set-up of the mode (conntrack sysctls, removal of other modes' rules) and exits", true},
	{"version", "", flagHonoured, "prints the version and exits", true},
	{"feature-gates", "featureGates", flagRefused, "this proxier has no feature gates to set", false},
	{"kubeconfig", "clientConnection.kubeconfig", flagHonoured, "", false},
	{"master", "", flagHonoured, "overrides the kubeconfig's server", true},
	{"kube-api-content-type", "clientConnection.contentType", flagHonoured, "", false},
	{"kube-api-burst", "clientConnection.burst", flagHonoured, "", false},
	{"kube-api-qps", "clientConnection.qps", flagHonoured, "", false},
	{"hostname-override", "hostnameOverride", flagHonoured, "wins over the file, as in kube-proxy", true},
	{"bind-address", "bindAddress", flagRefused, "only an unspecified address (0.0.0.0, ::) is accepted: the node's IPs come from its Node object", false},
	{"healthz-bind-address", "healthzBindAddress", flagHonoured, "empty turns the server off", false},
	{"metrics-bind-address", "metricsBindAddress", flagHonoured, "empty turns the server off", false},
	{"bind-address-hard-fail", "bindAddressHardFail", flagAccepted, "this proxier always exits when a server cannot listen, as with true", false},
	{"profiling", "enableProfiling", flagRefused, "no /debug/pprof handler is served", false},
	{"show-hidden-metrics-for-version", "showHiddenMetricsForVersion", flagRefused, "this proxier has no hidden metrics", false},
	{"proxy-mode", "mode", flagHonoured, "iptables, ipvs or nftables; this proxier's own ebpf too (nftables mode beside a socket-level load balancer)", false},
	{"mode", "mode", flagOwn, "the same as --proxy-mode", false},
	{"iptables-masquerade-bit", "iptables.masqueradeBit", flagHonoured, "iptables and IPVS modes, as in kube-proxy (nftables mode takes nftables.masqueradeBit, from a file only)", false},
	{"masquerade-all", "iptables.masqueradeAll", flagHonoured, "nftables.masqueradeAll in nftables mode", false},
	{"iptables-localhost-nodeports", "iptables.localhostNodePorts", flagHonoured, "", false},
	{"iptables-sync-period", "iptables.syncPeriod", flagHonoured, "iptables and nftables modes, as in kube-proxy", false},
	{"iptables-min-sync-period", "iptables.minSyncPeriod", flagHonoured, "iptables and nftables modes, as in kube-proxy", false},
	{"ipvs-sync-period", "ipvs.syncPeriod", flagHonoured, "IPVS mode", false},
	{"ipvs-min-sync-period", "ipvs.minSyncPeriod", flagHonoured, "IPVS mode", false},
	{"sync-period", "iptables.syncPeriod", flagOwn, "the running mode's syncPeriod", false},
	{"min-sync-period", "iptables.minSyncPeriod", flagOwn, "the running mode's minSyncPeriod", false},
	{"ipvs-scheduler", "ipvs.scheduler", flagHonoured, "IPVS mode", false},
	{"ipvs-exclude-cidrs", "ipvs.excludeCIDRs", flagHonoured, "IPVS mode's syncs, and --cleanup in any mode, leave the virtual servers in these CIDRs alone", false},
	{"ipvs-strict-arp", "ipvs.strictARP", flagHonoured, "IPVS mode: sets arp_ignore=1 and arp_announce=2 at start (never unset)", false},
	{"ipvs-tcp-timeout", "ipvs.tcpTimeout", flagHonoured, "IPVS mode, in whole seconds; 0 leaves the kernel's", false},
	{"ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", flagHonoured, "IPVS mode, in whole seconds; 0 leaves the kernel's", false},
	{"ipvs-udp-timeout", "ipvs.udpTimeout", flagHonoured, "IPVS mode, in whole seconds; 0 leaves the kernel's", false},
	{"detect-local-mode", "detectLocalMode", flagHonoured, "ClusterCIDR, NodeCIDR (the Node's spec.podCIDRs, followed as they change; nothing is local until it has one), BridgeInterface or InterfaceNamePrefix", false},
	{"pod-bridge-interface", "detectLocal.bridgeInterface", flagHonoured, "read by detectLocalMode BridgeInterface; a name that is not a plain interface name (letters, digits, '_', '.', '-', at most 15) is refused", false},
	{"pod-interface-name-prefix", "detectLocal.interfaceNamePrefix", flagHonoured, "read by detectLocalMode InterfaceNamePrefix; a prefix that is not a plain interface name of at most 14 is refused", false},
	{"cluster-cidr", "clusterCIDR", flagHonoured, "at most one CIDR per IP family", false},
	{"nodeport-addresses", "nodePortAddresses", flagHonoured, "CIDRs, 'all', or 'primary' alone; 'localhost' is refused (see --iptables-localhost-nodeports)", false},
	{"oom-score-adj", "oomScoreAdj", flagRefused, "this proxier does not set its OOM score; set it in the pod or unit", false},
	{"conntrack-max-per-core", "conntrack.maxPerCore", flagHonoured, "nf_conntrack_max is left alone unless this flag is given (it is host-wide)", false},
	{"conntrack-min", "conntrack.min", flagHonoured, "", false},
	{"conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", flagHonoured, "", false},
	{"conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", flagHonoured, "", false},
	{"conntrack-tcp-be-liberal", "conntrack.tcpBeLiberal", flagHonoured, "", false},
	{"conntrack-udp-timeout", "conntrack.udpTimeout", flagHonoured, "", false},
	{"conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", flagHonoured, "", false},
	{"config-sync-period", "configSyncPeriod", flagRefused, "the informers never resync (the default, 15m, is accepted)", false},
	{"healthz-port", "healthzBindAddress", flagHonoured, "deprecated: the port of --healthz-bind-address when it has none; 0 turns the server off", false},
	{"metrics-port", "metricsBindAddress", flagHonoured, "deprecated: the port of --metrics-bind-address when it has none; 0 turns the server off", false},
	{"logging-format", "logging.format", flagRefused, "only text is implemented", true},
	{"log-flush-frequency", "logging.flushFrequency", flagRefused, "klog's own flush period (5s) is kept", true},
	{"v", "logging.verbosity", flagHonoured, "wins over the file, as in kube-proxy", true},
	{"vmodule", "logging.vmodule", flagHonoured, "wins over the file, as in kube-proxy", true},
	{"log-text-split-stream", "logging.options.text.splitStream", flagRefused, "not implemented (alpha in kube-proxy)", true},
	{"log-text-info-buffer-size", "logging.options.text.infoBufferSize", flagRefused, "not implemented (alpha in kube-proxy)", true},
	{"log-json-split-stream", "logging.options.json.splitStream", flagRefused, "not implemented (alpha in kube-proxy)", true},
	{"log-json-info-buffer-size", "logging.options.json.infoBufferSize", flagRefused, "not implemented (alpha in kube-proxy)", true},
	{"iptables-drift-check-period", "", flagOwn, "how often iptables mode checks its rules (top-level and per-service chains) against what it wrote; 0 turns the check off", true},
	{"chain-prefix", "", flagOwn, "the prefix of every chain and ipset, and the nftables table's name", true},
	{"manifests", "", flagOwn, "reads the cluster from YAML instead of an API server", true},
	{"dry-run", "", flagOwn, "prints the first sync and exits", true},
	{"once", "", flagOwn, "applies one sync and exits", true},
	{"ebpf-cgroup-path", "", flagOwn, "ebpf mode (required there): the cgroup v2 directory whose processes' sockets are translated at connect, with the cgroups below it", true},
	{"ebpf-pin-path", "", flagOwn, "ebpf mode: the bpffs directory of its pinned maps and links (default /sys/fs/bpf)", true},
	{"ebpf-name-prefix", "", flagOwn, "ebpf mode: the prefix of what it pins (default proxykit); --cleanup and mode switches remove this prefix's only", true},
	{"exit-on-node-change", "", flagOwn, "exits (status 1) when the Node is deleted or its node IPs change, for a restart, as kube-proxy does; without it the new addresses are followed live", true},
}

// flagRowOf returns the row of flag name.
func flagRowOf(name string) (flagRow, bool) {
	for _, r := range flagTable {
		if r.name == name {
			return r, true
		}
	}
	return flagRow{}, false
}

// flagTableMarkdown is the README's flag table.
func flagTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| flag | KubeProxyConfiguration field | status | beside `--config` | notes |\n|---|---|---|---|---|\n")
	for _, r := range flagTable {
		field, beside := "—", "ignored"
		if r.field != "" {
			field = "`" + r.field + "`"
		}
		if r.besideConfig {
			beside = "applies"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s | %s |\n", r.name, field, r.status, beside, r.note)
	}
	return b.String()
}

// kubeProxyFlags holds the values of the kube-proxy flags that options
// has no field for; applyKubeProxyFlags turns the given ones into options.
type kubeProxyFlags struct {
	iptablesSync, iptablesMinSync, ipvsSync, ipvsMinSync time.Duration
	masqueradeBit                                        int
	ipvsScheduler                                        string
	qps                                                  float64
	burst                                                int
	contentType                                          string
	bindAddress                                          string
	bindAddressHardFail, profiling                       bool
	showHiddenMetrics                                    string
	featureGates                                         string
	ipvsExcludeCIDRs                                     string
	ipvsStrictARP                                        bool
	ipvsTCP, ipvsTCPFin, ipvsUDP                         time.Duration
	detectLocalMode, podBridge, podPrefix                string
	oomScoreAdj                                          int
	ctMaxPerCore, ctMin                                  int
	ctEstablished, ctCloseWait, ctUDP, ctUDPStream       time.Duration
	ctBeLiberal                                          bool
	configSyncPeriod                                     time.Duration
	healthzPort, metricsPort                             int
	loggingFormat                                        string
	logFlush                                             time.Duration
	textSplit, jsonSplit                                 bool
	textBuffer, jsonBuffer                               string
	version                                              bool
}

// kube-proxy's defaults of the flags above.
const (
	defaultMasqueradeBit    = 14
	defaultOOMScoreAdj      = -999
	defaultCTMaxPerCore     = 32768
	defaultCTMin            = 131072
	defaultConfigSyncPeriod = 15 * time.Minute
	defaultLogFlush         = 5 * time.Second
)

// addKubeProxyFlags registers kube-proxy's flags that the options of
// parseOptions do not already have.
func addKubeProxyFlags(fs *flag.FlagSet, o *options, k *kubeProxyFlags, klogFlags *flag.FlagSet) {
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "Write the effective configuration to this file, as a KubeProxyConfiguration, and exit.")
	fs.BoolVar(&o.initOnly, "init-only", false, "Do the node set-up that needs full privileges (conntrack sysctls, removing other modes' rules), then exit.")
	fs.BoolVar(&k.version, "version", false, "Print the version and exit.")
	fs.Var(fs.Lookup("mode").Value, "proxy-mode", "Which proxy mode to use: 'iptables' (default), 'ipvs', 'nftables' or this proxier's 'ebpf' (nftables mode for packets from outside the node, beside BPF programs that send the sockets of --ebpf-cgroup-path straight to an endpoint at connect).")
	fs.StringVar(&k.featureGates, "feature-gates", "", "key=value pairs of feature gates; this proxier has none, so any is refused.")
	fs.StringVar(&k.contentType, "kube-api-content-type", "", "The content type of requests to the API server.")
	fs.IntVar(&k.burst, "kube-api-burst", 0, "The burst of requests to the API server (0: client-go's default).")
	fs.Float64Var(&k.qps, "kube-api-qps", 0, "The requests per second to the API server (0: client-go's default).")
	fs.StringVar(&k.bindAddress, "bind-address", "0.0.0.0", "kube-proxy's override of the node's primary IP; only an unspecified address is accepted, the node's IPs come from its Node object.")
	fs.BoolVar(&k.bindAddressHardFail, "bind-address-hard-fail", false, "Accepted: this proxier always exits when a server cannot listen.")
	fs.BoolVar(&k.profiling, "profiling", false, "Not implemented: true is refused.")
	fs.StringVar(&k.showHiddenMetrics, "show-hidden-metrics-for-version", "", "Not implemented: a version is refused.")
	fs.IntVar(&k.masqueradeBit, "iptables-masquerade-bit", defaultMasqueradeBit, "In iptables and IPVS mode, the fwmark bit, 0 to 31, that marks packets to masquerade.")
	fs.DurationVar(&k.iptablesSync, "iptables-sync-period", 30*time.Second, "In iptables and nftables mode, the longest time between syncs of the rules.")
	fs.DurationVar(&k.iptablesMinSync, "iptables-min-sync-period", time.Second, "In iptables and nftables mode, the shortest time between syncs of the rules.")
	fs.DurationVar(&k.ipvsSync, "ipvs-sync-period", 30*time.Second, "In IPVS mode, the longest time between syncs of the rules.")
	fs.DurationVar(&k.ipvsMinSync, "ipvs-min-sync-period", time.Second, "In IPVS mode, the shortest time between syncs of the rules.")
	fs.StringVar(&k.ipvsScheduler, "ipvs-scheduler", "", "In IPVS mode, the scheduler of the virtual servers (empty: rr).")
	fs.StringVar(&k.ipvsExcludeCIDRs, "ipvs-exclude-cidrs", "", "In IPVS mode, comma-separated CIDRs whose virtual servers the proxier never deletes (another program's).")
	fs.BoolVar(&k.ipvsStrictARP, "ipvs-strict-arp", false, "In IPVS mode, set arp_ignore to 1 and arp_announce to 2 (strict ARP).")
	fs.DurationVar(&k.ipvsTCP, "ipvs-tcp-timeout", 0, "In IPVS mode, the IPVS timeout of idle TCP connections; 0 leaves it.")
	fs.DurationVar(&k.ipvsTCPFin, "ipvs-tcpfin-timeout", 0, "In IPVS mode, the IPVS timeout of TCP connections after a FIN; 0 leaves it.")
	fs.DurationVar(&k.ipvsUDP, "ipvs-udp-timeout", 0, "In IPVS mode, the IPVS timeout of UDP flows; 0 leaves it.")
	fs.StringVar(&k.detectLocalMode, "detect-local-mode", "", "How traffic from this node's pods is told apart: ClusterCIDR (the default), NodeCIDR, BridgeInterface or InterfaceNamePrefix.")
	fs.StringVar(&k.podBridge, "pod-bridge-interface", "", "The pods' bridge, for --detect-local-mode BridgeInterface.")
	fs.StringVar(&k.podPrefix, "pod-interface-name-prefix", "", "The prefix of the pods' interface names, for --detect-local-mode InterfaceNamePrefix.")
	fs.IntVar(&k.oomScoreAdj, "oom-score-adj", defaultOOMScoreAdj, "Not implemented: only the default is accepted; set the OOM score in the pod or unit.")
	fs.IntVar(&k.ctMaxPerCore, "conntrack-max-per-core", defaultCTMaxPerCore, "Set nf_conntrack_max to this times the CPUs (at least --conntrack-min); 0 leaves it, and it is left alone unless this flag is given.")
	fs.IntVar(&k.ctMin, "conntrack-min", defaultCTMin, "The least nf_conntrack_max that --conntrack-max-per-core sets.")
	fs.DurationVar(&k.ctEstablished, "conntrack-tcp-timeout-established", kubeproxy.DefaultTCPEstablishedTimeout, "The conntrack timeout of idle established TCP connections; 0 leaves it.")
	fs.DurationVar(&k.ctCloseWait, "conntrack-tcp-timeout-close-wait", kubeproxy.DefaultTCPCloseWaitTimeout, "The conntrack timeout of TCP connections in CLOSE_WAIT; 0 leaves it.")
	fs.BoolVar(&k.ctBeLiberal, "conntrack-tcp-be-liberal", false, "Set nf_conntrack_tcp_be_liberal, so that out-of-window TCP packets are not marked INVALID.")
	fs.DurationVar(&k.ctUDP, "conntrack-udp-timeout", 0, "The conntrack timeout of unreplied UDP flows; 0 leaves it.")
	fs.DurationVar(&k.ctUDPStream, "conntrack-udp-timeout-stream", 0, "The conntrack timeout of assured UDP flows; 0 leaves it.")
	fs.DurationVar(&k.configSyncPeriod, "config-sync-period", defaultConfigSyncPeriod, "Not implemented: the informers never resync; only the default is accepted.")
	fs.IntVar(&k.healthzPort, "healthz-port", 10256, "Deprecated: the port of --healthz-bind-address when it gives none; 0 turns the health server off.")
	fs.IntVar(&k.metricsPort, "metrics-port", 10249, "Deprecated: the port of --metrics-bind-address when it gives none; 0 turns the metrics server off.")
	fs.StringVar(&k.loggingFormat, "logging-format", "text", "The log format; only text is implemented.")
	fs.DurationVar(&k.logFlush, "log-flush-frequency", defaultLogFlush, "Not implemented: only the default is accepted.")
	fs.Var(klogFlags.Lookup("vmodule").Value, "vmodule", "Comma-separated pattern=N settings for per-file verbosity.")
	fs.BoolVar(&k.textSplit, "log-text-split-stream", false, "Not implemented: true is refused.")
	fs.StringVar(&k.textBuffer, "log-text-info-buffer-size", "0", "Not implemented: only 0 is accepted.")
	fs.BoolVar(&k.jsonSplit, "log-json-split-stream", false, "Not implemented: true is refused.")
	fs.StringVar(&k.jsonBuffer, "log-json-info-buffer-size", "0", "Not implemented: only 0 is accepted.")
}

// flagError is the error of a flag this proxier cannot honour, or of a
// value it refuses: it names the flag, the configuration field it fills
// and the reason.
func flagError(fs *flag.FlagSet, name, reason string) error {
	r, _ := flagRowOf(name)
	return fmt.Errorf("--%s=%s: %s: %s", name, fs.Lookup(name).Value.String(), r.field, reason)
}

// applyKubeProxyFlags checks the kube-proxy flags given (without --config)
// and puts the ones honoured into o: a flag this proxier cannot honour
// with its value is refused. o.mode is already resolved.
func applyKubeProxyFlags(fs *flag.FlagSet, o *options, k *kubeProxyFlags, given map[string]bool) error {
	refuse := func(name string, bad bool) error {
		if given[name] && bad {
			r, _ := flagRowOf(name)
			return flagError(fs, name, "not implemented: "+r.note)
		}
		return nil
	}
	ipvsMode := o.mode == modeIPVS
	for _, c := range []struct {
		name string
		bad  bool
	}{
		{"feature-gates", strings.TrimSpace(k.featureGates) != ""},
		{"profiling", k.profiling},
		{"show-hidden-metrics-for-version", k.showHiddenMetrics != ""},
		{"oom-score-adj", k.oomScoreAdj != defaultOOMScoreAdj},
		{"config-sync-period", k.configSyncPeriod != defaultConfigSyncPeriod},
		{"logging-format", k.loggingFormat != "text"},
		{"log-flush-frequency", k.logFlush != defaultLogFlush},
		{"log-text-split-stream", k.textSplit},
		{"log-text-info-buffer-size", strings.TrimSpace(k.textBuffer) != "0"},
		{"log-json-split-stream", k.jsonSplit},
		{"log-json-info-buffer-size", strings.TrimSpace(k.jsonBuffer) != "0"},
	} {
		if err := refuse(c.name, c.bad); err != nil {
			return err
		}
	}
	if given["bind-address"] {
		a, err := netip.ParseAddr(k.bindAddress)
		if err != nil {
			return flagError(fs, "bind-address", "want an IP address")
		}
		if !a.IsUnspecified() {
			return flagError(fs, "bind-address", "not implemented: this proxier takes the node's IPs from its Node object; give 0.0.0.0 or ::")
		}
	}

	// The sync periods of the running mode's section, as kube-proxy
	// reads them.
	syncFlag, minFlag, syncValue, minValue := "iptables-sync-period", "iptables-min-sync-period", k.iptablesSync, k.iptablesMinSync
	if ipvsMode {
		syncFlag, minFlag, syncValue, minValue = "ipvs-sync-period", "ipvs-min-sync-period", k.ipvsSync, k.ipvsMinSync
	}
	if given[syncFlag] {
		if syncValue <= 0 {
			return flagError(fs, syncFlag, "must be greater than 0")
		}
		o.syncPeriod = syncValue
	}
	if given[minFlag] {
		if minValue < 0 || minValue > o.syncPeriod {
			return flagError(fs, minFlag, fmt.Sprintf("must be between 0 and the sync period (%v)", o.syncPeriod))
		}
		o.minSyncPeriod = minValue
	}

	if given["iptables-masquerade-bit"] {
		if k.masqueradeBit < 0 || k.masqueradeBit > 31 {
			return flagError(fs, "iptables-masquerade-bit", "must be within the range [0, 31]")
		}
		// kube-proxy's nftables mode reads nftables.masqueradeBit,
		// which has no flag.
		if o.mode != modeNFTables && o.mode != modeEBPF {
			bit := k.masqueradeBit
			o.masqueradeBit = &bit
		}
	}
	if given["ipvs-scheduler"] && ipvsMode && k.ipvsScheduler != "" {
		if _, err := kernel.IPVSSchedulerModule(k.ipvsScheduler); err != nil {
			return flagError(fs, "ipvs-scheduler", err.Error())
		}
		o.ipvsScheduler = k.ipvsScheduler
	}

	// --cleanup, in any mode, leaves the excluded CIDRs' virtual servers.
	if ipvsMode || o.cleanup {
		if err := applyIPVSFlags(fs, o, k, given); err != nil {
			return err
		}
	}

	if k.qps < 0 {
		return flagError(fs, "kube-api-qps", "must not be negative")
	}
	if k.burst < 0 {
		return flagError(fs, "kube-api-burst", "must not be negative")
	}
	if given["kube-api-qps"] {
		o.client.QPS = float32(k.qps)
	}
	if given["kube-api-burst"] {
		o.client.Burst = k.burst
	}
	if given["kube-api-content-type"] {
		o.client.ContentType = k.contentType
	}

	if err := applyConntrackFlags(fs, o, k, given); err != nil {
		return err
	}
	return applyDetectLocalFlags(fs, o, k, given)
}

// applyDetectLocalFlags puts the local-detection flags given into o, over
// the file's values, and checks what o then holds as kube-proxy would,
// naming the flag at fault.
func applyDetectLocalFlags(fs *flag.FlagSet, o *options, k *kubeProxyFlags, given map[string]bool) error {
	if given["detect-local-mode"] {
		o.detectLocalMode = proxy.LocalMode(k.detectLocalMode)
		if o.detectLocalMode == proxy.LocalModeClusterCIDR {
			o.detectLocalMode = ""
		}
	}
	if given["pod-bridge-interface"] {
		o.bridgeInterface = k.podBridge
	}
	if given["pod-interface-name-prefix"] {
		o.interfaceNamePrefix = k.podPrefix
	}
	switch o.detectLocalMode {
	case "", proxy.LocalModeNodeCIDR, proxy.LocalModeBridgeInterface, proxy.LocalModeInterfaceNamePrefix:
	default:
		return flagError(fs, "detect-local-mode", "want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")
	}
	for _, c := range []struct {
		flag, value string
		mode        proxy.LocalMode
		check       func(string) error
	}{
		{"pod-bridge-interface", o.bridgeInterface, proxy.LocalModeBridgeInterface, proxy.ValidateInterfaceName},
		{"pod-interface-name-prefix", o.interfaceNamePrefix, proxy.LocalModeInterfaceNamePrefix, proxy.ValidateInterfaceNamePrefix},
	} {
		if c.value == "" && o.detectLocalMode == c.mode {
			return flagError(fs, "detect-local-mode", "needs --"+c.flag)
		}
		if c.value != "" {
			if err := c.check(c.value); err != nil {
				return flagError(fs, c.flag, err.Error())
			}
		}
	}
	return nil
}

// applyIPVSFlags puts the IPVS flags given into o, checked as kube-proxy
// checks ipvs.excludeCIDRs and the timeouts (see kubeproxy.IPVSSettings).
// kube-proxy reads them in IPVS mode only; this proxier's --cleanup reads
// them too.
func applyIPVSFlags(fs *flag.FlagSet, o *options, k *kubeProxyFlags, given map[string]bool) error {
	if given["ipvs-exclude-cidrs"] {
		var list []string
		for _, s := range strings.Split(k.ipvsExcludeCIDRs, ",") {
			if s = strings.TrimSpace(s); s != "" {
				list = append(list, s)
			}
		}
		_, cidrs, err := kubeproxy.IPVSSettings(kubeproxyconfig.KubeProxyIPVSConfiguration{ExcludeCIDRs: list})
		if err != nil {
			return fmt.Errorf("--ipvs-exclude-cidrs=%s: %w", fs.Lookup("ipvs-exclude-cidrs").Value, err)
		}
		o.ipvsExcludeCIDRs = cidrs
	}
	if given["ipvs-strict-arp"] {
		o.ipvsTuning.StrictARP = k.ipvsStrictARP
	}
	for _, t := range []struct {
		name  string
		value time.Duration
		into  *time.Duration
	}{
		{"ipvs-tcp-timeout", k.ipvsTCP, &o.ipvsTuning.Timeouts.TCP},
		{"ipvs-tcpfin-timeout", k.ipvsTCPFin, &o.ipvsTuning.Timeouts.TCPFin},
		{"ipvs-udp-timeout", k.ipvsUDP, &o.ipvsTuning.Timeouts.UDP},
	} {
		if !given[t.name] {
			continue
		}
		d, err := kubeproxy.IPVSTimeout(t.value)
		if err != nil {
			return flagError(fs, t.name, err.Error())
		}
		*t.into = d
	}
	return nil
}

// applyDeprecatedPorts applies --healthz-port and --metrics-port to the
// address flags' values, before these are checked.
func applyDeprecatedPorts(fs *flag.FlagSet, o *options, k *kubeProxyFlags, given map[string]bool) error {
	for _, p := range []struct {
		flag string
		port int
		addr *string
	}{
		{"healthz-port", k.healthzPort, &o.healthzBindAddress},
		{"metrics-port", k.metricsPort, &o.metricsBindAddress},
	} {
		if !given[p.flag] {
			continue
		}
		if p.port < 0 || p.port > 65535 {
			return flagError(fs, p.flag, "want a port, 0 to 65535")
		}
		// As kube-proxy: 0 turns the server off, and the port is
		// added to an address given without one.
		if p.port == 0 {
			*p.addr = ""
		} else if a, err := netip.ParseAddr(*p.addr); err == nil {
			*p.addr = net.JoinHostPort(a.String(), strconv.Itoa(p.port))
		}
	}
	return nil
}

// applyConntrackFlags puts the conntrack flags into o.conntrack when one
// is given, with kube-proxy's defaults for the others.
func applyConntrackFlags(fs *flag.FlagSet, o *options, k *kubeProxyFlags, given map[string]bool) error {
	some := false
	for _, name := range []string{"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established",
		"conntrack-tcp-timeout-close-wait", "conntrack-tcp-be-liberal", "conntrack-udp-timeout", "conntrack-udp-timeout-stream"} {
		some = some || given[name]
	}
	if !some {
		return nil
	}
	t := conntrack.Tuning{
		TCPEstablishedTimeout: k.ctEstablished,
		TCPCloseWaitTimeout:   k.ctCloseWait,
		TCPBeLiberal:          k.ctBeLiberal,
		UDPTimeout:            k.ctUDP,
		UDPStreamTimeout:      k.ctUDPStream,
	}
	// nf_conntrack_max is host-wide: set only when asked to.
	if given["conntrack-max-per-core"] {
		t.MaxPerCore, t.Min = k.ctMaxPerCore, k.ctMin
	}
	for _, c := range []struct {
		name string
		bad  bool
	}{
		{"conntrack-max-per-core", k.ctMaxPerCore < 0},
		{"conntrack-min", k.ctMin < 0},
		{"conntrack-tcp-timeout-established", k.ctEstablished < 0},
		{"conntrack-tcp-timeout-close-wait", k.ctCloseWait < 0},
		{"conntrack-udp-timeout", k.ctUDP < 0},
		{"conntrack-udp-timeout-stream", k.ctUDPStream < 0},
	} {
		if c.bad {
			return flagError(fs, c.name, "must be greater than or equal to 0")
		}
	}
	o.conntrack = &t
	return nil
}

// warnIgnoredFlags logs, in one line, the flags given beside --config that
// kube-proxy, and so this proxier, ignores.
func warnIgnoredFlags(logger klog.Logger, o *options) {
	if len(o.ignoredFlags) > 0 {
		logger.Info("Warning: flags given beside --config are ignored, as kube-proxy ignores them; set the fields in the file instead", "config", o.config, "flags", o.ignoredFlags)
	}
}

// buildVersion is the module version the binary was built from, as
// --version prints it.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
