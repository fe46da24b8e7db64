package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
)

// Defaults as kube-proxy has them.
const (
	// DefaultMinSyncPeriod is the shortest time between the ends of two
	// syncs of one backend group (kube-proxy's --min-sync-period).
	DefaultMinSyncPeriod = time.Second
	// DefaultSyncPeriod is the longest time between syncs
	// (kube-proxy's --sync-period).
	DefaultSyncPeriod = 30 * time.Second
	// DefaultMasqueradeBit is the bit of the packet mark that flags
	// traffic for masquerading (kube-proxy's --iptables-masquerade-bit).
	DefaultMasqueradeBit = 14
	// DefaultFullSyncPeriod bounds the time between full syncs of the
	// ready modes, as in kube-proxy: a partial sync trusts that the kernel
	// still holds what the last sync wrote, and once an hour that trust
	// is renewed.
	DefaultFullSyncPeriod = time.Hour
)

// Backend is a proxy mode: what turns the service and endpoint maps of the
// IP families it serves into state in the kernel (or anywhere else) and
// applies it. Everything around it (informers, change trackers, the
// runner, conntrack cleanup, health servers, metrics) is the composition's.
//
// A Backend serves the families it was made for, in the order the
// composition was told (proxier.BackendGroup). Which families those are is
// decided as kube-proxy decides them: the node's primary family (that of
// its first address), and the other one too whenever the host supports
// it, even when the node has no address of it (see proxier.Node); a
// family's input then has no NodeIPs until the Node gains one. One that
// serves one family
// (iptables mode, where each family has tables of its own) gets a runner of
// its own, so that a failing family does not hold the other back. One that
// serves all of the node's families at once (IPVS mode, whose kernel table
// holds the virtual servers of both) gets every family's input in each
// Sync.
type Backend interface {
	// Sync renders ins, one per family the backend serves in the order
	// of its group, and applies them. The composition never calls it
	// concurrently with itself, and the maps in ins are read-only: they
	// belong to the composition, which updates them between calls. Sync
	// returns one SyncResult per input, whatever the error (the
	// composition counts a slice of another length as a failed sync, asks
	// for a full one and logs the mismatch as its error). An error means
	// the kernel may not match ins: the composition retries within its
	// retry period, and the next Sync must put right what this one left,
	// which is the backend's business (make it full, say). The
	// composition does not clean conntrack or report health after a
	// failed Sync.
	Sync(ctx context.Context, ins []*FamilyInput) ([]SyncResult, error)
	// Run does the backend's work between syncs until ctx is done:
	// watching for other programs removing its state, and calling lost
	// when they do (the composition then asks for a Sync whose inputs
	// have Full set), or finishing what a sync started. lost is safe to call
	// from any goroutine. A backend with nothing to do returns at once.
	// proxier.RunOnce never calls it.
	Run(ctx context.Context, lost func())
}

