package main

import (
	"context"
	"maps"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/proxier/config"
)

// familyProxier keeps the rules of one IP family in step with the cluster.
// Informer handlers feed its change trackers and ask for a sync; the sync
// (its syncGroup's, run by a runner.Runner, never concurrently with
// itself) brings the maps up to date, has the backend apply them, then
// clears stale conntrack entries and reports health.
type familyProxier struct {
	family     v1.IPFamily
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker
	topology   *changetracker.NodeTopology
	metrics    *metrics
	// requestSync asks for a sync as soon as the runner allows; it is the
	// runner's Run, and never blocks.
	requestSync func()

	// Optional parts, nil when not in use (a dry run has none of them).
	health    *healthz.ProxyHealthServer
	svcHealth *serviceHealth
	ct        conntrack.Interface

	// Owned by the sync.
	svcMap changetracker.ServicePortMap
	epMap  changetracker.EndpointsMap
	// deletedUDP holds the cluster IPs of removed UDP service ports, and
	// conntrackDue is set when endpoints of UDP ports changed, until a
	// conntrack cleanup succeeds.
	deletedUDP   sets.Set[netip.Addr]
	conntrackDue bool
	// healthPorts and healthLocal hold the health-check node ports and
	// local ready endpoint counts (0: none) of the Services that the
	// updates since the last good sync changed, until svcHealth has them.
	healthPorts map[types.NamespacedName]uint16
	healthLocal map[types.NamespacedName]int
}

func newFamilyProxier(ctx context.Context, family v1.IPFamily, nodeName string, topo *changetracker.NodeTopology, m *metrics) *familyProxier {
	logger := changetracker.WithLogger(klog.FromContext(ctx).WithValues("ipFamily", family))
	return &familyProxier{
		family:      family,
		svcTracker:  changetracker.NewServiceChangeTracker(family, nil, logger),
		epTracker:   changetracker.NewEndpointsChangeTracker(family, nodeName, nil, logger),
		topology:    topo,
		metrics:     m,
		requestSync: func() {},
		svcMap:      changetracker.ServicePortMap{},
		epMap:       changetracker.EndpointsMap{},
		deletedUDP:  sets.New[netip.Addr](),
		healthPorts: map[types.NamespacedName]uint16{},
		healthLocal: map[types.NamespacedName]int{},
	}
}

// queued records that a change waits for a sync, and asks for one.
func (p *familyProxier) queued() {
	if p.health != nil {
		p.health.QueuedUpdate(p.family)
	}
	p.metrics.lastQueued.WithLabelValues(string(p.family)).SetToCurrentTime()
	p.requestSync()
}

// update brings the maps up to date with the trackers' pending changes and
// returns the backend's input.
func (p *familyProxier) update() *syncInput {
	in := &syncInput{
		family:          p.family,
		services:        p.svcMap,
		endpoints:       p.epMap,
		serviceChanges:  p.svcMap.Update(p.svcTracker),
		endpointChanges: p.epMap.Update(p.epTracker),
		nodeLabels:      p.topology.Labels(),
	}
	p.deletedUDP = p.deletedUDP.Union(in.serviceChanges.DeletedUDPClusterIPs)
	p.conntrackDue = p.conntrackDue || in.endpointChanges.ConntrackCleanupRequired
	if p.svcHealth != nil {
		// A later update's value replaces an earlier one's: each is the
		// Service's state after its update.
		maps.Copy(p.healthPorts, in.serviceChanges.HealthCheckNodePorts)
		maps.Copy(p.healthLocal, in.endpointChanges.LocalReadyEndpoints)
	}
	return in
}

