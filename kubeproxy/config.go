package kubeproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxy"
)

// Proxy modes, as KubeProxyConfiguration's mode and kube-proxy's
// --proxy-mode name them.
const (
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
	ModeNFTables = "nftables"
	// ModeEBPF is proxykit's own: the socket load balancer of package
	// ebpf for the sockets of one cgroup, beside nftables mode for the
	// packets that arrive from outside the node. No
	// KubeProxyConfiguration names it.
	ModeEBPF = "ebpf"
)

// kube-proxy's conntrack timeouts for a configuration that leaves them
// unset; New and InitNode set them when Config.Conntrack is nil.
const (
	DefaultTCPEstablishedTimeout = 24 * time.Hour
	DefaultTCPCloseWaitTimeout   = time.Hour
)

// Config is what a proxier runs with: the settings of a
// KubeProxyConfiguration that proxykit implements, resolved (defaults
// applied, one value per setting whether it came from a file or a flag),
// and proxykit's own. It holds no client and no node name: those are New's
// arguments. The zero value of a field means what its doc says, so that a
// caller fills in only what it sets.
type Config struct {
	// Mode is ModeIPTables, ModeIPVS, ModeNFTables or ModeEBPF; "" means
	// iptables.
	Mode string
	// EBPF is where ebpf mode attaches and pins; New in ModeEBPF needs
	// its CgroupPath outside a dry run. Cleanup, and the start of another mode, remove what
	// ebpf mode pinned under its PinPath and NamePrefix.
	EBPF EBPFConfig
	// ClusterCIDRs is the pod network, at most one prefix per IP family.
	// Traffic to cluster IPs from outside it is masqueraded; a prefix of a
	// family the node does not have is ignored, with a log.
	ClusterCIDRs []netip.Prefix
	// DetectLocalMode, BridgeInterface and InterfaceNamePrefix say how
	// traffic from this node's pods is told from other traffic, as
	// proxy.NodeConfig's fields of the same names (kube-proxy's
	// detectLocalMode and detectLocal); "" means ClusterCIDR, by
	// ClusterCIDRs. NodeCIDR mode reads the Node's spec.podCIDRs, and
	// detects nothing until the node has one (it does not wait for it as
	// kube-proxy does).
	DetectLocalMode     proxy.LocalMode
	BridgeInterface     string
	InterfaceNamePrefix string
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit, 0 to 31, that marks packets to
	// masquerade; nil means kube-proxy's, 14.
	MasqueradeBit *int
	// NodePortAddresses are the prefixes of the node addresses that serve
	// node ports; nil means every local address. NodePortPrimary, instead,
	// means the node's own addresses (kube-proxy's "primary"); with it,
	// NodePortAddresses is not read.
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool
	// LocalhostNodePorts serves IPv4 node ports on 127.0.0.1 too in
	// iptables mode, when the node-port addresses include it (the default,
	// every address, does; NodePortPrimary does not): it sets
	// route_localnet and drops other hosts' packets to 127.0.0.0/8. The
	// other modes do not read it.
	LocalhostNodePorts bool
	// SyncPeriod is the longest time between syncs, and how often the
	// iptables and nftables modes check that their state is still there;
	// MinSyncPeriod the shortest. Zero SyncPeriod means
	// proxy.DefaultSyncPeriod; zero MinSyncPeriod means no wait.
	SyncPeriod, MinSyncPeriod time.Duration
	// DriftCheckPeriod is how often iptables mode compares its rules with
	// what it wrote; zero turns the check off.
	DriftCheckPeriod time.Duration
	// ChainPrefix prefixes every iptables chain and ipset the proxier
	// owns, and names its nftables table (see NFTablesTable); "" means
	// kube-proxy's, KUBE. Cleanup and the removal of other modes' state
	// touch this prefix's only.
	ChainPrefix string
	// Conntrack is the conntrack tuning; nil means kube-proxy's default
	// timeouts (DefaultTCPEstablishedTimeout, DefaultTCPCloseWaitTimeout)
	// and nf_conntrack_max left alone.
	Conntrack *conntrack.Tuning
	// IPVSScheduler is the scheduler of IPVS mode's virtual servers; ""
	// means rr. The other modes do not read it.
	IPVSScheduler string
	// IPVSExcludeCIDRs are kube-proxy's ipvs.excludeCIDRs: IPVS mode's
	// syncs, and Cleanup (whatever the mode), leave alone the virtual
	// servers whose address is in one of them, which belong to someone
	// else; they delete every other virtual server they do not want.
	// The other modes do not read it.
	IPVSExcludeCIDRs []netip.Prefix
	// IPVSTuning is kube-proxy's ipvs.strictARP and IPVS connection
	// timeouts, which IPVS mode (New, when the Backend is made, and
	// InitNode) sets with ipvsmode.Tune after the sysctls IPVS mode
	// always sets; the zero value sets nothing. The other modes do not
	// read it.
	IPVSTuning ipvsmode.Tuning
	// HealthzBindAddress is the proxy health server's "IP:port"; "" turns
	// it off.
	HealthzBindAddress string
	// MetricsBindAddress is where the caller serves /metrics ("IP:port";
	// "" for nowhere). New does not read it: the proxier's metrics go to
	// the registerer given with WithProxierOptions.
	MetricsBindAddress string
	// ExitOnNodeChange makes the proxier exit the process with status 1,
	// as kube-proxy does, when this node's Node object is deleted or its
	// node IPs change from those of the first list (kube-proxy's node
	// IPs: its first address, InternalIP before ExternalIP, and the first
	// of the other family), or, in NodeCIDR mode, its spec.podCIDRs
	// change, so that the process restarts with the new ones. false, the default, follows the new addresses without a
	// restart: the node ports and the health-check node ports move to
	// them, and NodeCIDR detection to the new pod ranges. Either way the change is logged with the old and the new
	// addresses. WithExitFunc replaces the exit. It is proxykit's own
	// setting, not a KubeProxyConfiguration field.
	ExitOnNodeChange bool
}

