package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/kernel"
)

// ipvsBackend is IPVS mode for every IP family of the node at once: an
// ipvs.Translator per family renders the virtual servers, the ipsets and
// the few iptables rules IPVS mode needs, and one ipvs.Applier applies the
// translations of all families together. The Applier has to see them all
// in one call, because the kernel keeps the virtual servers and the
// ipsets of both families in one table and its reconcilers remove
// whatever they are not given; so the families share one backend, and one
// runner syncs them (see syncGroup). Every sync is full: the reconcilers
// make one that changes nothing write nothing.
type ipvsBackend struct {
	translators  []*ipvs.Translator
	translations []ipvs.Translation
	// applier applies the translations; nil in a dry run, which prints
	// them to out instead.
	applier *ipvs.Applier
	// terminator deletes the real servers the applier left draining.
	terminator *ipvs.GracefulTerminator
	out        io.Writer
	// node is the kernel side (nil in a dry run). Its binder also tells
	// the node's addresses, read before every sync so that node ports
	// follow addresses that come and go.
	node    *ipvsNode
	metrics *metrics
}

var _ backend = (*ipvsBackend)(nil)

// ipvsNode is what IPVS mode programs in this network namespace besides
// iptables: the IPVS table, the dummy interface that holds the service
// addresses, and the ipsets.
type ipvsNode struct {
	// table is nil when the kernel has no IPVS loaded, which only a
	// cleanup accepts: there are no virtual servers to remove then.
	table  ipvs.Interface
	binder nodeBinder
	sets   ipset.Interface
	// close releases the netlink sockets.
	close func()
}

// nodeBinder binds service addresses to the dummy interface and tells the
// node's own addresses, as ipvs.DummyBinder does.
type nodeBinder interface {
	ipvs.AddressBinder
	NodeAddresses(ctx context.Context, dummy string) ([]netip.Addr, error)
}

// openIPVSNode opens IPVS mode's kernel side in the caller's network
// namespace, with the IPVS table when table is set. The kernel must have
// been checked (kernel.CanUseIPVS, which also loads missing modules)
// before: ipvs.New is told not to check it again.
func openIPVSNode(ctx context.Context, table bool) (*ipvsNode, error) {
	n := &ipvsNode{}
	var closers []func()
	n.close = func() {
		for _, c := range closers {
			c()
		}
	}
	if table {
		lb, err := ipvs.New(ctx, ipvs.WithPrerequisites(nil))
		if err != nil {
			return nil, err
		}
		n.table = lb
		closers = append(closers, lb.Close)
	}
	binder, err := ipvs.NewDummyBinder("")
	if err != nil {
		n.close()
		return nil, fmt.Errorf("dummy interface %s: %w", ipvs.DummyDevice, err)
	}
	n.binder = binder
	closers = append(closers, binder.Close)
	sets, err := ipset.New()
	if err != nil {
		n.close()
		return nil, fmt.Errorf("ipsets: %w", err)
	}
	n.sets = sets
	closers = append(closers, sets.Close)
	return n, nil
}

// newIPVSBackend makes the backend of the families of cfgs, one config
// each, in order. node and ipts (one per family) are nil for a dry run.
func newIPVSBackend(cfgs []ipvs.TranslatorConfig, node *ipvsNode, ipts []iptables.Interface, out io.Writer, m *metrics) (*ipvsBackend, error) {
	b := &ipvsBackend{out: out, node: node, metrics: m, translations: make([]ipvs.Translation, len(cfgs))}
	for i, cfg := range cfgs {
		if ipts != nil {
			cfg.RandomFully = ipts[i].HasRandomFully()
		} else {
			// As in iptables mode's dry run: the output must not depend
			// on the machine.
			cfg.RandomFully = true
		}
		tr, err := ipvs.NewTranslator(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s IPVS translator: %w", cfg.IPFamily, err)
		}
		b.translators = append(b.translators, tr)
	}
	if node != nil && len(cfgs) > 0 {
		// NewTranslator took the prefix, so NewModeNames does too.
		names, err := ipvs.NewModeNames(cfgs[0].ChainPrefix)
		if err != nil {
			return nil, err
		}
		rec := ipvs.NewReconciler(node.table, node.binder)
		b.applier = ipvs.NewApplier(rec, ipset.NewReconciler(node.sets, names.SetPrefix()), ipts...)
		b.terminator = rec.Terminator()
	}
	return b, nil
}