// FamilyInput is what a Backend renders for one IP family: the maps,
// already brought up to date by the change trackers, and what that update
// changed. A backend that syncs only what changed reads ServiceChanges
// and EndpointChanges; the maps are whole.
type FamilyInput struct {
	// Family is the IP family of the maps.
	Family v1.IPFamily
	// Services and Endpoints are the family's maps. They are the
	// composition's: read them during Sync only, and do not change them.
	Services  changetracker.ServicePortMap
	Endpoints changetracker.EndpointsMap
	// ServiceChanges and EndpointChanges are what the update before this
	// Sync changed in the maps. The changes of an update are reported
	// once: a backend whose Sync failed must make its next one cover them
	// itself, as a full sync does.
	ServiceChanges  changetracker.UpdateServiceMapResult
	EndpointChanges changetracker.UpdateEndpointsMapResult
	// ChangedServices holds every Service in either change result's
	// UpdatedServices, with the names of its ports in Services now, sorted
	// by changetracker.CompareServicePortNames (none when it was removed
	// or has no ports), so that a backend that syncs only what changed
	// finds the ports of a Service whose endpoints alone changed at the
	// cost of the change. The composition keeps the index it is read
	// from; nil means the composition does not fill it, and then a
	// backend must walk Services. Read-only, like the maps.
	ChangedServices map[types.NamespacedName][]changetracker.ServicePortName
	// Full says this sync must rewrite everything the backend owns: it is
	// set on a backend's first sync, after it called lost, after a Sync
	// that returned another number of results than inputs, and when
	// NodeLabels, NodeIPs or PodCIDRs changed since the last Sync. A
	// backend may also go full on its own (its last apply failed, a
	// periodic resync came); it need not go full for a Full input it
	// knows it does not need, as IPVS mode, whose every sync is whole, or
	// a backend that asked for a repair through lost.
	Full bool
	// NodeLabels are the node's topology labels for
	// changetracker.CategorizeEndpoints; empty (not nil) before the Node
	// is seen or after it is deleted. When they change the composition asks
	// for a Sync, and the backend should make it full.
	NodeLabels map[string]string
	// NodeIPs are this node's addresses of the family: those of its Node
	// object (InternalIP first, then ExternalIP) or, when it has none, of
	// the host's interfaces; none for a family served although the node
	// has no address of it. The proxier follows the Node object: when its
	// addresses of the family change, the next input has the new ones and
	// Full set. A load balancer whose
	// loadBalancerSourceRanges contain one of them also accepts traffic
	// whose source is its own VIP, which is what a node reaching the VIP
	// through a local route sends, and no cluster IP may be one of them.
	// The renderers make a sync full when they change. Read-only.
	NodeIPs []netip.Addr
	// ServiceCIDRs are the family's ranges of the cluster's ServiceCIDR
	// objects (networking.k8s.io/v1), the ranges cluster IPs are
	// allocated from: sorted, without duplicates, but they may nest or
	// overlap, as the objects do while a range is widened. An object the
	// API server would refuse is logged and left out. When they change
	// the composition asks for a Sync. When they are known (not empty), the
	// nftables and iptables backends refuse, with a log naming it, a
	// service port whose cluster IP is outside all of them: the API
	// server never allocates one there, so its rules would capture
	// traffic to some other host's address; a change of ranges makes
	// their sync full, so that every port is judged again. nftables mode
	// also drops new connections to an address inside them that no
	// service has. Nil until the objects are listed, when there are none,
	// and when the API server does not serve them or the proxy may not
	// read them (see proxier.Proxier.Run): then nothing is refused for them.
	// Read-only, like the maps. IPVS mode ignores them.
	ServiceCIDRs []netip.Prefix
	// PodCIDRs are this node's pod ranges of the family: its Node
	// object's spec.podCIDRs (at most one per family, as the API server
	// allows); nil while the Node has none (its range is not allocated
	// yet) or is not seen. Renderers read them in
	// LocalModeNodeCIDR alone (see NodeConfig.LocalDetector).
	// The proxier follows the Node object: when they change, the next
	// input has the new ones and Full set, and the renderers make a sync
	// full when their local detector changes with them. Read-only.
	PodCIDRs []netip.Prefix
}

// SyncResult is what a Backend did for one family, for the metrics and
// the log.
type SyncResult struct {
	// Full is true when everything was rewritten: it picks the full or
	// partial sync duration metric, and a full sync also cleans every
	// stale conntrack entry, not only those of what changed.
	Full bool
	// ServicePorts counts the service ports the backend now programs,
	// and Endpoints what it sends their traffic to (endpoint chains in
	// iptables mode, real servers in IPVS mode). Logged only.
	ServicePorts, Endpoints int
	// NoLocalEndpointsInternal and NoLocalEndpointsExternal count the
	// service ports whose internal (external) traffic is dropped for want
	// of an endpoint on this node, for kube-proxy's
	// sync_proxy_rules_no_local_endpoints_total.
	NoLocalEndpointsInternal, NoLocalEndpointsExternal int
}

