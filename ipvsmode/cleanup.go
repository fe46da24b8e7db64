package ipvsmode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
)

// CleanupConfig says where [Cleanup] removes IPVS mode's state from. A nil
// field is skipped.
type CleanupConfig struct {
	// IPTables are the Interfaces (IPv4, IPv6 or both) whose IPVS-mode
	// chains and jump rules are removed.
	IPTables []iptables.Interface
	// IPSets holds the sets to destroy: every set whose name starts with
	// SetPrefix, as the ipset reconciler of IPVS mode owns them.
	IPSets ipset.Interface
	// IPVS holds the virtual servers to delete: all of them except those
	// in ExcludeCIDRs, as the Reconciler owns them.
	IPVS ipvs.Interface
	// ExcludeCIDRs are the Reconciler's WithExcludeCIDRs: virtual servers
	// on addresses inside them belong to someone else.
	ExcludeCIDRs []netip.Prefix
	// Binder deletes the dummy interface DummyDevice with its addresses.
	Binder ipvs.AddressBinder
	// DummyDevice is the Reconciler's WithDummyDevice; "" means
	// [DummyDevice].
	DummyDevice string
	// ChainPrefix is the WriterConfig.ChainPrefix of the proxier
	// cleaned up after; "" means iptables.DefaultChainPrefix. Only the
	// chains and sets of its [Names] are removed: another prefix's
	// stay. Cleanup fails at once if NewNames refuses it.
	ChainPrefix string
}

// Cleanup removes what an IPVS-mode proxier made, and nothing else: the
// chains SyncResult payloads declare ([Names.IsModeChain]) with the rules of
// built-in chains that jump to them, through iptables.CleanupChains (one
// iptables-restore per table), then the ipsets under SetPrefix, the
// virtual servers outside the excluded CIDRs, and the dummy interface.
// Rules go first because the kernel refuses to destroy a set that a rule
// matches on. What is already gone is not an error, so Cleanup can run on
// a clean node or twice. An error does not stop the other steps; the
// returned error joins them all, each naming what it is about. A chain
// that another program's rules still jump to (such as KUBE-MARK-MASQ, if
// the iptables mode's rules are there too) is left as it is, rules and
// all, and reported; to remove both modes' rules at once, use
// iptables.CleanupChains with an owner that accepts both.
func Cleanup(ctx context.Context, c CleanupConfig) error {
	logger := klog.FromContext(ctx)
	names, err := NewNames(c.ChainPrefix)
	if err != nil {
		return fmt.Errorf("IPVS mode cleanup: %w", err)
	}
	var errs []error
	for _, ipt := range c.IPTables {
		if _, err := iptables.CleanupChains(ctx, ipt, names.IsModeChain); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup, %s rules: %w", ipt.Family(), err))
		}
	}
	if c.IPSets != nil {
		res, err := ipset.NewReconciler(c.IPSets, names.SetPrefix()).Reconcile(ctx, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup, ipsets: %w", err))
		}
		if len(res.InUse) > 0 {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup: ipsets %s: %w: something still matches on them", strings.Join(res.InUse, ", "), ipset.ErrInUse))
		}
		logger.V(2).Info("Destroyed IPVS-mode ipsets", "count", res.Destroyed)
	}
	if c.IPVS != nil {
		n, err := cleanupVirtualServers(ctx, c.IPVS, c.ExcludeCIDRs)
		if err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup, virtual servers: %w", err))
		}
		logger.V(2).Info("Deleted IPVS virtual servers", "count", n)
	}
	if c.Binder != nil {
		dev := c.DummyDevice
		if dev == "" {
			dev = ipvs.DummyDevice
		}
		if err := c.Binder.DeleteDevice(ctx, dev); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup, dummy interface %s: %w", dev, err))
		}
	}
	return errors.Join(errs...)
}

