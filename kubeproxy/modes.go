package kubeproxy

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/nftables"
)

// Switching modes, and Cleanup.
//
// IPVS mode and iptables mode share chain names (KUBE-SERVICES,
// KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-FORWARD, KUBE-PROXY-FIREWALL), and
// each mode's rules left behind get in the way of the other's: iptables
// mode's per-service chains and filter rules would keep answering for
// services beside IPVS (kubernetes#102314), and IPVS mode's dummy
// interface and virtual servers would keep taking traffic for addresses
// iptables mode no longer serves. So a proxier that starts in one mode
// removes what the other mode left, as kube-proxy once did at every
// start. It does so only when it finds chains that only the other mode
// makes (ipvsmode.Names.FindLeftovers): a restart in the same mode must not touch
// the rules still serving traffic, which is why kube-proxy stopped
// cleaning up at start-up (kubernetes#75360).
//
// nftables mode shares nothing with the other two: its tables (one per
// family, named after the chain prefix) hold all of it. So, as kube-proxy
// does, a proxier in iptables or IPVS mode deletes them at every start, and
// one in nftables mode removes every chain of the prefix of either other
// mode (and, when IPVS mode's are among them, IPVS mode's ipsets, virtual
// servers and dummy interface).

// Cleanup removes what a proxier in any mode made with cfg.ChainPrefix,
// whatever cfg.Mode says, as kube-proxy's --cleanup does: nftables mode's
// table of both families, the chains and jump rules of iptables and IPVS
// mode in both IP families, from the iptables backend the node uses, and
// IPVS mode's ipsets, virtual servers and dummy interface (the last two
// only with kube-proxy's prefix, since they carry none), and, when the
// Host can (Host.CleanupEBPF), ebpf mode's programs and maps pinned with
// cfg.EBPF's PinPath and NamePrefix. What is not
// there is no error: a family whose iptables is missing (no ip6tables,
// say), a node without nft, a kernel without ip_vs or ip_set. It fails
// when no iptables works at all, and returns every other failure, joined,
// after trying the rest; a Config that does not validate fails it before
// it touches anything. It needs no cluster and reads only WithHost.
func Cleanup(ctx context.Context, cfg *Config, opts ...Option) error {
	s, err := newSetup(cfg, opts)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	var errs []error
	if err := s.cleanupNFTables(ctx); err != nil {
		errs = append(errs, err)
	} else {
		logger.Info("Removed the proxier's nftables tables", "table", s.nftTable)
	}
	if s.host.CleanupEBPF != nil {
		if found, err := s.host.CleanupEBPF(s.cfg.EBPF.datapath("")); err != nil {
			errs = append(errs, fmt.Errorf("cleanup of ebpf mode: %w", err))
		} else if found {
			logger.Info("Removed the programs and maps of ebpf mode")
		}
	}
	b, err := s.host.DetectBackend(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: %w", err))...)
	}
	cleaned := 0
	for _, proto := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		ipt, err := s.host.NewIPTables(ctx, proto, b)
		if err != nil {
			logger.Info("Nothing to clean up: no usable iptables for this family", "family", proto, "backend", b, "reason", err)
			continue
		}
		cleaned++
		if _, err := s.cleanupRules(ctx, ipt); err != nil {
			errs = append(errs, err)
		}
		logger.Info("Removed the proxier's rules", "family", proto, "backend", b)
	}
	if cleaned == 0 {
		errs = append(errs, fmt.Errorf("cleanup: no iptables of backend %s works here", b))
	}
	// After the rules: the kernel keeps a set that a rule matches on.
	if err := s.cleanupIPVSNode(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeIPTablesMode removes, from each of ipts, the rules a proxier in
// iptables mode left, for IPVS mode to start on.
func (s *setup) removeIPTablesMode(ctx context.Context, ipts []iptables.Interface) {
	s.removeModeRules(ctx, ipts, "iptables", func(l ipvsmode.Leftovers) bool { return l.IPTablesMode })
}

// removeIPVSMode removes, from each of ipts, the rules a proxier in IPVS
// mode left, and then, if there were any, IPVS mode's ipsets, virtual
// servers and dummy interface, for iptables mode to start on.
func (s *setup) removeIPVSMode(ctx context.Context, ipts []iptables.Interface) {
	if s.removeModeRules(ctx, ipts, "IPVS", func(l ipvsmode.Leftovers) bool { return l.IPVSMode }) {
		if err := s.cleanupIPVSNode(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Removing IPVS mode's ipsets, virtual servers and dummy interface")
		}
	}
}

// removeEBPFMode detaches and removes what ebpf mode pinned, for another
// mode to start on: its programs would otherwise keep sending the
// cgroup's sockets by maps nobody updates. A failure is logged.
func (s *setup) removeEBPFMode(ctx context.Context) {
	if s.host.CleanupEBPF == nil {
		return
	}
	found, err := s.host.CleanupEBPF(s.cfg.EBPF.datapath(""))
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Removing the programs and maps of ebpf mode")
	case found:
		klog.FromContext(ctx).Info("Removed the programs and maps ebpf mode left")
	}
}

