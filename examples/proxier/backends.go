package main

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/iptablesbackend"
	"github.com/proxykit/proxykit/proxier/nftablesbackend"
	"github.com/proxykit/proxykit/proxy"
)

// newBackends is the proxier's backend factory for --mode: one backend per
// family of the node in iptables and nftables mode, one for all of them in
// IPVS mode.
// A family whose iptables cannot be used here is dropped unless it is the
// node's primary one, as kube-proxy falls back to single stack.
func newBackends(o *options, env *environment) proxier.NewBackendsFunc {
	return func(ctx context.Context, node proxier.Node, m *proxier.BackendMetrics) ([]proxier.BackendGroup, error) {
		logger := klog.FromContext(ctx)
		for _, p := range o.clusterCIDRs {
			if _, ok := node.IPs[familyOf(p.Addr())]; !ok {
				logger.Info("Ignoring a --cluster-cidr of an IP family the node does not have", "cidr", p)
			}
		}
		switch o.mode {
		case modeIPVS:
			return newIPVSBackends(ctx, o, env, node, m)
		case modeNFTables:
			return newNFTablesBackends(ctx, o, env, node, m)
		}
		return newIPTablesBackends(ctx, o, env, node, m)
	}
}

// newIPTablesBackends makes iptables mode's backends, one per family of
// node. Unless in a dry run, it tunes conntrack, removes what IPVS mode
// left, and sets route_localnet for localhost node ports.
func newIPTablesBackends(ctx context.Context, o *options, env *environment, node proxier.Node, m *proxier.BackendMetrics) ([]proxier.BackendGroup, error) {
	var ipts []iptables.Interface
	families := node.Families
	acceptInvalid := false
	if !o.dryRun {
		var err error
		if ipts, families, err = familyIPTables(ctx, env, families); err != nil {
			return nil, err
		}
		acceptInvalid = tuneConntrack(ctx, env.kernel, o.conntrack)
		// A node that ran IPVS mode before keeps its rules, sets, virtual
		// servers and dummy interface until they are removed; one that
		// ran nftables mode, its tables.
		removeIPVSMode(ctx, env, o.names, ipts)
		removeNFTablesMode(ctx, env, o.nftTable)
	}
	var groups []proxier.BackendGroup
	for i, family := range families {
		cfg := iptables.WriterConfig{
			Family:             family,
			Node:               proxy.NodeConfig{Name: node.Name, NodePortAddresses: nodePortPrefixes(o, family, node.IPs[family]), ClusterCIDRs: []netip.Prefix{o.clusterCIDR(family)}, MasqueradeAll: o.masqueradeAll, MasqueradeBit: o.masqueradeBit},
			AcceptInvalid:      acceptInvalid,
			LocalhostNodePorts: o.localhostNodePorts,
			ChainPrefix:        o.names.Chains().Prefix(),
		}
		var ipt iptables.Interface
		if ipts != nil {
			ipt = ipts[i]
		}
		b, err := iptablesbackend.New(ctx, cfg, ipt, iptablesbackend.WithDryRun(env.stdout), iptablesbackend.WithMetrics(m),
			iptablesbackend.WithCanaryInterval(o.syncPeriod), iptablesbackend.WithDriftCheckPeriod(o.driftCheckPeriod))
		if err != nil {
			return nil, err
		}
		// As kube-proxy does at start-up: without the sysctl, connections
		// to a node port on 127.0.0.1 hang (kubernetes#90259).
		if !o.dryRun && b.RouteLocalnet() {
			if _, err := env.kernel.EnsureSysctlInt(ctx, kernel.SysctlRouteLocalnet, 1); err != nil {
				return nil, fmt.Errorf("localhost node ports (--iptables-localhost-nodeports): %w", err)
			}
		}
		groups = append(groups, proxier.BackendGroup{Backend: b, Families: []v1.IPFamily{family}})
	}
	return groups, nil
}

