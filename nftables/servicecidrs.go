package nftables

import (
	"net/netip"
	"slices"

	"k8s.io/klog/v2"
)

// setServiceCIDRs makes the ranges of the cluster-ips-check chain those of
// a sync's input (or, when it has none, WriterConfig.ServiceCIDRs), merged,
// and reports whether they changed.
func (w *Writer) setServiceCIDRs(logger klog.Logger, in []netip.Prefix) bool {
	src := in
	if len(src) == 0 {
		// Checked and masked by NewWriter.
		src = w.cfg.ServiceCIDRs
	}
	valid := make([]netip.Prefix, 0, len(src))
	for _, p := range src {
		if !p.IsValid() || !w.sameFamily(p.Addr()) {
			logger.Error(nil, "Ignoring a service CIDR that is not of the writer's family", "serviceCIDR", p, "ipFamily", w.cfg.Family, "table", w.table)
			continue
		}
		valid = append(valid, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
	}
	merged := mergePrefixes(valid)
	if slices.Equal(merged, w.serviceCIDRs) {
		return false
	}
	logger.V(2).Info("Service CIDRs changed", "ipFamily", w.cfg.Family, "table", w.table, "from", w.serviceCIDRs, "to", merged)
	w.serviceCIDRs = merged
	return true
}

// mergePrefixes sorts ps (masked, of one family) and leaves out
// duplicates and those inside another, so that the rule's anonymous
// interval set holds disjoint intervals. Two ServiceCIDR objects overlap
// while a cluster's range is widened by adding a larger one beside the old
// (KEP-1880). nft merges overlapping intervals of an anonymous set itself
// (1.0.6: "{ 10.96.0.0/16, 10.96.128.0/20 }" loads as "{ 10.96.0.0/16 }"),
// but the writer does not leave that to the client: a client that sends
// the elements as given (a netlink one) must not send overlapping
// intervals, and one text per set of addresses is what lets Sync see
// that nothing changed. Two prefixes either nest or are disjoint, so what
// remains is disjoint; adjacent ones stay two (nft and the kernel take
// them).
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		// The wider first, so that it is kept and the narrower dropped.
		return a.Bits() - b.Bits()
	})
	out := ps[:0]
	for _, p := range ps {
		// Sorted by address, a prefix inside an earlier kept one is
		// inside the last kept one: the kept ones are disjoint.
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
