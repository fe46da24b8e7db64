package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// This file holds every call of the modes' constructors, so that a
// change of theirs is made here alone.

// RealHost returns the machine's Host: iptables with the lock file
// XTABLES_LOCKFILE names (iptables' own variable, so that a program in a
// network namespace of its own need not wait for the host's lock), the
// kernel under /, conntrack, IPVS, nft and netlink in the calling
// thread's network namespace.
func RealHost() *Host {
	lockFile := os.Getenv("XTABLES_LOCKFILE")
	return &Host{
		DetectBackend: func(ctx context.Context) (iptables.Backend, error) {
			return iptables.DetectBackend(ctx, nil)
		},
		NewIPTables: func(ctx context.Context, p v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
			return iptables.New(ctx, p, iptables.WithBackend(b), iptables.WithLockFile(lockFile))
		},
		NewNFAcct: func() (iptables.NFAcct, error) { return iptables.NewNFAcct("") },
		Conntrack: conntrack.New(),
		Kernel:    kernel.New(),
		OpenIPVS:  ipvsmode.OpenHandles,
		NewNFTables: func(_ context.Context, family knftables.Family, table string) (knftables.Interface, error) {
			return knftables.New(family, table)
		},
		OpenEBPF: func(cfg ebpf.DatapathConfig) (ebpf.Maps, error) {
			dp, err := ebpf.Open(cfg)
			if err != nil {
				return nil, err
			}
			return dp, nil
		},
		CleanupEBPF: func(cfg ebpf.DatapathConfig) (bool, error) {
			found, err := ebpf.FindLeftovers(cfg)
			if err != nil || !found {
				return false, err
			}
			return true, ebpf.Cleanup(cfg)
		},
		HostAddresses: proxier.HostAddresses,
		Listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			var lc net.ListenConfig
			return lc.Listen(ctx, network, address)
		},
	}
}

// newBackends is the proxier's backend factory for the mode: one backend
// per family of the node in iptables and nftables mode, one for all of
// them in IPVS mode, two per family in ebpf mode (nftables mode's and the
// socket load balancer's).
func (s *setup) newBackends() proxier.NewBackendsFunc {
	return func(ctx context.Context, node proxier.Node, m *proxy.Metrics) ([]proxier.BackendGroup, error) {
		var groups []proxier.BackendGroup
		var err error
		switch s.cfg.mode() {
		case ModeIPVS:
			groups, err = s.newIPVSBackends(ctx, node, m)
		case ModeNFTables:
			groups, err = s.newNFTablesBackends(ctx, node, m)
		case ModeEBPF:
			groups, err = s.newEBPFBackends(ctx, node, m)
		default:
			groups, err = s.newIPTablesBackends(ctx, node, m)
		}
		served := map[v1.IPFamily]bool{}
		for _, g := range groups {
			for _, f := range g.Families {
				served[f] = true
			}
		}
		for _, p := range s.cfg.ClusterCIDRs {
			if err == nil && !served[proxy.FamilyOf(p.Addr())] {
				klog.FromContext(ctx).Info("Ignoring a --cluster-cidr of an IP family not proxied", "cidr", p)
			}
		}
		return groups, err
	}
}