func (b *ipvsBackend) sync(ctx context.Context, ins []*syncInput) ([]syncOutcome, error) {
	if b.node != nil {
		addrs, err := b.node.binder.NodeAddresses(ctx, "")
		if err != nil {
			return make([]syncOutcome, len(ins)), fmt.Errorf("IPVS mode: the node's addresses: %w", err)
		}
		for _, tr := range b.translators {
			if err := tr.SetNodeIPs(addrs); err != nil {
				return make([]syncOutcome, len(ins)), fmt.Errorf("IPVS mode: the node's addresses: %w", err)
			}
		}
	}
	outs := make([]syncOutcome, len(ins))
	for i, in := range ins {
		tr := b.translators[i].Translate(ctx, ipvs.TranslateInput{Services: in.services, Endpoints: in.endpoints, NodeLabels: in.nodeLabels})
		b.translations[i] = tr
		outs[i] = syncOutcome{
			full:            true,
			servicePorts:    tr.ServicePorts,
			noLocalInternal: tr.NoLocalEndpointsInternal,
			noLocalExternal: tr.NoLocalEndpointsExternal,
		}
		for _, s := range tr.Services {
			outs[i].endpoints += len(s.RealServers)
		}
	}
	if b.applier == nil {
		for _, tr := range b.translations {
			if _, err := tr.WriteTo(b.out); err != nil {
				return outs, err
			}
		}
		return outs, nil
	}
	res, err := b.applier.Apply(ctx, b.translations...)
	for _, family := range res.RestoreFailed {
		b.metrics.restoreFailures.WithLabelValues(string(family)).Inc()
	}
	klog.FromContext(ctx).V(4).Info("Applied IPVS mode", "ipsets", res.IPSets, "ipvs", res.IPVS)
	return outs, err
}

// requestFullSync does nothing: every sync is full.
func (b *ipvsBackend) requestFullSync() {}

// run sweeps the real servers that are draining, deleting each once its
// connections are gone. There is no canary to watch: each sync
// reconciles everything, jump rules included.
func (b *ipvsBackend) run(ctx context.Context, lost func()) {
	if b.terminator != nil {
		b.terminator.Run(ctx, 0)
	}
}

// IPVS mode's sysctls beyond those package kernel names.
const (
	// sysctlVSConnReuseMode 0 stops IPVS from dropping the first packet of
	// a connection that reuses the source port of one in TIME_WAIT, a
	// one-second stall on kernels before 5.9 (kubernetes#70747); from 5.9
	// the kernel handles it and the default is left alone
	// (kubernetes#93297).
	sysctlVSConnReuseMode = "net/ipv4/vs/conn_reuse_mode"
)

// tuneIPVS sets the sysctls kube-proxy sets for IPVS mode: IPVS keeps
// conntrack entries for its connections, which the masquerading rules
// match; connections to a removed real server are dropped rather than
// left hanging, and so are the persistence templates of one being
// drained; the node forwards IPv4. Forwarding of IPv6 is left to the
// node's set-up, as kube-proxy leaves it. The vs sysctls exist only once
// ip_vs is loaded, and are per network namespace.
func tuneIPVS(ctx context.Context, k *kernel.Kernel) error {
	logger := klog.FromContext(ctx)
	type sysctl struct {
		name  string
		value int
	}
	settings := []sysctl{
		{kernel.SysctlVSConntrack, 1},
		{kernel.SysctlVSExpireNoDestConn, 1},
		{kernel.SysctlVSExpireQuiescentTemplate, 1},
		{kernel.SysctlIPForward, 1},
	}
	v, err := k.Version()
	if err != nil {
		return fmt.Errorf("IPVS mode: %w", err)
	}
	if v.AtLeast(4, 1, 0) && !v.AtLeast(5, 9, 0) {
		settings = append(settings, sysctl{sysctlVSConnReuseMode, 0})
	}
	for _, s := range settings {
		wrote, err := k.EnsureSysctlInt(ctx, s.name, s.value)
		if err != nil {
			return fmt.Errorf("IPVS mode: sysctl %s: %w", s.name, err)
		}
		if wrote {
			logger.V(1).Info("Set sysctl", "name", s.name, "value", s.value)
		}
	}
	return nil
}

// ipvsTranslatorConfig is the translator config of family on this node.
func ipvsTranslatorConfig(o *options, nodeName string, family v1.IPFamily, ips nodeIPs) ipvs.TranslatorConfig {
	return ipvs.TranslatorConfig{
		IPFamily: family,
		NodeName: nodeName,
		// The Node object's addresses; on a node (not in a dry run) the
		// backend replaces them with the host's before each sync.
		NodeIPs:           ips.byFamily[family],
		NodePortAddresses: nodePortPrefixes(o, family, ips.byFamily[family]),
		ClusterCIDR:       o.clusterCIDR(family),
		MasqueradeAll:     o.masqueradeAll,
		MasqueradeBit:     o.masqueradeBit,
		Scheduler:         o.ipvsScheduler,
		ChainPrefix:       o.names.Chains().Prefix(),
	}
}