// synced reports the backend's work on in, which took took and failed
// with err, and does what follows a good one; all of it is best effort.
func (p *familyProxier) synced(ctx context.Context, in *syncInput, out syncOutcome, took time.Duration, err error) {
	logger := klog.FromContext(ctx).WithValues("ipFamily", p.family)
	family := string(p.family)
	if out.full {
		p.metrics.syncFullDuration.WithLabelValues(family).Observe(took.Seconds())
	} else {
		p.metrics.syncPartialDuration.WithLabelValues(family).Observe(took.Seconds())
	}
	if err != nil {
		return
	}
	done := time.Now()
	for _, times := range in.endpointChanges.LastChangeTriggerTimes {
		for _, t := range times {
			p.metrics.networkProgramming.WithLabelValues(family).Observe(done.Sub(t).Seconds())
		}
	}
	p.metrics.noLocalEndpoints.WithLabelValues(family, "internal").Set(float64(out.noLocalInternal))
	p.metrics.noLocalEndpoints.WithLabelValues(family, "external").Set(float64(out.noLocalExternal))

	// After the rules, so that the next packet of a deleted flow goes
	// through them. A full sync also cleans, which catches flows left
	// from before a restart.
	if p.ct != nil && (out.full || p.conntrackDue || p.deletedUDP.Len() > 0) {
		n, err := conntrack.CleanStaleEntries(ctx, p.ct, p.family, p.svcMap, p.epMap, conntrack.WithDeletedClusterIPs(p.deletedUDP))
		p.metrics.conntrackDeleted.WithLabelValues(family).Add(float64(n))
		if err != nil {
			logger.Error(err, "Clearing stale conntrack entries; will try again after the next sync", "deleted", n)
		} else {
			p.deletedUDP, p.conntrackDue = sets.New[netip.Addr](), false
		}
	}
	if p.svcHealth != nil {
		// Only what changed: walking every Service here would cost more
		// than the partial sync itself at tens of thousands of them.
		p.svcHealth.update(ctx, p.family, p.healthPorts, p.healthLocal)
		// New maps, not cleared ones: a map keeps the room it once
		// needed, and ranging over it costs that much, so the first
		// sync's every Service would make each later sync a walk.
		p.healthPorts = map[types.NamespacedName]uint16{}
		p.healthLocal = map[types.NamespacedName]int{}
	}
	if p.health != nil {
		p.health.Updated(p.family)
	}
	logger.V(2).Info("Synced proxy rules", "full", out.full, "servicePorts", out.servicePorts, "endpoints", out.endpoints, "took", took)
}

// syncGroup is what one runner syncs: a backend and the families it
// serves. In iptables mode every family is a group of its own, with its
// own runner, so that a failing ip6tables-restore does not hold IPv4 back.
// In IPVS mode the node's families form one group: the virtual servers and
// ipsets of both live in one kernel table, which ipvs.Applier reconciles
// from every family's translation at once, so the families are synced
// together rather than each applying the other's last state.
type syncGroup struct {
	backend  backend
	families []*familyProxier
}

// resync makes the backend's next sync full and asks for it, for when
// another program removed its rules.
func (g *syncGroup) resync() {
	g.backend.requestFullSync()
	for _, p := range g.families {
		p.queued()
	}
}

// sync is the work of one sync. It returns the backend's error, after which
// the runner retries.
func (g *syncGroup) sync(ctx context.Context) error {
	start := time.Now()
	ins := make([]*syncInput, len(g.families))
	for i, p := range g.families {
		ins[i] = p.update()
	}
	outs, err := g.backend.sync(ctx, ins)
	took := time.Since(start)
	for i, p := range g.families {
		p.synced(ctx, ins[i], outs[i], took, err)
	}
	return err
}

// handlers delivers informer events to the trackers of every family. A
// dual-stack Service changes both; a slice changes the family of its
// address type.
type handlers struct {
	families []*familyProxier
	metrics  *metrics
}

var (
	_ config.ServiceHandler       = (*handlers)(nil)
	_ config.EndpointSliceHandler = (*handlers)(nil)
)

func (h *handlers) OnServiceAdd(svc *v1.Service)                    { h.service(nil, svc) }
func (h *handlers) OnServiceUpdate(oldSvc, svc *v1.Service)         { h.service(oldSvc, svc) }
func (h *handlers) OnServiceDelete(svc *v1.Service)                 { h.service(svc, nil) }
func (h *handlers) OnServiceSynced()                                {}
func (h *handlers) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) { h.slice(s, false) }
func (h *handlers) OnEndpointSliceUpdate(_, s *discoveryv1.EndpointSlice) {
	h.slice(s, false)
}
func (h *handlers) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) { h.slice(s, true) }
func (h *handlers) OnEndpointSlicesSynced()                            {}

func (h *handlers) service(previous, current *v1.Service) {
	h.metrics.serviceChanges.Inc()
	for _, p := range h.families {
		if p.svcTracker.Update(previous, current) {
			p.queued()
		}
	}
}

func (h *handlers) slice(s *discoveryv1.EndpointSlice, deleted bool) {
	h.metrics.endpointChanges.Inc()
	for _, p := range h.families {
		if p.epTracker.EndpointSliceUpdate(s, deleted) {
			p.queued()
		}
	}
}

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