// removeNFTablesMode deletes nftables mode's table of both families, for
// iptables or IPVS mode to start on. A failure is logged: the other modes'
// rules work beside the table, though the table's take the traffic first.
func (s *setup) removeNFTablesMode(ctx context.Context) {
	if err := s.cleanupNFTables(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Removing the tables of nftables mode")
	}
	// ebpf mode runs nftables mode beside it: its programs go too.
	s.removeEBPFMode(ctx)
}

// cleanupNFTables deletes the table of both families; one that does not
// exist is no error, and neither is a node where nft cannot be used (no
// nft binary, or no nf_tables in the kernel): no proxier wrote a table
// there, and none could be deleted.
func (s *setup) cleanupNFTables(ctx context.Context) error {
	if _, err := s.host.NewNFTables(ctx, knftables.IPv4Family, s.nftTable); err != nil {
		klog.FromContext(ctx).Info("Not looking for nftables mode's tables: nft is not usable here", "reason", err)
		return nil
	}
	return nftables.Cleanup(ctx, s.nftTable, func(f knftables.Family, t string) (knftables.Interface, error) {
		return s.host.NewNFTables(ctx, f, t)
	})
}

// removeIPTablesModes removes, from both families, every chain of iptables
// and IPVS mode and, if IPVS mode's were among them, its ipsets, virtual
// servers and dummy interface, for nftables mode to start on. A node
// without a working iptables has none of them. Failures are logged: the
// other modes' rules work beside nftables mode's table.
func (s *setup) removeIPTablesModes(ctx context.Context) {
	logger := klog.FromContext(ctx)
	b, err := s.host.DetectBackend(ctx)
	if err != nil {
		logger.Info("Not looking for the rules of iptables or IPVS mode: no usable iptables", "reason", err)
		return
	}
	ipvsMode := false
	for _, proto := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		ipt, err := s.host.NewIPTables(ctx, proto, b)
		if err != nil {
			logger.V(2).Info("Not looking for the rules of iptables or IPVS mode in this family: no usable iptables", "family", proto, "reason", err)
			continue
		}
		l, err := s.names.FindLeftovers(ctx, ipt)
		if err != nil {
			logger.Error(err, "Looking for the rules of IPVS mode", "family", proto)
		}
		ipvsMode = ipvsMode || l.IPVSMode
		n, err := s.cleanupRules(ctx, ipt)
		if err != nil {
			logger.Error(err, "Removing the rules of iptables and IPVS mode", "family", proto)
		}
		if n > 0 {
			logger.Info("Removed the rules of a proxier that ran here in iptables or IPVS mode", "family", proto, "chains", n)
		}
	}
	if ipvsMode {
		if err := s.cleanupIPVSNode(ctx); err != nil {
			logger.Error(err, "Removing IPVS mode's ipsets, virtual servers and dummy interface")
		}
	}
}

