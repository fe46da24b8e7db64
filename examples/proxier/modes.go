package main

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/nftables"
)

// Switching modes, and --cleanup.
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
// makes (ipvsmode.FindLeftovers): a restart in the same mode must not touch
// the rules still serving traffic, which is why kube-proxy stopped
// cleaning up at start-up (kubernetes#75360).
//
// nftables mode shares nothing with the other two: its tables (one per
// family, named after --chain-prefix) hold all of it. So, as kube-proxy
// does, a proxier in iptables or IPVS mode deletes them at every start, and
// one in nftables mode removes every chain of the prefix of either other
// mode (and, when IPVS mode's are among them, IPVS mode's ipsets, virtual
// servers and dummy interface).

// removeIPTablesMode removes, from each of ipts, the rules a proxier in
// iptables mode left, for IPVS mode to start on.
func removeIPTablesMode(ctx context.Context, names *ipvsmode.Names, ipts []iptables.Interface) {
	removeModeRules(ctx, names, ipts, "iptables", func(l ipvsmode.Leftovers) bool { return l.IPTablesMode })
}

// removeIPVSMode removes, from each of ipts, the rules a proxier in IPVS
// mode left, and then, if there were any, IPVS mode's ipsets, virtual
// servers and dummy interface, for iptables mode to start on.
func removeIPVSMode(ctx context.Context, env *environment, names *ipvsmode.Names, ipts []iptables.Interface) {
	if removeModeRules(ctx, names, ipts, "IPVS", func(l ipvsmode.Leftovers) bool { return l.IPVSMode }) {
		if err := cleanupIPVSNode(ctx, env, names); err != nil {
			klog.FromContext(ctx).Error(err, "Removing IPVS mode's ipsets, virtual servers and dummy interface")
		}
	}
}

// removeNFTablesMode deletes nftables mode's table of both families, for
// iptables or IPVS mode to start on. A failure is logged: the other modes'
// rules work beside the table, though the table's take the traffic first.
func removeNFTablesMode(ctx context.Context, env *environment, table string) {
	if err := cleanupNFTables(ctx, env, table); err != nil {
		klog.FromContext(ctx).Error(err, "Removing the tables of nftables mode")
	}
}

// cleanupNFTables deletes the table of both families; one that does not
// exist is no error, and neither is a node where nft cannot be used (no
// nft binary, or no nf_tables in the kernel): no proxier wrote a table
// there, and none could be deleted.
func cleanupNFTables(ctx context.Context, env *environment, table string) error {
	if _, err := env.newNFTables(ctx, knftables.IPv4Family, table); err != nil {
		klog.FromContext(ctx).Info("Not looking for nftables mode's tables: nft is not usable here", "reason", err)
		return nil
	}
	return nftables.Cleanup(ctx, table, func(f knftables.Family, t string) (knftables.Interface, error) {
		return env.newNFTables(ctx, f, t)
	})
}

// removeIPTablesModes removes, from both families, every chain of iptables
// and IPVS mode and, if IPVS mode's were among them, its ipsets, virtual
// servers and dummy interface, for nftables mode to start on. A node
// without a working iptables has none of them. Failures are logged: the
// other modes' rules work beside nftables mode's table.
func removeIPTablesModes(ctx context.Context, env *environment, names *ipvsmode.Names) {
	logger := klog.FromContext(ctx)
	b, err := env.detectBackend(ctx)
	if err != nil {
		logger.Info("Not looking for the rules of iptables or IPVS mode: no usable iptables", "reason", err)
		return
	}
	ipvsMode := false
	for _, proto := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		ipt, err := env.newIPTables(ctx, proto, b)
		if err != nil {
			logger.V(2).Info("Not looking for the rules of iptables or IPVS mode in this family: no usable iptables", "family", proto, "reason", err)
			continue
		}
		l, err := names.FindLeftovers(ctx, ipt)
		if err != nil {
			logger.Error(err, "Looking for the rules of IPVS mode", "family", proto)
		}
		ipvsMode = ipvsMode || l.IPVSMode
		n, err := cleanupRules(ctx, ipt, names)
		if err != nil {
			logger.Error(err, "Removing the rules of iptables and IPVS mode", "family", proto)
		}
		if n > 0 {
			logger.Info("Removed the rules of a proxier that ran here in iptables or IPVS mode", "family", proto, "chains", n)
		}
	}
	if ipvsMode {
		if err := cleanupIPVSNode(ctx, env, names); err != nil {
			logger.Error(err, "Removing IPVS mode's ipsets, virtual servers and dummy interface")
		}
	}
}

