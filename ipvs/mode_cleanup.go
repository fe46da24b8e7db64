package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
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
	IPVS Interface
	// ExcludeCIDRs are the Reconciler's WithExcludeCIDRs: virtual servers
	// on addresses inside them belong to someone else.
	ExcludeCIDRs []netip.Prefix
	// Binder deletes the dummy interface DummyDevice with its addresses.
	Binder AddressBinder
	// DummyDevice is the Reconciler's WithDummyDevice; "" means
	// [DummyDevice].
	DummyDevice string
}

// Cleanup removes what an IPVS-mode proxier made, and nothing else: the
// jump rules of [JumpRules], then the chains Translation payloads declare
// (flushed, then deleted), the ipsets under SetPrefix, the virtual servers
// outside the excluded CIDRs, and the dummy interface. Rules go first
// because the kernel refuses to destroy a set that a rule matches on. What
// is already gone is not an error, so Cleanup can run on a clean node or
// twice. An error does not stop the other steps; the returned error joins
// them all, each naming what it is about. A chain that another program's
// rules still jump to (such as KUBE-MARK-MASQ, if the iptables mode's
// rules are there too) cannot be deleted, and is reported.
func Cleanup(ctx context.Context, c CleanupConfig) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, ipt := range c.IPTables {
		if err := cleanupRules(ctx, ipt); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup, %s rules: %w", ipt.Protocol(), err))
		}
	}
	if c.IPSets != nil {
		res, err := ipset.NewReconciler(c.IPSets, SetPrefix).Reconcile(ctx, nil)
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
			dev = DummyDevice
		}
		if err := c.Binder.DeleteDevice(ctx, dev); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode cleanup, dummy interface %s: %w", dev, err))
		}
	}
	return errors.Join(errs...)
}

// cleanupRules deletes the jump rules, then flushes every chain before
// deleting any, since the chains jump to each other.
func cleanupRules(ctx context.Context, ipt iptables.Interface) error {
	var errs []error
	for _, j := range JumpRules() {
		if err := ipt.DeleteRule(ctx, j.Table, j.Chain, j.Args...); err != nil {
			errs = append(errs, fmt.Errorf("jump from %s to %s in table %s: %w", j.Chain, j.Target, j.Table, err))
		}
	}
	var present []tableChain
	for _, tc := range modeChains {
		err := ipt.FlushChain(ctx, tc.table, tc.chain)
		switch {
		case err == nil:
			present = append(present, tc)
		case !iptables.IsNotFoundError(err):
			errs = append(errs, fmt.Errorf("flushing chain %s in table %s: %w", tc.chain, tc.table, err))
		}
	}
	for _, p := range present {
		if err := ipt.DeleteChain(ctx, p.table, p.chain); err != nil && !iptables.IsNotFoundError(err) {
			errs = append(errs, fmt.Errorf("deleting chain %s in table %s: %w", p.chain, p.table, err))
		}
	}
	return errors.Join(errs...)
}

// cleanupVirtualServers deletes every virtual server outside exclude, in
// one batch when iface can, and returns how many it deleted.
func cleanupVirtualServers(ctx context.Context, iface Interface, exclude []netip.Prefix) (int, error) {
	list, err := iface.ListVirtualServers(ctx)
	if err != nil {
		return 0, err
	}
	list = slices.DeleteFunc(list, func(vs VirtualServer) bool {
		return slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(vs.Address) })
	})
	if b, ok := iface.(Batcher); ok {
		ops := make([]Op, len(list))
		for i, vs := range list {
			ops[i] = Op{Kind: DeleteVirtualServer, VirtualServer: vs}
		}
		err := b.ApplyBatch(ctx, ops)
		var be *BatchError
		switch {
		case err == nil:
			return len(list), nil
		case !errors.As(err, &be):
			return 0, err
		}
		n := len(list) - len(be.Failed)
		// Deleted meanwhile by someone else: gone all the same.
		be.Failed = slices.DeleteFunc(be.Failed, func(f OpError) bool { return IsNotFound(f.Err) })
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
		case !IsNotFound(err):
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}