// newIPVSBackends makes IPVS mode's one backend, for every family of
// node. Unless in a dry run, it refuses with the kernel's reason on a
// kernel that cannot run IPVS mode (after trying to load what is
// missing), sets the sysctls IPVS mode needs, and removes what iptables
// mode left.
func newIPVSBackends(ctx context.Context, o *options, env *environment, node proxier.Node, m *proxier.BackendMetrics) ([]proxier.BackendGroup, error) {
	var ipts []iptables.Interface
	var k *ipvsmode.Handles
	families := node.Families
	if !o.dryRun {
		if err := env.kernel.CanUseIPVS(ctx, o.ipvsSchedulers()...); err != nil {
			return nil, fmt.Errorf("--mode ipvs: %w", err)
		}
		var err error
		if ipts, families, err = familyIPTables(ctx, env, families); err != nil {
			return nil, err
		}
		if k, err = env.openIPVS(ctx, true); err != nil {
			return nil, fmt.Errorf("--mode ipvs: %w", err)
		}
		if err := ipvsmode.TuneKernel(ctx, env.kernel); err != nil {
			k.Close()
			return nil, err
		}
		tuneConntrack(ctx, env.kernel, o.conntrack)
		removeIPTablesMode(ctx, o.names, ipts)
		removeNFTablesMode(ctx, env, o.nftTable)
	}
	var cfgs []ipvsmode.WriterConfig
	for _, family := range families {
		cfgs = append(cfgs, ipvsTranslatorConfig(o, node, family))
	}
	b, err := ipvsmode.NewMode(cfgs, k, ipts, ipvsmode.WithDryRun(env.stdout), ipvsmode.WithMetrics(m))
	if err != nil {
		k.Close()
		return nil, err
	}
	return []proxier.BackendGroup{{Backend: b, Families: families}}, nil
}

// newNFTablesBackends makes nftables mode's backends, one per family of
// node, each writing its family's table named o.nftTable. Unless in a dry
// run, it tunes conntrack and removes what iptables and IPVS mode left. A
// family other than the primary whose nft cannot be used here is dropped,
// with a log, as iptables mode drops one whose iptables does not work.
func newNFTablesBackends(ctx context.Context, o *options, env *environment, node proxier.Node, m *proxier.BackendMetrics) ([]proxier.BackendGroup, error) {
	logger := klog.FromContext(ctx)
	if !o.dryRun {
		tuneConntrack(ctx, env.kernel, o.conntrack)
		removeIPTablesModes(ctx, env, o.names)
	}
	var groups []proxier.BackendGroup
	for i, family := range node.Families {
		cfg := nftables.WriterConfig{
			Family:    family,
			TableName: o.nftTable,
			Node:      proxy.NodeConfig{Name: node.Name, NodePortAddresses: nodePortPrefixes(o, family, node.IPs[family]), ClusterCIDRs: []netip.Prefix{o.clusterCIDR(family)}, MasqueradeAll: o.masqueradeAll, MasqueradeBit: o.masqueradeBit},
		}
		var nft knftables.Interface
		opts := []nftablesbackend.Option{nftablesbackend.WithDryRun(env.stdout), nftablesbackend.WithMetrics(m),
			nftablesbackend.WithCheckInterval(o.syncPeriod)}
		if !o.dryRun {
			var err error
			nft, err = env.newNFTables(ctx, nftFamily(family), o.nftTable)
			if err != nil && i == 0 {
				return nil, fmt.Errorf("--mode nftables: %s: %w", family, err)
			}
			if err != nil {
				logger.Error(err, "Not proxying this IP family", "ipFamily", family)
				continue
			}
			if env.nftApplyElements != nil {
				opts = append(opts, nftablesbackend.WithSplitFirstLoad(env.nftApplyElements))
			}
			if env.nftApplyBatch != nil {
				opts = append(opts, nftablesbackend.WithNetlinkElementSyncs(env.nftApplyBatch))
			}
			if env.nftTableLookup != nil {
				opts = append(opts, nftablesbackend.WithTableLookup(env.nftTableLookup(nftFamily(family), o.nftTable)))
			}
		}
		b, err := nftablesbackend.New(ctx, cfg, nft, opts...)
		if err != nil {
			return nil, err
		}
		groups = append(groups, proxier.BackendGroup{Backend: b, Families: []v1.IPFamily{family}})
	}
	return groups, nil
}