// removeModeRules removes the rules of both modes from each of ipts in
// which found says the other mode's chains are, and reports whether any
// was. The first sync writes the running mode's rules again. Failures are
// logged: the first sync rewrites the shared chains whatever is left.
func (s *setup) removeModeRules(ctx context.Context, ipts []iptables.Interface, mode string, found func(ipvsmode.Leftovers) bool) bool {
	logger := klog.FromContext(ctx)
	seen := false
	for _, ipt := range ipts {
		l, err := s.names.FindLeftovers(ctx, ipt)
		if err != nil {
			logger.Error(err, "Not looking for the rules of the other mode", "mode", mode)
			continue
		}
		if !found(l) {
			continue
		}
		seen = true
		logger.Info("Removing the rules of a proxier that ran here in another mode", "mode", mode, "family", ipt.Family())
		if _, err := s.cleanupRules(ctx, ipt); err != nil {
			logger.Error(err, "Removing the rules of the other mode", "mode", mode, "family", ipt.Family())
		}
	}
	return seen
}

// cleanupRules removes the chains and jump rules of both modes from ipt,
// in one iptables-restore per table: the modes share chains
// (KUBE-MARK-MASQ, which iptables mode's per-service chains and IPVS
// mode's KUBE-NODE-PORT both jump to, among others), so neither mode's
// cleanup alone could delete them while the other's rules are there. It
// finds nothing to do on a clean node. It returns how many chains it
// removed.
func (s *setup) cleanupRules(ctx context.Context, ipt iptables.Interface) (int, error) {
	names := s.names
	// The owner takes the chains of either mode.
	return iptables.CleanupChains(ctx, ipt, func(t iptables.Table, c iptables.Chain) bool {
		return names.Chains().IsWriterChain(t, c) || names.IsModeChain(t, c)
	})
}

// familyIPTables returns the iptables Interface of each of families, of
// the backend (legacy or nft) this node uses, and the families it
// returned one for. A family other than the primary (the first) whose
// iptables does not work is dropped, with a log.
func (s *setup) familyIPTables(ctx context.Context, families []v1.IPFamily) ([]iptables.Interface, []v1.IPFamily, error) {
	logger := klog.FromContext(ctx)
	b, err := s.host.DetectBackend(ctx)
	if err != nil {
		return nil, nil, err
	}
	var ipts []iptables.Interface
	var usable []v1.IPFamily
	for i, family := range families {
		ipt, err := s.usableIPTables(ctx, family, b)
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

func (s *setup) usableIPTables(ctx context.Context, family v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
	proto := v1.IPv4Protocol
	if family == v1.IPv6Protocol {
		proto = v1.IPv6Protocol
	}
	ipt, err := s.host.NewIPTables(ctx, proto, b)
	if err != nil {
		return nil, fmt.Errorf("%s iptables (%s): %w", family, b, err)
	}
	if err := ipt.Present(ctx); err != nil {
		return nil, fmt.Errorf("%s iptables (%s): %w", family, b, err)
	}
	return ipt, nil
}

// nftFamily is the nft family of an IP family's table.
func nftFamily(family v1.IPFamily) knftables.Family {
	if family == v1.IPv6Protocol {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// tuneConntrack applies cfg.Conntrack (nil: the timeouts kube-proxy sets
// by default, which are per network namespace), and reports whether
// nf_conntrack_tcp_be_liberal is on (then out-of-window TCP packets are
// not INVALID, and the rule dropping INVALID packets is left out, as
// kube-proxy does: kubernetes#117924). nf_conntrack_max is left alone
// unless the Tuning sets MaxPerCore: it is host-wide, and lowering the
// host's limit is not a default's call. A failure is logged: the proxier
// works with the kernel's settings.
func (s *setup) tuneConntrack(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	t := s.cfg.Conntrack
	if t == nil {
		t = &conntrack.Tuning{TCPEstablishedTimeout: DefaultTCPEstablishedTimeout, TCPCloseWaitTimeout: DefaultTCPCloseWaitTimeout}
	}
	k := s.host.Kernel
	err := conntrack.Tune(ctx, k, *t)
	if err != nil {
		logger.Error(err, "Tuning conntrack; going on with the kernel's settings")
	}
	v, err := k.ReadSysctlInt("net/netfilter/nf_conntrack_tcp_be_liberal")
	return err == nil && v == 1
}
