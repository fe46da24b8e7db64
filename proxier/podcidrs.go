package proxier

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/proxy"
)

// podCIDRsOfNode returns the pod ranges of a Node's spec.podCIDRs, masked,
// by family. One that does not parse is logged and left out (the API
// server refuses it, so only a broken or hostile source sends it). A nil
// node has none.
func podCIDRsOfNode(logger klog.Logger, node *v1.Node) map[v1.IPFamily][]netip.Prefix {
	out := map[v1.IPFamily][]netip.Prefix{}
	if node == nil {
		return out
	}
	for _, s := range node.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			logger.Error(err, "Ignoring a bad pod CIDR of the node", "node", logsafe.KObj(node), "podCIDR", logsafe.Quote(s))
			continue
		}
		p = p.Masked()
		f := proxy.FamilyOf(p.Addr())
		out[f] = append(out[f], p)
	}
	return out
}

// setPodCIDRs makes each family's pod ranges (proxy.FamilyInput.PodCIDRs)
// those of node, and asks for a sync of a family whose ranges changed;
// the sync is full (see familyProxier.update). A family the Node has
// none of has none: NodeCIDR local detection is then off until the range
// is allocated.
func (n *nodeAddresses) setPodCIDRs(node *v1.Node) {
	byFamily := podCIDRsOfNode(n.logger, node)
	for _, fp := range n.families {
		if fp.setPodCIDRs(byFamily[fp.family]) {
			n.logger.Info("Node pod CIDRs changed; syncing everything", "ipFamily", fp.family, "podCIDRs", byFamily[fp.family])
			fp.queued()
		}
	}
}

// currentPodCIDRs returns the node's pod ranges of the family; the slice
// is never changed once stored.
func (p *familyProxier) currentPodCIDRs() []netip.Prefix {
	if cidrs := p.podCIDRs.Load(); cidrs != nil {
		return *cidrs
	}
	return nil
}

// setPodCIDRs makes cidrs the family's pod ranges from the next sync on,
// and reports whether they changed.
func (p *familyProxier) setPodCIDRs(cidrs []netip.Prefix) bool {
	if slices.Equal(p.currentPodCIDRs(), cidrs) {
		return false
	}
	cidrs = slices.Clone(cidrs)
	p.podCIDRs.Store(&cidrs)
	return true
}