// newIPTablesBackends makes iptables mode's backends, one per family
// proxied (see families). Unless in a dry run, it tunes conntrack, removes what IPVS and
// nftables mode left, and sets route_localnet for localhost node ports.
func (s *setup) newIPTablesBackends(ctx context.Context, node proxier.Node, m *proxy.Metrics) ([]proxier.BackendGroup, error) {
	c := &s.cfg
	families, ipts, err := s.families(ctx, node)
	if err != nil {
		return nil, err
	}
	acceptInvalid := false
	var acct iptables.NFAcct
	if s.dryRun == nil {
		acceptInvalid = s.tuneConntrack(ctx)
		// A node that ran IPVS mode before keeps its rules, sets, virtual
		// servers and dummy interface until they are removed; one that
		// ran nftables mode, its tables.
		s.removeIPVSMode(ctx, ipts)
		s.removeNFTablesMode(ctx)
		acct = s.nfacct(ctx)
	}
	var groups []proxier.BackendGroup
	for i, family := range families {
		cfg := iptables.WriterConfig{
			Family:             family,
			Node:               c.nodeConfig(node.Name, family, node.IPs[family]),
			AcceptInvalid:      acceptInvalid,
			LocalhostNodePorts: c.LocalhostNodePorts,
			ChainPrefix:        s.names.Chains().Prefix(),
		}
		var ipt iptables.Interface
		opts := []iptables.ModeOption{iptables.WithMetrics(m),
			iptables.WithCheckPeriod(c.syncPeriod()), iptables.WithDriftCheckPeriod(c.DriftCheckPeriod)}
		if ipts != nil {
			ipt = ipts[i]
			if acct != nil {
				opts = append(opts, iptables.WithNFAcct(acct))
			}
		} else {
			opts = append(opts, iptables.WithDryRun(s.dryRun))
		}
		b, err := iptables.NewMode(ctx, cfg, ipt, opts...)
		if err != nil {
			return nil, err
		}
		// As kube-proxy does at start-up: without the sysctl, connections
		// to a node port on 127.0.0.1 hang (kubernetes#90259).
		if s.dryRun == nil && b.RouteLocalnet() {
			if err := s.setRouteLocalnet(ctx); err != nil {
				return nil, err
			}
		}
		groups = append(groups, proxier.BackendGroup{Backend: b, Families: []v1.IPFamily{family}})
	}
	return groups, nil
}

// nfacct opens the node's nfacct counters for iptables mode; nil when the
// host has none, which kube-proxy too only logs.
func (s *setup) nfacct(ctx context.Context) iptables.NFAcct {
	if s.host.NewNFAcct == nil {
		return nil
	}
	acct, err := s.host.NewNFAcct()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Opening the nfacct counters; the packet counters of INVALID drops and localhost node ports are not served")
		return nil
	}
	return acct
}

// setRouteLocalnet sets the sysctl that localhost node ports need.
func (s *setup) setRouteLocalnet(ctx context.Context) error {
	if _, err := s.host.Kernel.EnsureSysctlInt(ctx, kernel.SysctlRouteLocalnet, 1); err != nil {
		return fmt.Errorf("localhost node ports (--iptables-localhost-nodeports): %w", err)
	}
	return nil
}

// newIPVSBackends makes IPVS mode's one backend, for every family
// proxied (see families). Unless in a dry run, it refuses with the kernel's reason on a
// kernel that cannot run IPVS mode (after trying to load what is
// missing), sets the sysctls IPVS mode needs, and removes what iptables
// and nftables mode left.
func (s *setup) newIPVSBackends(ctx context.Context, node proxier.Node, m *proxy.Metrics) ([]proxier.BackendGroup, error) {
	var k *ipvsmode.Handles
	opts := []ipvsmode.ModeOption{ipvsmode.WithMetrics(m)}
	if s.dryRun == nil {
		if err := s.prepareIPVS(ctx); err != nil {
			return nil, err
		}
	}
	families, ipts, err := s.families(ctx, node)
	if err != nil {
		return nil, err
	}
	if s.dryRun == nil {
		if k, err = s.host.OpenIPVS(ctx, true); err != nil {
			return nil, fmt.Errorf("--mode ipvs: %w", err)
		}
		if err := s.tuneIPVS(ctx, k.IPVS); err != nil {
			k.Close()
			return nil, err
		}
		s.tuneConntrack(ctx)
		s.removeIPTablesMode(ctx, ipts)
		s.removeNFTablesMode(ctx)
	} else {
		opts = append(opts, ipvsmode.WithDryRun(s.dryRun))
	}
	opts = append(opts, ipvsmode.WithExcludeCIDRs(s.cfg.IPVSExcludeCIDRs...))
	var cfgs []ipvsmode.WriterConfig
	for _, family := range families {
		cfgs = append(cfgs, s.ipvsTranslatorConfig(node, family))
	}
	b, err := ipvsmode.NewMode(ctx, cfgs, k, ipts, opts...)
	if err != nil {
		k.Close()
		return nil, err
	}
	return []proxier.BackendGroup{{Backend: b, Families: families}}, nil
}

