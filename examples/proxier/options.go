package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kubeproxy"
	"github.com/proxykit/proxykit/proxy"
)

// Proxy modes, as --mode names them.
const (
	modeIPTables = kubeproxy.ModeIPTables
	modeIPVS     = kubeproxy.ModeIPVS
	modeNFTables = kubeproxy.ModeNFTables
	modeEBPF     = kubeproxy.ModeEBPF
)

// options are the command line, parsed and checked.
type options struct {
	kubeconfig       string
	master           string
	hostnameOverride string
	mode             string
	// clusterCIDRs has at most one prefix per IP family.
	clusterCIDRs  []netip.Prefix
	masqueradeAll bool
	// nodePortAddresses are the --nodeport-addresses prefixes;
	// nodePortPrimary is set by the value "primary" instead.
	nodePortAddresses  []netip.Prefix
	nodePortPrimary    bool
	healthzBindAddress string
	metricsBindAddress string
	syncPeriod         time.Duration
	minSyncPeriod      time.Duration
	// driftCheckPeriod is --iptables-drift-check-period.
	driftCheckPeriod time.Duration
	cleanup          bool
	manifests        string
	dryRun           bool
	once             bool
	// chainPrefix is --chain-prefix; names are what the proxier owns in
	// the kernel with it, in either mode.
	chainPrefix string
	names       *ipvsmode.Names
	// ebpf is --ebpf-cgroup-path, --ebpf-pin-path and
	// --ebpf-name-prefix: where ebpf mode attaches and pins, and what
	// --cleanup and the other modes remove.
	ebpf kubeproxy.EBPFConfig
	// nftTable is the nftables table of nftables mode, named after
	// --chain-prefix (see kubeproxy.NFTablesTable).
	nftTable string

	// localhostNodePorts is --iptables-localhost-nodeports.
	localhostNodePorts bool
	// writeConfigTo is --write-config-to; initOnly is --init-only.
	writeConfigTo string
	initOnly      bool
	// verbosity is -v, or logging.verbosity; klog holds it too.
	verbosity uint32
	// ignoredFlags are the flags given beside --config that kube-proxy
	// ignores there, for one warning at start-up.
	ignoredFlags []string

	// config is --config; the fields below come from it alone (see
	// applyConfigFile) and are zero without it.
	config string
	// unsupported names the file's fields that are set and ignored.
	unsupported []string
	client      clientSettings
	// masqueradeBit is iptables.masqueradeBit; nil means the default.
	masqueradeBit *int
	// detectLocalMode ("" for ClusterCIDR), bridgeInterface and
	// interfaceNamePrefix are detectLocalMode and detectLocal, or their
	// flags (applyDetectLocalFlags).
	detectLocalMode                      proxy.LocalMode
	bridgeInterface, interfaceNamePrefix string
	// conntrack is the conntrack section; nil means kube-proxy's default
	// timeouts.
	conntrack *conntrack.Tuning
	// ipvsScheduler is ipvs.scheduler in IPVS mode; empty means rr.
	ipvsScheduler string
	// exitOnNodeChange is --exit-on-node-change.
	exitOnNodeChange bool
	// ipvsExcludeCIDRs is ipvs.excludeCIDRs and ipvsTuning the ipvs
	// section's strictARP and timeouts, in IPVS mode; zero sets nothing.
	ipvsExcludeCIDRs []netip.Prefix
	ipvsTuning       ipvsmode.Tuning
}

// parseOptions reads the command line args (without the program name).
// Usage and errors go to stderr; -h gives flag.ErrHelp, and so does
// --version once it has printed the version there.
//
// With --config, the file gives every setting that kube-proxy takes from
// it: as in kube-proxy, the flags that fill the file's fields are then
// ignored (and named in o.ignoredFlags), except --hostname-override and
// the logging flags, which win over the file. The flags that fill no field
// (--master, --cleanup, ...) and this proxier's own apply either way (see
// flagTable).
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o, fs, k, err := parseFlags(args, stderr)
	if err != nil {
		return nil, err
	}
	if k.version {
		fmt.Fprintln(stderr, "proxier", buildVersion())
		return nil, flag.ErrHelp
	}
	if o.config != "" {
		// Parse again with only the flags that apply beside a file.
		o2, fs2, k2 := newFlagSet(io.Discard)
		var ignored []string
		fs.Visit(func(f *flag.Flag) {
			if r, _ := flagRowOf(f.Name); r.besideConfig {
				// The value parsed once already.
				_ = fs2.Set(f.Name, f.Value.String())
				return
			}
			ignored = append(ignored, "--"+f.Name)
		})
		o, fs, k = o2, fs2, k2
		o.ignoredFlags = ignored
	}
	return completeOptions(o, fs, k)
}

