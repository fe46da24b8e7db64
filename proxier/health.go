package proxier

import (
	"context"
	"net/netip"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/proxier/config"
)

// nodeHealth tells the proxy health server about this node's Node object,
// so that /healthz fails while the node is being deleted.
type nodeHealth struct{ hs *healthz.ProxyHealthServer }

var _ config.NodeHandler = nodeHealth{}

func (n nodeHealth) OnNodeAdd(node *v1.Node)       { n.hs.SyncNode(node) }
func (n nodeHealth) OnNodeUpdate(_, node *v1.Node) { n.hs.SyncNode(node) }
func (n nodeHealth) OnNodeDelete(*v1.Node)         { n.hs.SyncNode(nil) }
func (n nodeHealth) OnNodeSynced()                 {}

// serviceHealth feeds the node's one service health server from the maps
// of every family: a dual-stack Service's health-check node port serves
// both, and it has local endpoints if either family has.
type serviceHealth struct {
	server *healthz.ServiceHealthServer
	mu     sync.Mutex
	// ports and local hold each family's health-check node ports and local
	// ready endpoint counts as of its last good sync: what
	// HealthCheckNodePorts and LocalReadyEndpoints of its maps returned
	// then, kept from the changes alone.
	ports map[v1.IPFamily]map[types.NamespacedName]uint16
	local map[v1.IPFamily]map[types.NamespacedName]int
}

// healthFamilies is the order in which serviceHealth merges the families,
// so that the port of a Service whose families disagree (one has synced a
// change the other has not) does not depend on map order.
var healthFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

func newServiceHealth(server *healthz.ServiceHealthServer) *serviceHealth {
	s := &serviceHealth{
		server: server,
		ports:  map[v1.IPFamily]map[types.NamespacedName]uint16{},
		local:  map[v1.IPFamily]map[types.NamespacedName]int{},
	}
	for _, f := range healthFamilies {
		s.ports[f] = map[types.NamespacedName]uint16{}
		s.local[f] = map[types.NamespacedName]int{}
	}
	return s
}

// update records a good sync of family, which changed the health-check node
// ports and local ready endpoint counts of the Services in ports and local
// (0: none) and no other, and hands the server the merged state of those
// Services. Its cost is that of the change. It is called after every good
// sync, even one that changed nothing, so that the server tries again the
// ports it could not open.
func (s *serviceHealth) update(ctx context.Context, family v1.IPFamily, ports map[types.NamespacedName]uint16, local map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	familyPorts, familyLocal := s.ports[family], s.local[family]
	if familyPorts == nil {
		return // the trackers track nothing for another family
	}
	setOrDelete(familyPorts, ports)
	setOrDelete(familyLocal, local)
	mergedPorts := make(map[types.NamespacedName]uint16, len(ports))
	for nn := range ports {
		// Served while any family has it.
		var port uint16
		for _, f := range healthFamilies {
			if port = s.ports[f][nn]; port != 0 {
				break
			}
		}
		mergedPorts[nn] = port
	}
	mergedLocal := make(map[types.NamespacedName]int, len(local))
	for nn := range local {
		n := 0
		for _, f := range healthFamilies {
			n = max(n, s.local[f][nn])
		}
		mergedLocal[nn] = n
	}
	// Errors are ports that could not be opened: logged by the server
	// and tried again on the next call.
	_ = s.server.UpdateServices(ctx, mergedPorts)
	s.server.UpdateEndpoints(mergedLocal)
}

// setOrDelete applies changes to m: a zero value deletes the key.
func setOrDelete[V comparable](m, changes map[types.NamespacedName]V) {
	var zero V
	for k, v := range changes {
		if v == zero {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
}

// healthAddresses moves the service health server's listeners when this
// node's addresses change, as they move for the node ports: the addresses
// to listen on are those the caller's function (WithServiceHealthServer)
// gives for the node with each family's current addresses, which the
// nodeAddresses handler, registered before it, has just set.
type healthAddresses struct {
	ctx       context.Context
	server    *healthz.ServiceHealthServer
	addresses func(Node) []netip.Addr
	// node is the node as the backends serve it; its IPs are replaced by
	// the families' current ones.
	node     Node
	families []*familyProxier
}

var _ config.NodeHandler = (*healthAddresses)(nil)

func (h *healthAddresses) OnNodeAdd(*v1.Node)         { h.update() }
func (h *healthAddresses) OnNodeUpdate(_, _ *v1.Node) { h.update() }
func (h *healthAddresses) OnNodeDelete(*v1.Node)      {}
func (h *healthAddresses) OnNodeSynced()              {}

func (h *healthAddresses) update() {
	n := Node{Name: h.node.Name, Families: h.node.Families, IPs: map[v1.IPFamily][]netip.Addr{}}
	for _, fp := range h.families {
		if ips := fp.currentNodeIPs(); len(ips) > 0 {
			n.IPs[fp.family] = ips
		}
	}
	// A port that cannot be opened on a new address is logged by the
	// server and tried again after the next sync, which the address
	// change has asked for.
	_ = h.server.SetNodeAddresses(h.ctx, h.addresses(n)...)
}