// prepareIPVS refuses, with the kernel's reason, a kernel that cannot run
// IPVS mode, after trying to load what is missing.
func (s *setup) prepareIPVS(ctx context.Context) error {
	if err := s.host.Kernel.CanUseIPVS(ctx, s.cfg.ipvsSchedulers()...); err != nil {
		return fmt.Errorf("--mode ipvs: %w", err)
	}
	return nil
}

// tuneIPVS sets the sysctls IPVS mode needs, then what IPVSTuning asks
// for, the timeouts through iface (which may be nil when it asks for
// none).
func (s *setup) tuneIPVS(ctx context.Context, iface ipvs.Interface) error {
	if err := ipvsmode.TuneKernel(ctx, s.host.Kernel); err != nil {
		return err
	}
	return ipvsmode.Tune(ctx, s.host.Kernel, iface, s.cfg.IPVSTuning)
}

// ipvsTranslatorConfig is the translator config of family on node.
func (s *setup) ipvsTranslatorConfig(node proxier.Node, family v1.IPFamily) ipvsmode.WriterConfig {
	c := &s.cfg
	return ipvsmode.WriterConfig{
		Family:      family,
		Node:        c.nodeConfig(node.Name, family, node.IPs[family]),
		Scheduler:   c.IPVSScheduler,
		ChainPrefix: s.names.Chains().Prefix(),
	}
}

// newNFTablesBackends makes nftables mode's backends, one per family
// proxied (see families), each writing its family's table. Unless in a
// dry run, it tunes conntrack and removes what iptables and IPVS mode
// left. It fails when the nft of a family proxied cannot be used here.
func (s *setup) newNFTablesBackends(ctx context.Context, node proxier.Node, m *proxy.Metrics) ([]proxier.BackendGroup, error) {
	c := &s.cfg
	families, _, err := s.families(ctx, node)
	if err != nil {
		return nil, err
	}
	if s.dryRun == nil {
		s.tuneConntrack(ctx)
		s.removeIPTablesModes(ctx)
		if s.cfg.mode() == ModeNFTables {
			s.removeEBPFMode(ctx)
		}
	}
	var groups []proxier.BackendGroup
	for _, family := range families {
		cfg := nftables.WriterConfig{
			Family:    family,
			TableName: s.nftTable,
			Node:      c.nodeConfig(node.Name, family, node.IPs[family]),
		}
		var nft knftables.Interface
		opts := []nftables.ModeOption{nftables.WithMetrics(m), nftables.WithCheckPeriod(c.syncPeriod())}
		if s.dryRun != nil {
			opts = append(opts, nftables.WithDryRun(s.dryRun))
		} else {
			h := s.host
			var err error
			nft, err = h.NewNFTables(ctx, nftFamily(family), s.nftTable)
			if err != nil {
				// As kube-proxy, which fails to start when the nft of
				// a family it decided to proxy does not work.
				return nil, fmt.Errorf("--mode nftables: %s: %w", family, err)
			}
			if h.NFTTableLookup != nil {
				opts = append(opts, nftables.WithTableLookup(h.NFTTableLookup(nftFamily(family), s.nftTable)))
			}
		}
		b, err := nftables.NewMode(ctx, cfg, nft, opts...)
		if err != nil {
			return nil, err
		}
		groups = append(groups, proxier.BackendGroup{Backend: b, Families: []v1.IPFamily{family}})
	}
	return groups, nil
}