// parseFlags parses args into a new flag set.
func parseFlags(args []string, stderr io.Writer) (*options, *flag.FlagSet, *kubeProxyFlags, error) {
	o, fs, k := newFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return nil, nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, fs, k, nil
}

// newFlagSet registers every flag (see flagTable) into a new flag set.
func newFlagSet(stderr io.Writer) (*options, *flag.FlagSet, *kubeProxyFlags) {
	o, k := &options{}, &kubeProxyFlags{}
	fs := flag.NewFlagSet("proxier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: proxier [flags]\n\nA Kubernetes service proxy composed from the proxykit blocks.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var clusterCIDR, nodePortAddresses string
	fs.StringVar(&o.config, "config", "", "Path to a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1), as kubeadm deploys kube-proxy with; as in kube-proxy, it wins over the flags that fill its fields, but --hostname-override and the logging flags.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file; empty, with --master empty too, means the in-cluster configuration.")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides any value in the kubeconfig).")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "The name of this node, if not the host name.")
	fs.StringVar(&o.mode, "mode", modeIPTables, "The same as --proxy-mode.")
	fs.StringVar(&clusterCIDR, "cluster-cidr", "", "The pod network, at most one CIDR per IP family, comma-separated. Traffic to cluster IPs from outside it is masqueraded.")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "Masquerade all traffic to cluster IPs.")
	fs.StringVar(&nodePortAddresses, "nodeport-addresses", "", "Comma-separated CIDRs of the node addresses that serve node ports, or 'primary' for the node's own IPs; empty means all local addresses in iptables and IPVS mode, 'primary' in nftables mode (as kube-proxy); 0.0.0.0/0,::/0 means all in every mode.")
	fs.BoolVar(&o.localhostNodePorts, "iptables-localhost-nodeports", true, "In iptables mode, serve IPv4 node ports on 127.0.0.1 too (sets net.ipv4.conf.all.route_localnet=1 and drops other hosts' packets to 127.0.0.0/8); IPv6 node ports are never served on localhost.")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", "0.0.0.0:"+kubeproxy.DefaultHealthzPort, "The IP address and port of the health server (/healthz, /livez); empty disables it.")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", "127.0.0.1:"+kubeproxy.DefaultMetricsPort, "The IP address and port of the metrics server (/metrics); empty disables it.")
	fs.DurationVar(&o.syncPeriod, "sync-period", 30*time.Second, "The longest time between syncs of the rules.")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", time.Second, "The shortest time between syncs of the rules.")
	fs.DurationVar(&o.driftCheckPeriod, "iptables-drift-check-period", 30*time.Second, "How often iptables mode checks its rules against what it wrote (the top-level chains' service rules at every check; the rule counts and targets of every KUBE-SVC/SVL/EXT/FW/SEP chain at every check with iptables-legacy and every 10th with iptables-nft), and syncs everything when one differs; 0 turns the check off. Its cost is in BENCHMARKS.md.")
	fs.BoolVar(&o.cleanup, "cleanup", false, "Remove every rule the proxier made, then exit.")
	fs.StringVar(&o.manifests, "manifests", "", "Read Services, EndpointSlices, Nodes and ServiceCIDRs from this YAML file or directory, and follow changes to it, instead of an API server.")
	fs.BoolVar(&o.dryRun, "dry-run", false, "Print what the first full sync would apply and exit; touch nothing and need no privileges.")
	fs.BoolVar(&o.once, "once", false, "Apply one full sync and exit.")
	// Not a kube-proxy flag: kube-proxy's names are fixed.
	fs.StringVar(&o.chainPrefix, "chain-prefix", iptables.DefaultChainPrefix, "Prefix of every iptables chain and ipset the proxier owns (KUBE-SERVICES, KUBE-SVC-*, KUBE-CLUSTER-IP, ...), at most 5 letters, digits or underscores, and the name of its nftables table, the prefix lower-cased followed by '-proxy' (KUBE: kube-proxy, kube-proxy's table): give a proxier that runs beside kube-proxy, or beside another proxier, one of its own. --cleanup and mode switches remove this prefix's only.")
	fs.StringVar(&o.ebpf.CgroupPath, "ebpf-cgroup-path", "", "In ebpf mode (required there), the cgroup v2 directory whose processes' sockets are sent straight to an endpoint when they connect, with those of the cgroups below it: the root of the node's cgroup2 mount (/sys/fs/cgroup on most nodes) for every process.")
	fs.StringVar(&o.ebpf.PinPath, "ebpf-pin-path", ebpf.DefaultPinPath, "The bpffs directory where ebpf mode pins its maps and the links of its programs, so that they outlive the process and the next one takes them over.")
	fs.StringVar(&o.ebpf.NamePrefix, "ebpf-name-prefix", ebpf.DefaultNamePrefix, "The prefix of the names ebpf mode pins (letters, digits, '-' and '_', at most 32): give a second proxier on the node one of its own. --cleanup and mode switches remove this prefix's only.")
	fs.BoolVar(&o.exitOnNodeChange, "exit-on-node-change", false, "Exit (status 1) when this node's Node object is deleted or its node IPs change, so that the process restarts with the new ones, as kube-proxy does; without it the proxier follows the new addresses (node ports and health-check node ports) without a restart.")
	// Of klog's flags, only -v, as kube-proxy users know it.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", "Log verbosity: 0 logs start-up and errors, 2 each sync, 4 every change and command.")
	addKubeProxyFlags(fs, o, k, klogFlags)
	return o, fs, k
}

