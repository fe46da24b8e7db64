package proxier

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/proxier/config"
	"github.com/proxykit/proxykit/proxy"
)

// newNode returns the node named name with addresses addrs. Its families
// are both, as kube-proxy offers both to its proxiers whatever the Node
// lists: the primary, that of the first address (IPv4 when there is
// none), then the other.
func newNode(name string, addrs []netip.Addr) Node {
	primary := v1.IPv4Protocol
	if len(addrs) > 0 {
		primary = proxy.FamilyOf(addrs[0])
	}
	n := Node{Name: name, Families: []v1.IPFamily{primary, otherFamily(primary)}, IPs: map[v1.IPFamily][]netip.Addr{}}
	for _, a := range addrs {
		f := proxy.FamilyOf(a)
		n.IPs[f] = append(n.IPs[f], a)
	}
	return n
}

// otherFamily is the IP family that is not f.
func otherFamily(f v1.IPFamily) v1.IPFamily {
	if f == v1.IPv6Protocol {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// findNode returns this node's addresses from its Node object or, when
// there is none or it has no addresses, from the host's interfaces. A node
// without any address is no error: as kube-proxy, which then takes the
// loopback addresses as the node's, the proxier runs, with IPv4 as its
// primary family.
func findNode(ctx context.Context, getNode func(string) (*v1.Node, error), nodeName string, hostAddresses func() ([]netip.Addr, error)) (Node, error) {
	logger := klog.FromContext(ctx)
	node, err := getNode(nodeName)
	if err != nil {
		logger.Info("No Node object for this node; taking its addresses from the host's interfaces", "node", logsafe.KRef("", nodeName), "err", err)
	}
	addrs := addressesOfNode(logger, node)
	if len(addrs) == 0 {
		if addrs, err = hostAddresses(); err != nil {
			return Node{}, err
		}
	}
	if len(addrs) == 0 {
		logger.Info("Neither the Node object nor the host's interfaces give an address of this node; IPv4 is its primary family", "node", logsafe.KRef("", nodeName))
	}
	n := newNode(nodeName, addrs)
	logger.V(1).Info("Node addresses", "node", logsafe.KRef("", nodeName), "addresses", addrs, "primaryFamily", n.Families[0])
	return n, nil
}

// addressesOfNode returns the addresses in a Node's status, InternalIP ones
// first, as kube-proxy picks the node IP. Unparsable ones are logged and
// skipped. A nil node has none.
func addressesOfNode(logger klog.Logger, node *v1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var out []netip.Addr
	for _, kind := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != kind {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				logger.Error(err, "Ignoring a bad node address", "node", node.Name, "address", a.Address)
				continue
			}
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// HostAddresses returns the global unicast addresses of this host's
// interfaces that are up, IPv4-mapped ones as IPv4: the node's addresses
// when its Node object has none (WithHostAddresses). No such address is an
// empty list and no error.
func HostAddresses() ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of interface %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

var _ config.NodeHandler = (*nodeAddresses)(nil)

// nodeAddresses is the Node handler that keeps each family's node
// addresses (proxy.FamilyInput.NodeIPs) those of the Node object, and asks
// for a sync of a family whose addresses changed; the Backends make that
// sync full. A family the Node no longer lists an address of keeps the
// addresses it had (those of the host's interfaces, when the Node never
// had any), and so does every family when the Node is deleted: the
// Backends keep serving node ports where they did. It also follows the
// Node's pod ranges (setPodCIDRs). A family no Backend serves is not added
// when the Node gains an address of it. Every change is logged with the
// old and the new addresses.
type nodeAddresses struct {
	logger   klog.Logger
	families []*familyProxier
}

func (n *nodeAddresses) OnNodeAdd(node *v1.Node)       { n.set(node) }
func (n *nodeAddresses) OnNodeUpdate(_, node *v1.Node) { n.set(node) }
func (n *nodeAddresses) OnNodeDelete(*v1.Node)         {}
func (n *nodeAddresses) OnNodeSynced()                 {}

func (n *nodeAddresses) set(node *v1.Node) {
	n.setPodCIDRs(node)
	byFamily := map[v1.IPFamily][]netip.Addr{}
	for _, a := range addressesOfNode(n.logger, node) {
		f := proxy.FamilyOf(a)
		byFamily[f] = append(byFamily[f], a)
	}
	for _, fp := range n.families {
		ips := byFamily[fp.family]
		if len(ips) == 0 {
			continue
		}
		if old := fp.currentNodeIPs(); fp.setNodeIPs(ips) {
			n.logger.Info("Node addresses changed; syncing everything", "node", logsafe.KObj(node), "ipFamily", fp.family,
				"oldAddresses", old, "addresses", ips)
			fp.queued()
		}
	}
}