// FamilyOf returns the IP family of a; an IPv4-mapped IPv6 address is
// IPv4, as the API server takes it.
func FamilyOf(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// NodeConfig is what every mode's renderer needs to know of the node
// beyond its addresses, which change and come with each FamilyInput. It
// covers every IP family: a renderer reads the prefixes of its own family
// and ignores the others, so one NodeConfig is built per node and handed
// to every mode and family.
type NodeConfig struct {
	// Name is this node's name, for topology
	// (changetracker.CategorizeEndpoints) and for the endpoints' IsLocal.
	Name string
	// NodePortAddresses restricts node ports to the local addresses inside
	// these prefixes (kube-proxy's --nodeport-addresses, with "primary"
	// already resolved by the caller). A renderer with no prefix of its
	// family, or one of length 0, serves node ports on every local
	// address of its family, as kube-proxy does.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary serves node ports on the node's own addresses of
	// the family, as each FamilyInput.NodeIPs gives them, and follows
	// them when they change (kube-proxy's --nodeport-addresses primary,
	// which kube-proxy resolves once and restarts to change). A family
	// without a node IP serves no node port, and NodePortAddresses is not
	// read.
	NodePortPrimary bool
	// ClusterCIDRs are the pod network, at most one prefix per family
	// (kube-proxy's --cluster-cidr): in LocalModeClusterCIDR, traffic to
	// a cluster IP from outside it is masqueraded, and pod traffic to an
	// external address of an externalTrafficPolicy Local service goes to
	// all endpoints. A family without one has local-traffic detection
	// off. Prefixes that are not valid are ignored. The other modes do
	// not read them.
	ClusterCIDRs []netip.Prefix
	// DetectLocalMode is how traffic from this node's pods is told from
	// other traffic (kube-proxy's detectLocalMode); "" means
	// LocalModeClusterCIDR. LocalModeNodeCIDR reads the node's pod ranges
	// from each sync's FamilyInput.PodCIDRs, and a family has detection
	// off while its node has none. See LocalDetector, which every mode's
	// renderer reads it through.
	DetectLocalMode LocalMode
	// BridgeInterface is the bridge this node's pods are behind, for
	// LocalModeBridgeInterface (kube-proxy's detectLocal.bridgeInterface);
	// traffic that comes in through it is local, whatever its family.
	// The other modes do not read it.
	BridgeInterface string
	// InterfaceNamePrefix starts the names of the interfaces of this
	// node's pods, for LocalModeInterfaceNamePrefix (kube-proxy's
	// detectLocal.interfaceNamePrefix, "veth" say): traffic that comes in
	// through such an interface is local, whatever its family. The other
	// modes do not read it.
	InterfaceNamePrefix string
	// MasqueradeAll masquerades all traffic to cluster IPs, whatever its
	// source (kube-proxy's --masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the bit (0 to 31) of the packet mark that flags
	// traffic for masquerading; nil means DefaultMasqueradeBit.
	MasqueradeBit *int
}

// ClusterCIDR returns the ClusterCIDRs prefix of family, masked, or the
// zero Prefix when there is none. It fails when there are two: local
// traffic cannot be told by two ranges of one family.
func (c *NodeConfig) ClusterCIDR(family v1.IPFamily) (netip.Prefix, error) {
	var found netip.Prefix
	for _, p := range c.ClusterCIDRs {
		if !p.IsValid() || FamilyOf(p.Addr()) != family {
			continue
		}
		if p = unmapPrefix(p); !p.IsValid() {
			continue
		}
		if found.IsValid() && found != p {
			return netip.Prefix{}, fmt.Errorf("cluster CIDRs %s and %s are both %s", found, p, family)
		}
		found = p
	}
	return found, nil
}

// HostPrefixes returns a prefix of each address's full length, as
// NodePortPrimary serves node ports on the node IPs.
func HostPrefixes(ips []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ips))
	for _, ip := range ips {
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out
}

// NodePortPrefixes returns the NodePortAddresses prefixes of family,
// masked, IPv4-mapped ones as IPv4, or nil when there is none. Prefixes
// that are not valid are left out.
func (c *NodeConfig) NodePortPrefixes(family v1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range c.NodePortAddresses {
		if p.IsValid() && FamilyOf(p.Addr()) == family {
			if p = unmapPrefix(p); p.IsValid() {
				out = append(out, p)
			}
		}
	}
	return out
}

// MasqueradeMark returns the masquerade bit, DefaultMasqueradeBit when it
// is nil, and fails when it is not in 0..31.
func (c *NodeConfig) MasqueradeMark() (int, error) {
	bit := DefaultMasqueradeBit
	if c.MasqueradeBit != nil {
		bit = *c.MasqueradeBit
	}
	if bit < 0 || bit > 31 {
		return 0, fmt.Errorf("masquerade bit %d is not in 0..31", bit)
	}
	return bit, nil
}

// NodeIPsOf returns the addresses of ips of family, IPv4-mapped ones as
// IPv4, without zones, sorted and without duplicates; invalid ones are
// left out. Renderers use it to read FamilyInput.NodeIPs, so that the
// order the composition found them in does not make a sync full.
func NodeIPsOf(family v1.IPFamily, ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		if ip.IsValid() && FamilyOf(ip) == family {
			out = append(out, ip.Unmap().WithZone(""))
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// unmapPrefix returns p masked, an IPv4-mapped prefix as IPv4
// (::ffff:10.0.0.0/104 is 10.0.0.0/8); one wider than ::ffff:0:0/96
// comes back invalid.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			// Wider than ::ffff:0:0/96: not an IPv4 range at all.
			return netip.Prefix{}
		}
		return netip.PrefixFrom(p.Addr().Unmap(), bits).Masked()
	}
	return p.Masked()
}