// completeOptions applies the --config file, if any, and checks and
// completes the options parsed into fs.
func completeOptions(o *options, fs *flag.FlagSet, k *kubeProxyFlags) (*options, error) {
	if o.config != "" {
		if err := applyConfigFile(fs, o); err != nil {
			return nil, err
		}
	}
	v, err := strconv.ParseUint(fs.Lookup("v").Value.String(), 10, 32)
	if err != nil {
		return nil, fmt.Errorf("-v: %w", err)
	}
	o.verbosity = uint32(v)
	clusterCIDR, nodePortAddresses := fs.Lookup("cluster-cidr").Value.String(), fs.Lookup("nodeport-addresses").Value.String()
	if o.clusterCIDRs, err = parseCIDRs("--cluster-cidr", clusterCIDR); err != nil {
		return nil, err
	}
	if err := kubeproxy.OnePerFamily("--cluster-cidr", o.clusterCIDRs); err != nil {
		return nil, err
	}
	// As kube-proxy's: CIDRs and the keywords of nodePortAddresses.
	var npa []string
	for _, s := range strings.Split(nodePortAddresses, ",") {
		if s = strings.TrimSpace(s); s != "" {
			npa = append(npa, s)
		}
	}
	if nodePortAddresses, err = nodePortAddressesValue(npa); err != nil {
		return nil, fmt.Errorf("--nodeport-addresses: %w", err)
	}
	if nodePortAddresses == "primary" {
		o.nodePortPrimary = true
	} else if o.nodePortAddresses, err = parseCIDRs("--nodeport-addresses", nodePortAddresses); err != nil {
		return nil, err
	}
	if o.names, err = ipvsmode.NewNames(o.chainPrefix); err != nil {
		return nil, fmt.Errorf("--chain-prefix: %w", err)
	}
	o.chainPrefix = o.names.Chains().Prefix()
	o.nftTable = kubeproxy.NFTablesTable(o.chainPrefix)
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := applyDeprecatedPorts(fs, o, k, given); err != nil {
		return nil, err
	}
	if o.healthzBindAddress, err = kubeproxy.BindAddress("--healthz-bind-address", o.healthzBindAddress, kubeproxy.DefaultHealthzPort); err != nil {
		return nil, err
	}
	if o.metricsBindAddress, err = kubeproxy.BindAddress("--metrics-bind-address", o.metricsBindAddress, kubeproxy.DefaultMetricsPort); err != nil {
		return nil, err
	}
	switch o.mode {
	case modeIPTables, modeIPVS, modeNFTables, modeEBPF:
	case "":
		o.mode = modeIPTables
	default:
		return nil, fmt.Errorf("--mode %q: want %q, %q, %q or %q", o.mode, modeIPTables, modeIPVS, modeNFTables, modeEBPF)
	}
	// kube-proxy's nftables mode serves node ports on the node's own
	// addresses unless told otherwise: its nodePortAddresses default.
	// ebpf mode runs nftables mode beside it.
	if (o.mode == modeNFTables || o.mode == modeEBPF) && !o.nodePortPrimary && len(o.nodePortAddresses) == 0 {
		o.nodePortPrimary = true
	}
	if err := applyKubeProxyFlags(fs, o, k, given); err != nil {
		return nil, err
	}
	if o.syncPeriod <= 0 {
		return nil, fmt.Errorf("--sync-period %v: must be positive", o.syncPeriod)
	}
	if o.minSyncPeriod < 0 || o.minSyncPeriod > o.syncPeriod {
		return nil, fmt.Errorf("--min-sync-period %v: must be between 0 and --sync-period (%v)", o.minSyncPeriod, o.syncPeriod)
	}
	if o.driftCheckPeriod < 0 {
		return nil, fmt.Errorf("--iptables-drift-check-period %v: must not be negative", o.driftCheckPeriod)
	}
	if n := count(o.dryRun, o.once, o.cleanup, o.initOnly, o.writeConfigTo != ""); n > 1 {
		return nil, errors.New("--dry-run, --once, --cleanup, --init-only and --write-config-to exclude each other")
	}
	// Only a run that attaches the programs needs the cgroup.
	if o.mode == modeEBPF && o.ebpf.CgroupPath == "" && !o.dryRun && !o.cleanup && !o.initOnly && o.writeConfigTo == "" {
		return nil, errors.New("--mode ebpf needs --ebpf-cgroup-path, the cgroup v2 directory whose sockets it translates")
	}
	if o.cleanup && o.manifests != "" {
		return nil, errors.New("--cleanup needs no cluster: leave out --manifests")
	}
	return o, nil
}

