package ipvsmode

import (
	"context"
	"fmt"
	"io"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxy"
)

// Mode is IPVS mode for every IP family of the node at once: an
// Writer per family renders the virtual servers, the ipsets and
// the few iptables rules IPVS mode needs, and one Applier applies the
// translations of all families together. The Applier has to see them all
// in one call, because the kernel keeps the virtual servers and the
// ipsets of both families in one table and its reconcilers remove
// whatever they are not given; so the families share one Mode, in one
// proxier.BackendGroup, and one runner syncs them. Every sync is full: the
// reconcilers make one that changes nothing write nothing.
type Mode struct {
	translators  []*Writer
	translations []SyncResult
	// applier applies the translations; nil in a dry run, which prints
	// them to out instead.
	applier *Applier
	// terminator deletes the real servers the applier left draining.
	terminator *ipvs.GracefulTerminator
	out        io.Writer
	// node is the kernel side (nil in a dry run). Its binder also tells
	// the node's addresses, read before every sync so that node ports
	// follow addresses that come and go.
	node *Handles
	// reg is where NewMode registers metrics.
	reg             *proxy.Metrics
	restoreFailures *prometheus.CounterVec
	// families are those of the translators, in order.
	families []v1.IPFamily
	// exclude are the prefixes of WithExcludeCIDRs.
	exclude []netip.Prefix
}

var _ proxy.Backend = (*Mode)(nil)

// Handles is what IPVS mode programs in this network namespace besides
// iptables: the IPVS table, the dummy interface that holds the service
// addresses, and the ipsets.
type Handles struct {
	// IPVS is nil when the kernel has no IPVS loaded, which only a
	// cleanup accepts: there are no virtual servers to remove then.
	IPVS ipvs.Interface
	// Binder binds the service addresses to the dummy interface and
	// tells the node's addresses.
	Binder NodeBinder
	// IPSets holds IPVS mode's sets.
	IPSets ipset.Interface
	// Release releases the netlink sockets; nil releases nothing.
	Release func()
}

// Close releases k's netlink sockets. It is safe on a nil k.
func (k *Handles) Close() {
	if k != nil && k.Release != nil {
		k.Release()
	}
}

// NodeBinder binds service addresses to the dummy interface and tells the
// node's own addresses, as ipvs.DummyBinder does.
type NodeBinder interface {
	ipvs.AddressBinder
	HostAddresses(ctx context.Context, dummy string) ([]netip.Addr, error)
}

// OpenHandles opens IPVS mode's kernel side in the caller's network
// namespace, with the IPVS table when table is set. The kernel must have
// been checked (kernel.CanUseIPVS, which also loads missing modules)
// before: ipvs.New is told not to check it again. On an error it has
// released what it opened.
func OpenHandles(ctx context.Context, table bool) (*Handles, error) {
	n := &Handles{}
	var closers []func()
	n.Release = func() {
		for _, c := range closers {
			c()
		}
	}
	if table {
		lb, err := ipvs.New(ctx, ipvs.WithPrerequisites(nil))
		if err != nil {
			return nil, err
		}
		n.IPVS = lb
		closers = append(closers, lb.Close)
	}
	binder, err := ipvs.NewDummyBinder()
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("dummy interface %s: %w", ipvs.DummyDevice, err)
	}
	n.Binder = binder
	closers = append(closers, binder.Close)
	sets, err := ipset.New()
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("ipsets: %w", err)
	}
	n.IPSets = sets
	closers = append(closers, sets.Close)
	return n, nil
}

// ModeOption configures a Mode; see NewMode.
type ModeOption func(*Mode)

// WithDryRun makes a Mode made without a Handles print each sync's
// translations (virtual servers, ipsets, iptables-restore input) to out
// instead of discarding them.
func WithDryRun(out io.Writer) ModeOption {
	return func(b *Mode) {
		if out != nil {
			b.out = out
		}
	}
}

// WithMetrics makes NewMode register the metric IPVS mode reports on m,
// under kube-proxy's name: kubeproxy_sync_proxy_rules_iptables_restore_failures_total
// by ip_family, the iptables-restore runs of its rules that failed.
// Without it they are counted nowhere.
func WithMetrics(m *proxy.Metrics) ModeOption {
	return func(b *Mode) { b.reg = m }
}