// Validate checks c as New, InitNode and Cleanup do before they touch
// anything. It names the field at fault, in Config's terms; a caller that
// takes its values from flags or a file checks them first to name those.
func (c *Config) Validate() error {
	var errs []error
	switch c.Mode {
	case "", ModeIPTables, ModeIPVS, ModeNFTables, ModeEBPF:
	default:
		errs = append(errs, fmt.Errorf("kubeproxy.Config: Mode %q: want %q, %q, %q or %q", c.Mode, ModeIPTables, ModeIPVS, ModeNFTables, ModeEBPF))
	}
	if err := OnePerFamily("kubeproxy.Config: ClusterCIDRs", c.ClusterCIDRs); err != nil {
		errs = append(errs, err)
	}
	local := proxy.NodeConfig{DetectLocalMode: c.DetectLocalMode, BridgeInterface: c.BridgeInterface, InterfaceNamePrefix: c.InterfaceNamePrefix}
	if _, err := local.LocalDetector(v1.IPv4Protocol, nil); err != nil {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: %w", err))
	}
	if b := c.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: MasqueradeBit %d: must be within the range [0, 31]", *b))
	}
	if c.SyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: SyncPeriod %v: must not be negative", c.SyncPeriod))
	}
	if c.MinSyncPeriod < 0 || c.MinSyncPeriod > c.syncPeriod() {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: MinSyncPeriod %v: must be between 0 and SyncPeriod (%v)", c.MinSyncPeriod, c.syncPeriod()))
	}
	if c.DriftCheckPeriod < 0 {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: DriftCheckPeriod %v: must not be negative", c.DriftCheckPeriod))
	}
	if _, err := ipvsmode.NewNames(c.ChainPrefix); err != nil {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: ChainPrefix: %w", err))
	}
	if err := c.IPVSTuning.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("kubeproxy.Config: IPVSTuning: %w", err))
	}
	if c.IPVSScheduler != "" {
		if _, err := kernel.IPVSSchedulerModule(c.IPVSScheduler); err != nil {
			errs = append(errs, fmt.Errorf("kubeproxy.Config: IPVSScheduler: %w", err))
		}
	}
	return errors.Join(errs...)
}

