package main

import (
	"context"
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
		p.svcHealth.update(ctx, p.family, p.svcMap.HealthCheckNodePorts(), p.epMap.LocalReadyEndpoints())
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
	_ changetracker.ServiceHandler       = (*handlers)(nil)
	_ changetracker.EndpointSliceHandler = (*handlers)(nil)
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

var _ changetracker.NodeHandler = nodeHealth{}

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
	ports  map[v1.IPFamily]map[types.NamespacedName]uint16
	local  map[v1.IPFamily]map[types.NamespacedName]int
}

func newServiceHealth(server *healthz.ServiceHealthServer) *serviceHealth {
	return &serviceHealth{
		server: server,
		ports:  map[v1.IPFamily]map[types.NamespacedName]uint16{},
		local:  map[v1.IPFamily]map[types.NamespacedName]int{},
	}
}

func (s *serviceHealth) update(ctx context.Context, family v1.IPFamily, ports map[types.NamespacedName]uint16, local map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ports[family], s.local[family] = ports, local
	allPorts := map[types.NamespacedName]uint16{}
	allLocal := map[types.NamespacedName]int{}
	for _, ports := range s.ports {
		for nn, port := range ports {
			allPorts[nn] = port
		}
	}
	for _, local := range s.local {
		for nn, n := range local {
			allLocal[nn] = max(allLocal[nn], n)
		}
	}
	// Errors are ports that could not be opened: logged by the server
	// and tried again on the next call.
	_ = s.server.SyncServices(ctx, allPorts)
	s.server.SyncEndpoints(allLocal)
}
