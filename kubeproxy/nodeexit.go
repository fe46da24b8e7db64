package kubeproxy

import (
	"net/netip"
	"os"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/proxier/config"
)

// nodeExit is the Node handler of Config.ExitOnNodeChange: kube-proxy's
// NodeManager behaviour. It takes the node IPs (and, with podCIDRs, the
// PodCIDRs) of this node's Node object as the first list has them, and
// calls exit(1) when a later event changes them or deletes the Node, so
// that the process restarts and starts over with the new ones. Every
// change is logged, at info level, with the old and the new values.
type nodeExit struct {
	logger klog.Logger
	exit   func(code int)
	// podCIDRs also exits on a change of the Node's PodCIDRs, as
	// kube-proxy does with detectLocalMode NodeCIDR.
	podCIDRs bool

	mu     sync.Mutex
	synced bool
	ips    []netip.Addr
	cidrs  []string
}

var _ config.NodeHandler = (*nodeExit)(nil)

func (n *nodeExit) OnNodeAdd(node *v1.Node)       { n.change(node) }
func (n *nodeExit) OnNodeUpdate(_, node *v1.Node) { n.change(node) }

func (n *nodeExit) OnNodeDelete(node *v1.Node) {
	n.logger.Info("Node is being deleted; exiting", "node", logsafe.KObj(node))
	n.exit(1)
}

func (n *nodeExit) OnNodeSynced() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.synced = true
}

func (n *nodeExit) change(node *v1.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ips := nodeHostIPs(node)
	if !n.synced {
		// The first list: the state the proxier starts with.
		n.ips, n.cidrs = ips, slices.Clone(node.Spec.PodCIDRs)
		return
	}
	if n.podCIDRs && !slices.Equal(n.cidrs, node.Spec.PodCIDRs) {
		n.logger.Info("PodCIDRs changed for the node; exiting", "node", logsafe.KObj(node),
			"oldPodCIDRs", quoteAll(n.cidrs), "podCIDRs", quoteAll(node.Spec.PodCIDRs))
		n.exit(1)
	}
	if !slices.Equal(n.ips, ips) {
		n.logger.Info("NodeIPs changed for the node; exiting", "node", logsafe.KObj(node), "oldNodeIPs", n.ips, "nodeIPs", ips)
		n.exit(1)
	}
}

// quoteAll escapes each of ss as logsafe.Quote does: PodCIDRs are API
// text, unchecked here.
func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = logsafe.Quote(s)
	}
	return out
}

// nodeHostIPs returns the node IPs of node as kube-proxy takes them: its
// first address (InternalIP ones before ExternalIP ones) and the first
// one of the other IP family after it, if any; unparsable addresses are
// skipped.
func nodeHostIPs(node *v1.Node) []netip.Addr {
	var all []netip.Addr
	for _, kind := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); a.Type == kind && err == nil {
				all = append(all, ip.Unmap())
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	out := all[:1:1]
	for _, ip := range all[1:] {
		if ip.Is4() != out[0].Is4() {
			return append(out, ip)
		}
	}
	return out
}

// exitProcess is the default exit of ExitOnNodeChange: kube-proxy's.
func exitProcess(code int) {
	klog.Flush()
	os.Exit(code)
}