// mode is c.Mode, iptables when empty.
// EBPFConfig says where ebpf mode's programs attach and what they pin.
type EBPFConfig struct {
	// CgroupPath is the cgroup v2 directory whose processes' sockets are
	// translated, with those of the cgroups below it (the root of the
	// node's cgroup2 mount, to serve every process).
	CgroupPath string
	// PinPath and NamePrefix are ebpf.DatapathConfig's: the bpffs
	// directory and the prefix of the pinned maps and links; "" means
	// ebpf.DefaultPinPath and ebpf.DefaultNamePrefix.
	PinPath, NamePrefix string
}

// datapath is the DatapathConfig of family ("" for both, in Cleanup).
func (e EBPFConfig) datapath(family v1.IPFamily) ebpf.DatapathConfig {
	return ebpf.DatapathConfig{Family: family, CgroupPath: e.CgroupPath, PinPath: e.PinPath, NamePrefix: e.NamePrefix}
}

// nftablesBased reports whether the mode writes nftables mode's tables:
// nftables mode, and ebpf mode, which runs it beside the socket load
// balancer.
func (c *Config) nftablesBased() bool {
	return c.mode() == ModeNFTables || c.mode() == ModeEBPF
}

func (c *Config) mode() string {
	if c.Mode == "" {
		return ModeIPTables
	}
	return c.Mode
}

func (c *Config) syncPeriod() time.Duration {
	if c.SyncPeriod == 0 {
		return proxy.DefaultSyncPeriod
	}
	return c.SyncPeriod
}

// names are the chains and ipsets of either mode with c.ChainPrefix, which
// Validate has checked.
func (c *Config) names() *ipvsmode.Names {
	n, err := ipvsmode.NewNames(c.ChainPrefix)
	if err != nil {
		panic(fmt.Sprintf("kubeproxy: ChainPrefix not validated: %v", err))
	}
	return n
}

// nftTable is nftables mode's table of c.ChainPrefix.
func (c *Config) nftTable() string {
	return NFTablesTable(c.names().Chains().Prefix())
}

// nodeConfig is the node config of the writers of family on node, whose
// addresses of the family are ips.
func (c *Config) nodeConfig(name string, family v1.IPFamily, ips []netip.Addr) proxy.NodeConfig {
	return proxy.NodeConfig{Name: name, NodePortAddresses: c.nodePortPrefixes(family, ips), NodePortPrimary: c.NodePortPrimary, ClusterCIDRs: []netip.Prefix{c.clusterCIDR(family)},
		DetectLocalMode: c.DetectLocalMode, BridgeInterface: c.BridgeInterface, InterfaceNamePrefix: c.InterfaceNamePrefix,
		MasqueradeAll: c.MasqueradeAll, MasqueradeBit: c.MasqueradeBit}
}

// clusterCIDR returns the ClusterCIDRs prefix of family, or the zero
// Prefix.
func (c *Config) clusterCIDR(family v1.IPFamily) netip.Prefix {
	for _, p := range c.ClusterCIDRs {
		if proxy.FamilyOf(p.Addr()) == family {
			return p
		}
	}
	return netip.Prefix{}
}

// ipvsSchedulers returns the IPVS schedulers whose modules IPVS mode
// needs: none for the default, else IPVSScheduler's.
func (c *Config) ipvsSchedulers() []string {
	if c.IPVSScheduler == "" {
		return nil
	}
	return []string{c.IPVSScheduler}
}

// NFTablesTable is the nftables table of chain prefix p: p lower-cased and
// "-proxy", so that kube-proxy's prefix, KUBE, names kube-proxy's table.
// One prefix names all a proxier owns in the kernel, in every mode: a
// proxier given a prefix of its own to run beside kube-proxy (or another
// proxier) also gets a table of its own, and its mode switches and
// cleanup leave the other's table alone. Prefixes that differ only in
// case name the same table. A valid prefix starts with a letter, so the
// name is one nft takes.
func NFTablesTable(p string) string { return strings.ToLower(p) + "-proxy" }

// OnePerFamily fails, naming field, when prefixes hold two of one IP
// family; none is no error.
func OnePerFamily(field string, prefixes []netip.Prefix) error {
	seen := map[v1.IPFamily]netip.Prefix{}
	for _, p := range prefixes {
		f := proxy.FamilyOf(p.Addr())
		if prev, ok := seen[f]; ok {
			return fmt.Errorf("%s: %s and %s are both %s; give at most one per IP family", field, prev, p, f)
		}
		seen[f] = p
	}
	return nil
}