// kubeProxyConfig is what kubeproxy runs with from o.
func (o *options) kubeProxyConfig() *kubeproxy.Config {
	c := &kubeproxy.Config{
		Mode:               o.mode,
		ClusterCIDRs:       o.clusterCIDRs,
		MasqueradeAll:      o.masqueradeAll,
		MasqueradeBit:      o.masqueradeBit,
		NodePortAddresses:  o.nodePortAddresses,
		NodePortPrimary:    o.nodePortPrimary,
		LocalhostNodePorts: o.localhostNodePorts,
		SyncPeriod:         o.syncPeriod,
		MinSyncPeriod:      o.minSyncPeriod,
		DriftCheckPeriod:   o.driftCheckPeriod,
		ChainPrefix:        o.chainPrefix,
		Conntrack:          o.conntrack,
		IPVSScheduler:      o.ipvsScheduler,
		IPVSExcludeCIDRs:   o.ipvsExcludeCIDRs,
		IPVSTuning:         o.ipvsTuning,
		HealthzBindAddress: o.healthzBindAddress,
		MetricsBindAddress: o.metricsBindAddress,
		ExitOnNodeChange:   o.exitOnNodeChange,
		EBPF:               o.ebpf,
	}
	c.DetectLocalMode, c.BridgeInterface, c.InterfaceNamePrefix = o.detectLocalMode, o.bridgeInterface, o.interfaceNamePrefix
	return c
}

// nodeName returns --hostname-override, or the host name, lower-cased as
// node names are.
func (o *options) nodeName() (string, error) {
	name := o.hostnameOverride
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("finding the node name (set --hostname-override): %w", err)
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", errors.New("the node name is empty: set --hostname-override")
	}
	return name, nil
}

func parseCIDRs(flagName, value string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(value, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
