package kubeproxy

import (
	"io"
	"net/netip"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// Option configures New, InitNode and Cleanup; each With says which of
// them reads it.
type Option func(*setup)

// WithHost makes New, InitNode and Cleanup work on h instead of
// RealHost(). A nil h is ignored.
func WithHost(h *Host) Option {
	return func(s *setup) {
		if h != nil {
			s.host = h
		}
	}
}

// WithDryRun makes New's proxier a dry run: each sync prints what it
// would apply to w (iptables-restore input; for IPVS mode also the virtual
// servers and ipsets; for nftables mode the transaction, as nft -f takes
// it), and the mode's Backends use nothing of the Host: no iptables, nft,
// IPVS or kernel, no conntrack cleanup, no removal of other modes' state.
// The proxier still takes the node's addresses from Host.HostAddresses
// when its Node object has none, and Run (unlike RunOnce, which a dry run
// is meant for) opens the health servers with Host.Listen. A nil w is
// ignored. InitNode and Cleanup do not read it.
func WithDryRun(w io.Writer) Option {
	return func(s *setup) {
		if w != nil {
			s.dryRun = w
		}
	}
}

// WithProxierOptions adds opts to those New gives proxier.New (sync
// periods, health servers, conntrack cleanup, the Host's listener and
// addresses), after them, so that they win: the metrics registerer, say.
// InitNode and Cleanup do not read it.
func WithProxierOptions(opts ...proxier.Option) Option {
	return func(s *setup) { s.proxierOpts = append(s.proxierOpts, opts...) }
}

// WithExitFunc makes Config.ExitOnNodeChange call exit instead of
// flushing the logs and ending the process with os.Exit, as kube-proxy
// does; tests pass a function that records the call. A nil exit is
// ignored. InitNode and Cleanup do not read it.
func WithExitFunc(exit func(code int)) Option {
	return func(s *setup) {
		if exit != nil {
			s.exit = exit
		}
	}
}

// setup is one call of New, InitNode or Cleanup: the Config it works
// with, a copy of the caller's, and its options.
type setup struct {
	cfg  Config
	host *Host
	// dryRun receives a dry run's output; nil when not in one.
	dryRun      io.Writer
	proxierOpts []proxier.Option
	// exit is what ExitOnNodeChange calls.
	exit func(code int)
	// names and nftTable are what the proxier owns in the kernel with
	// cfg.ChainPrefix, in every mode.
	names    *ipvsmode.Names
	nftTable string
}

// newSetup validates cfg and applies opts.
func newSetup(cfg *Config, opts []Option) (*setup, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &setup{cfg: *cfg, exit: exitProcess}
	for _, o := range opts {
		o(s)
	}
	if s.host == nil {
		s.host = RealHost()
	}
	s.names = s.cfg.names()
	s.nftTable = s.cfg.nftTable()
	return s, nil
}

// New returns a proxier in cfg.Mode for node nodeName, watching client
// (see proxier.New), not yet running: Run or RunOnce it. The mode's
// Backends are made when Run or RunOnce learns the node's addresses, and
// only then does the node set-up happen, unless in a dry run: conntrack
// tuning, the other modes' state removed (see Cleanup), route_localnet
// for localhost node ports in iptables mode, and in IPVS mode the
// kernel's check (a kernel that cannot run it fails Run with the reason)
// and its sysctls. The IP families proxied are those kube-proxy would
// proxy: the node's primary one (that of its first address, IPv4 when it
// has none), and the other one too whenever the host supports both,
// whether or not the Node lists an address of it. A family is supported
// unless the kernel has IPv6 off or none (for IPv6), or, in iptables and
// IPVS mode, its iptables (or ip6tables) does not work here; Run fails
// when the primary one is not supported, or in nftables mode when the nft
// of a family proxied cannot be used. A dry run proxies the families the
// node has addresses of.
// New fails when cfg does not validate or proxier.New fails. cfg is
// copied: later changes to it have no effect.
func New(client kubernetes.Interface, nodeName string, cfg *Config, opts ...Option) (*proxier.Proxier, error) {
	s, err := newSetup(cfg, opts)
	if err != nil {
		return nil, err
	}
	return proxier.New(client, nodeName, s.newBackends(), append(s.proxierOptions(), s.proxierOpts...)...)
}

// proxierOptions are the proxier's options from the Config and Host: the
// sync periods, conntrack cleanup (not in a dry run), the health servers,
// the listener, the host's addresses, and the exit on a node change.
func (s *setup) proxierOptions() []proxier.Option {
	opts := []proxier.Option{
		proxier.WithSyncPeriods(s.cfg.MinSyncPeriod, s.cfg.syncPeriod()),
		proxier.WithProxyHealthServer(s.cfg.HealthzBindAddress),
		proxier.WithServiceHealthServer(func(n proxier.Node) []netip.Addr { return s.cfg.healthCheckAddresses(n) }),
		proxier.WithListenFunc(s.host.Listen),
		proxier.WithHostAddresses(s.host.HostAddresses),
	}
	if s.dryRun == nil && s.host.Conntrack != nil {
		opts = append(opts, proxier.WithConntrack(conntrack.NewCleaner(s.host.Conntrack)))
	}
	if s.cfg.ExitOnNodeChange && s.dryRun == nil {
		// No context here: the handler logs through the global logger.
		// In NodeCIDR mode the pod ranges are part of the detection, and
		// kube-proxy exits on their change too.
		podCIDRs := s.cfg.DetectLocalMode == proxy.LocalModeNodeCIDR
		opts = append(opts, proxier.WithNodeHandler(&nodeExit{logger: klog.Background(), exit: s.exit, podCIDRs: podCIDRs}))
	}
	return opts
}