// nftFamily is the nft family of an IP family's table.
func nftFamily(family v1.IPFamily) knftables.Family {
	if family == v1.IPv6Protocol {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// familyIPTables returns the iptables Interface of each of families, of
// the backend (legacy or nft) this node uses, and the families it
// returned one for. A family other than the primary (the first) whose
// iptables does not work is dropped, with a log.
func familyIPTables(ctx context.Context, env *environment, families []v1.IPFamily) ([]iptables.Interface, []v1.IPFamily, error) {
	logger := klog.FromContext(ctx)
	b, err := env.detectBackend(ctx)
	if err != nil {
		return nil, nil, err
	}
	var ipts []iptables.Interface
	var usable []v1.IPFamily
	for i, family := range families {
		ipt, err := usableIPTables(ctx, env, family, b)
		if err != nil && i == 0 {
			return nil, nil, err
		}
		if err != nil {
			logger.Error(err, "Not proxying this IP family", "ipFamily", family)
			continue
		}
		ipts = append(ipts, ipt)
		usable = append(usable, family)
	}
	return ipts, usable, nil
}

func usableIPTables(ctx context.Context, env *environment, family v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
	proto := v1.IPv4Protocol
	if family == v1.IPv6Protocol {
		proto = v1.IPv6Protocol
	}
	ipt, err := env.newIPTables(ctx, proto, b)
	if err != nil {
		return nil, fmt.Errorf("%s iptables (%s): %w", family, b, err)
	}
	if err := ipt.Present(ctx); err != nil {
		return nil, fmt.Errorf("%s iptables (%s): %w", family, b, err)
	}
	return ipt, nil
}

// tuneConntrack applies t (nil: the timeouts kube-proxy sets by default,
// which are per network namespace), and reports whether
// nf_conntrack_tcp_be_liberal is on (then out-of-window TCP packets are
// not INVALID, and the rule dropping INVALID packets is left out, as
// kube-proxy does: kubernetes#117924). nf_conntrack_max is left alone
// unless a --config file sets conntrack.maxPerCore: it is host-wide, and
// lowering the host's limit is not an example's call by default.
func tuneConntrack(ctx context.Context, k *kernel.Kernel, t *conntrack.Tuning) bool {
	logger := klog.FromContext(ctx)
	if t == nil {
		t = &conntrack.Tuning{TCPEstablishedTimeout: defaultTCPEstablishedTimeout, TCPCloseWaitTimeout: defaultTCPCloseWaitTimeout}
	}
	err := conntrack.Tune(ctx, k, *t)
	if err != nil {
		logger.Error(err, "Tuning conntrack; going on with the kernel's settings")
	}
	v, err := k.ReadSysctlInt("net/netfilter/nf_conntrack_tcp_be_liberal")
	return err == nil && v == 1
}

// ipvsTranslatorConfig is the translator config of family on this node.
func ipvsTranslatorConfig(o *options, node proxier.Node, family v1.IPFamily) ipvsmode.WriterConfig {
	return ipvsmode.WriterConfig{
		Family:      family,
		Node:        proxy.NodeConfig{Name: node.Name, NodePortAddresses: nodePortPrefixes(o, family, node.IPs[family]), ClusterCIDRs: []netip.Prefix{o.clusterCIDR(family)}, MasqueradeAll: o.masqueradeAll, MasqueradeBit: o.masqueradeBit},
		Scheduler:   o.ipvsScheduler,
		ChainPrefix: o.names.Chains().Prefix(),
	}
}