// removeModeRules removes the rules of both modes from each of ipts in
// which found says the other mode's chains are, and reports whether any
// was. The first sync writes the running mode's rules again. Failures are
// logged: the first sync rewrites the shared chains whatever is left.
func removeModeRules(ctx context.Context, names *ipvsmode.Names, ipts []iptables.Interface, mode string, found func(ipvsmode.Leftovers) bool) bool {
	logger := klog.FromContext(ctx)
	seen := false
	for _, ipt := range ipts {
		l, err := names.FindLeftovers(ctx, ipt)
		if err != nil {
			logger.Error(err, "Not looking for the rules of the other mode", "mode", mode)
			continue
		}
		if !found(l) {
			continue
		}
		seen = true
		logger.Info("Removing the rules of a proxier that ran here in another mode", "mode", mode, "family", ipt.Family())
		if _, err := cleanupRules(ctx, ipt, names); err != nil {
			logger.Error(err, "Removing the rules of the other mode", "mode", mode, "family", ipt.Family())
		}
	}
	return seen
}

// cleanup is --cleanup: it removes what any mode made, whatever --mode
// says, as kube-proxy's --cleanup does: nftables mode's table of both
// families, the chains and jump rules of iptables and IPVS mode in both IP
// families, from the iptables backend this node uses, and IPVS mode's
// ipsets, virtual servers and dummy interface. A family whose iptables is
// missing (no ip6tables, say) has nothing to clean. Chains, sets and the
// table are those of names and table (--chain-prefix): another prefix's
// stay.
func cleanup(ctx context.Context, env *environment, names *ipvsmode.Names, table string) error {
	logger := klog.FromContext(ctx)
	var errs []error
	if err := cleanupNFTables(ctx, env, table); err != nil {
		errs = append(errs, err)
	} else {
		logger.Info("Removed the proxier's nftables tables", "table", table)
	}
	b, err := env.detectBackend(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: %w", err))...)
	}
	cleaned := 0
	for _, proto := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		ipt, err := env.newIPTables(ctx, proto, b)
		if err != nil {
			logger.Info("Nothing to clean up: no usable iptables for this family", "family", proto, "backend", b, "reason", err)
			continue
		}
		cleaned++
		if _, err := cleanupRules(ctx, ipt, names); err != nil {
			errs = append(errs, err)
		}
		logger.Info("Removed the proxier's rules", "family", proto, "backend", b)
	}
	if cleaned == 0 {
		errs = append(errs, fmt.Errorf("cleanup: no iptables of backend %s works here", b))
	}
	// After the rules: the kernel keeps a set that a rule matches on.
	if err := cleanupIPVSNode(ctx, env, names); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cleanupRules removes the chains and jump rules of both modes from ipt,
// in one iptables-restore per table: the modes share chains
// (KUBE-MARK-MASQ, which iptables mode's per-service chains and IPVS
// mode's KUBE-NODE-PORT both jump to, among others), so neither mode's
// cleanup alone could delete them while the other's rules are there. It
// finds nothing to do on a clean node. It returns how many chains it
// removed.
func cleanupRules(ctx context.Context, ipt iptables.Interface, names *ipvsmode.Names) (int, error) {
	// The owner takes the chains of either mode.
	return iptables.CleanupChains(ctx, ipt, func(t iptables.Table, c iptables.Chain) bool {
		return names.Chains().IsWriterChain(t, c) || names.IsModeChain(t, c)
	})
}

// cleanupIPVSNode removes IPVS mode's ipsets, virtual servers and dummy
// interface. It loads no module to do so: without ip_vs there is no
// virtual server, and without ip_set no set.
func cleanupIPVSNode(ctx context.Context, env *environment, names *ipvsmode.Names) error {
	mods, err := env.kernel.Modules(ctx)
	if err != nil {
		return fmt.Errorf("cleanup of IPVS mode: %w", err)
	}
	node, err := env.openIPVS(ctx, mods.Has(kernel.ModuleIPVS))
	if err != nil {
		return fmt.Errorf("cleanup of IPVS mode: %w", err)
	}
	defer node.Close()
	cfg := ipvsmode.CleanupConfig{ChainPrefix: names.Chains().Prefix()}
	// Virtual servers and the dummy interface carry no prefix: with
	// another than kube-proxy's, they may be kube-proxy's, so they stay.
	if names.Chains().Prefix() == iptables.DefaultChainPrefix {
		cfg.Binder = node.Binder
		if node.IPVS != nil {
			cfg.IPVS = node.IPVS
		}
	} else {
		klog.FromContext(ctx).Info("Leaving IPVS virtual servers and the dummy interface: they are not named by --chain-prefix", "chainPrefix", names.Chains().Prefix())
	}
	if mods.Has(kernel.ModuleIPSet) {
		cfg.IPSets = node.IPSets
	}
	return ipvsmode.Cleanup(ctx, cfg)
}