// NewMode makes the Mode of the families of cfgs, one config each, in the
// order of the BackendGroup that will hold it. k is the kernel side and
// ipts the iptables of each family, in the same order; NewMode sets each
// config's RandomFully from them. A nil k (and nil ipts) makes a dry run,
// which applies nothing and prints what it would (WithDryRun). The
// Mode owns k from then on: its Close releases it. NewMode fails, having
// released nothing, when a translator refuses its config, when ipts has
// another length than cfgs, or when the configs' chain prefixes differ.
func NewMode(_ context.Context, cfgs []WriterConfig, k *Handles, ipts []iptables.Interface, opts ...ModeOption) (*Mode, error) {
	if ipts != nil && len(ipts) != len(cfgs) {
		return nil, fmt.Errorf("IPVS mode: %d iptables for %d families", len(ipts), len(cfgs))
	}
	b := &Mode{out: io.Discard, node: k, translations: make([]SyncResult, len(cfgs))}
	for _, opt := range opts {
		if opt != nil {
			opt(b)
		}
	}
	var err error
	if b.restoreFailures, err = iptables.RestoreFailuresMetric(b.reg); err != nil {
		return nil, fmt.Errorf("IPVS mode: %w", err)
	}
	for i, cfg := range cfgs {
		if ipts != nil {
			cfg.RandomFully = ipts[i].HasRandomFully()
		} else {
			// As in iptables mode's dry run: the output must not depend
			// on the machine.
			cfg.RandomFully = true
		}
		tr, err := NewWriter(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s IPVS translator: %w", cfg.Family, err)
		}
		b.translators = append(b.translators, tr)
		b.families = append(b.families, cfg.Family)
		if cfg.ChainPrefix != cfgs[0].ChainPrefix {
			return nil, fmt.Errorf("IPVS mode: chain prefixes %q and %q differ", cfgs[0].ChainPrefix, cfg.ChainPrefix)
		}
	}
	if k != nil && len(cfgs) > 0 {
		// NewWriter took the prefix, so NewNames does too.
		names, err := NewNames(cfgs[0].ChainPrefix)
		if err != nil {
			return nil, err
		}
		rec := ipvs.NewReconciler(k.IPVS, k.Binder, ipvs.WithExcludeCIDRs(b.exclude...))
		b.applier = NewApplier(rec, ipset.NewReconciler(k.IPSets, names.SetPrefix()), ipts...)
		b.terminator = rec.Terminator()
	}
	return b, nil
}

// Sync is part of proxy.Backend. It takes one input per family of the
// Mode, in the order of its configs, and fails on any other. It reads
// the addresses of the host's interfaces before translating and uses them
// instead of the inputs' NodeIPs, so that node ports follow addresses
// that come and go, as in kube-proxy's IPVS mode; a failure to read them
// fails the sync. A dry run uses the inputs' NodeIPs.
func (b *Mode) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	outs := make([]proxy.SyncResult, len(ins))
	if len(ins) != len(b.families) {
		return outs, fmt.Errorf("IPVS mode: given %d inputs for %d families", len(ins), len(b.families))
	}
	for i, in := range ins {
		if in.Family != b.families[i] {
			return outs, fmt.Errorf("IPVS mode: input %d is of %s, want %s", i, in.Family, b.families[i])
		}
	}
	var hostAddrs []netip.Addr
	if b.node != nil {
		// As kube-proxy does: node ports follow the addresses of the
		// host's interfaces, read at every sync, rather than the Node
		// object's.
		var err error
		if hostAddrs, err = b.node.Binder.HostAddresses(ctx, ""); err != nil {
			return outs, fmt.Errorf("IPVS mode: the node's addresses: %w", err)
		}
	}
	for i, in := range ins {
		if b.node != nil {
			// ins are read-only: the addresses go into a copy.
			withHost := *in
			withHost.NodeIPs = hostAddrs
			in = &withHost
		}
		tr := b.translators[i].Sync(ctx, in)
		b.translations[i] = tr
		outs[i] = proxy.SyncResult{
			Full:                     true,
			ServicePorts:             tr.ServicePorts,
			NoLocalEndpointsInternal: tr.NoLocalEndpointsInternal,
			NoLocalEndpointsExternal: tr.NoLocalEndpointsExternal,
		}
		for _, s := range tr.Services {
			outs[i].Endpoints += len(s.RealServers)
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
		b.restoreFailures.WithLabelValues(string(family)).Inc()
	}
	klog.FromContext(ctx).V(4).Info("Applied IPVS mode", "ipsets", res.IPSets, "ipvs", res.IPVS)
	return outs, err
}

// Run is part of proxy.Backend. It sweeps the real servers that are
// draining, deleting each once its connections are gone, and in a dry run
// returns at once. There is no canary to watch: each sync reconciles
// everything, jump rules included, so it never calls lost.
func (b *Mode) Run(ctx context.Context, lost func()) {
	if b.terminator != nil {
		b.terminator.Run(ctx)
	}
}

// Close releases the Handles the Mode was made with, if any. It always
// returns nil.
func (b *Mode) Close() error {
	b.node.Close()
	return nil
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

// TuneKernel sets the sysctls kube-proxy sets for IPVS mode: IPVS keeps
// conntrack entries for its connections, which the masquerading rules
// match; connections to a removed real server are dropped rather than
// left hanging, and so are the persistence templates of one being
// drained; the node forwards IPv4. Forwarding of IPv6 is left to the
// node's set-up, as kube-proxy leaves it. The vs sysctls exist only once
// ip_vs is loaded, and are per network namespace.
// It stops at the first sysctl it cannot set, with an error naming it.
func TuneKernel(ctx context.Context, k *kernel.Kernel) error {
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
	if v.AtLeast(kernel.Version{Major: 4, Minor: 1}) && !v.AtLeast(kernel.Version{Major: 5, Minor: 9}) {
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