// newEBPFBackends makes ebpf mode's backends: nftables mode's, one per
// family proxied, for the packets that reach the node from outside (node
// ports, external IPs, load-balancer VIPs), and an ebpf.Mode per family in
// a group of its own, which sends the sockets of the configured cgroup
// straight to an endpoint when they connect. Both groups of a family
// program every Service: a connection the socket load balancer
// translated never carries a Service address, so nftables' rules never
// see it, and a packet from outside never passes a local socket's
// connect. A dry run prints nftables mode's transactions, then the
// elements the socket load balancer's writer would hold in each family's
// maps, loading and attaching nothing.
func (s *setup) newEBPFBackends(ctx context.Context, node proxier.Node, m *proxy.Metrics) ([]proxier.BackendGroup, error) {
	if s.dryRun == nil && s.cfg.EBPF.CgroupPath == "" {
		return nil, errors.New("--mode ebpf: no cgroup to attach to (Config.EBPF.CgroupPath)")
	}
	groups, err := s.newNFTablesBackends(ctx, node, m)
	if err != nil {
		return groups, err
	}
	if s.dryRun == nil && s.host.OpenEBPF == nil {
		return nil, errors.New("--mode ebpf: the Host cannot open the socket load balancer (no OpenEBPF)")
	}
	c := &s.cfg
	for _, family := range groupFamilies(groups) {
		// A dry run's Modes have no maps: they write to memory and
		// print what they hold.
		var maps ebpf.Maps
		opts := []ebpf.ModeOption{ebpf.WithMetrics(m), ebpf.WithDriftCheckPeriod(c.syncPeriod())}
		if s.dryRun != nil {
			opts = append(opts, ebpf.WithDryRun(s.dryRun))
		} else if maps, err = s.host.OpenEBPF(c.EBPF.datapath(family)); err != nil {
			closeGroups(groups)
			return nil, fmt.Errorf("--mode ebpf: %s: %w", family, err)
		}
		cfg := ebpf.WriterConfig{Family: family, Node: c.nodeConfig(node.Name, family, node.IPs[family])}
		b, err := ebpf.NewMode(ctx, cfg, maps, opts...)
		if err != nil {
			if cl, ok := maps.(io.Closer); ok {
				cl.Close()
			}
			closeGroups(groups)
			return nil, err
		}
		groups = append(groups, proxier.BackendGroup{Backend: b, Families: []v1.IPFamily{family}})
	}
	return groups, nil
}

// groupFamilies lists the families of groups, each once, in their order.
func groupFamilies(groups []proxier.BackendGroup) []v1.IPFamily {
	var out []v1.IPFamily
	for _, g := range groups {
		for _, f := range g.Families {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// closeGroups closes the Backends of groups that are io.Closers, after a
// failure that leaves them unused.
func closeGroups(groups []proxier.BackendGroup) {
	for _, g := range groups {
		if c, ok := g.Backend.(io.Closer); ok {
			c.Close()
		}
	}
}

// cleanupIPVSNode removes IPVS mode's ipsets, virtual servers and dummy
// interface. It loads no module to do so: without ip_vs there is no
// virtual server, and without ip_set no set.
func (s *setup) cleanupIPVSNode(ctx context.Context) error {
	mods, err := s.host.Kernel.Modules(ctx)
	if err != nil {
		return fmt.Errorf("cleanup of IPVS mode: %w", err)
	}
	node, err := s.host.OpenIPVS(ctx, mods.Has(kernel.ModuleIPVS))
	if err != nil {
		return fmt.Errorf("cleanup of IPVS mode: %w", err)
	}
	defer node.Close()
	prefix := s.names.Chains().Prefix()
	cfg := ipvsmode.CleanupConfig{ChainPrefix: prefix, ExcludeCIDRs: s.cfg.IPVSExcludeCIDRs}
	// Virtual servers and the dummy interface carry no prefix: with
	// another than kube-proxy's, they may be kube-proxy's, so they stay.
	if prefix == iptables.DefaultChainPrefix {
		cfg.Binder = node.Binder
		if node.IPVS != nil {
			cfg.IPVS = node.IPVS
		}
	} else {
		klog.FromContext(ctx).Info("Leaving IPVS virtual servers and the dummy interface: they are not named by --chain-prefix", "chainPrefix", prefix)
	}
	if mods.Has(kernel.ModuleIPSet) {
		cfg.IPSets = node.IPSets
	}
	return ipvsmode.Cleanup(ctx, cfg)
}