// cleanupVirtualServers deletes every virtual server outside exclude, in
// one batch when iface can, and returns how many it deleted.
func cleanupVirtualServers(ctx context.Context, iface ipvs.Interface, exclude []netip.Prefix) (int, error) {
	list, err := iface.ListVirtualServers(ctx)
	if err != nil {
		return 0, err
	}
	list = slices.DeleteFunc(list, func(vs ipvs.VirtualServer) bool {
		return slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(vs.Address) })
	})
	if b, ok := iface.(ipvs.Batcher); ok {
		ops := make([]ipvs.Op, len(list))
		for i, vs := range list {
			ops[i] = ipvs.Op{Kind: ipvs.DeleteVirtualServer, VirtualServer: vs}
		}
		err := b.ApplyBatch(ctx, ops)
		var be *ipvs.BatchError
		switch {
		case err == nil:
			return len(list), nil
		case !errors.As(err, &be):
			return 0, err
		}
		n := len(list) - len(be.Failed)
		// Deleted meanwhile by someone else: gone all the same.
		be.Failed = slices.DeleteFunc(be.Failed, func(f ipvs.OpError) bool { return ipvs.IsNotFound(f.Err) })
		if len(be.Failed) == 0 {
			return n, nil
		}
		return n, be
	}
	var errs []error
	n := 0
	for _, vs := range list {
		switch err := iface.DeleteVirtualServer(ctx, vs); {
		case err == nil:
			n++
		case !ipvs.IsNotFound(err):
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// Leftovers says which proxy modes have left rules in the tables of an
// iptables Interface, judged by the chains that only one mode makes: IPVS
// mode and the iptables rule writer of package iptables share the names
// KUBE-SERVICES (nat), KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-FORWARD and
// KUBE-PROXY-FIREWALL, which tell nothing.
//
// A proxier that starts in one mode uses it to remove the other mode's
// rules, which it would otherwise leave in front of or beside its own
// (kubernetes#102314), without touching its own mode's rules on an
// ordinary restart: a start-up that removed them would break service
// until the first sync (kubernetes#75360).
type Leftovers struct {
	// IPVSMode is set when a chain only IPVS mode makes (one IsModeChain
	// accepts and iptables.DefaultChainNames().IsWriterChain does not) is there:
	// KUBE-NODE-PORT, KUBE-LOAD-BALANCER, KUBE-SOURCE-RANGES-FIREWALL or
	// KUBE-IPVS-FILTER. Cleanup removes them.
	IPVSMode bool
	// IPTablesMode is set when a chain only the iptables rule writer
	// makes (the other way round) is there: KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-SERVICES
	// in the filter table, a per-service or per-endpoint chain, or its
	// iptables.ProxyCanaryChain. iptables.DefaultChainNames().Cleanup removes them.
	IPTablesMode bool
}

// FindLeftovers reads the nat and filter tables of ipt and reports which
// modes' chains of these names they hold (another prefix's chains are not
// leftovers; DefaultNames for kube-proxy's). Since IPVS mode shares some
// of its chains with iptables mode, it is the package that knows both
// modes' names that tells them apart. It changes nothing. An
// error means a table could not be read; the Leftovers are then those of
// the tables read.
func (n *Names) FindLeftovers(ctx context.Context, ipt iptables.Interface) (Leftovers, error) {
	var l Leftovers
	var buf bytes.Buffer
	for _, t := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		buf.Reset()
		if err := ipt.SaveInto(ctx, t, &buf); err != nil {
			return l, fmt.Errorf("looking for leftover rules in %s table %s: %w", ipt.Family(), t, err)
		}
		for _, c := range iptables.ChainsFromSave(buf.Bytes()) {
			ipvsMode, writer := n.IsModeChain(t, c), n.chains.IsWriterChain(t, c)
			l.IPVSMode = l.IPVSMode || ipvsMode && !writer
			l.IPTablesMode = l.IPTablesMode || writer && !ipvsMode
		}
	}
	return l, nil
}
