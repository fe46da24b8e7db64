package proxier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxier/config"
	"github.com/proxykit/proxykit/proxy"
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

	// share is what the groups serving the family have in common; its
	// mutex guards pendingSince, lastGoodSync, noLocal and appliedSeq.
	share *familyShare
	// pendingSince is when the oldest change not yet synced was queued
	// (zero: none); lastGoodSync is when the last good sync ended;
	// noLocal are the no-local-endpoint counts of that sync.
	pendingSince time.Time
	lastGoodSync time.Time
	noLocal      [2]int
	// appliedSeq counts the family's events that the last good sync
	// held (see familyShare.applied).
	appliedSeq uint64
	// takenSeq counts the family's events the last input held; owned by
	// the sync.
	takenSeq uint64

	// Optional parts, nil when not in use (RunOnce has no health servers).
	svcHealth *serviceHealth
	ct        ConntrackCleaner
	// serviceCIDRs gives proxy.FamilyInput.ServiceCIDRs.
	serviceCIDRs *serviceCIDRs
	// nodeIPs are the node's addresses of the family, for
	// proxy.FamilyInput.NodeIPs; set by the Node's handler (nodeAddresses)
	// while the sync reads them.
	nodeIPs atomic.Pointer[[]netip.Addr]
	// podCIDRs are the node's pod ranges of the family, for
	// proxy.FamilyInput.PodCIDRs; set by the same handler.
	podCIDRs atomic.Pointer[[]netip.Prefix]

	// Owned by the sync: needFull makes the next input Full; lastLabels
	// and lastNodeIPs are those of the last input, to tell a change.
	needFull    bool
	lastLabels  map[string]string
	lastNodeIPs []netip.Addr
	// lastPodCIDRs are the pod ranges of the last input.
	lastPodCIDRs []netip.Prefix
	// ports indexes the ports of every Service in svcMap, kept up to date
	// from the service change results, for FamilyInput.ChangedServices.
	ports map[types.NamespacedName][]changetracker.ServicePortName
	// noChanges is the ChangedServices of an input without changes:
	// empty, never written (inputs are read-only).
	noChanges map[types.NamespacedName][]changetracker.ServicePortName

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
	return newFamilyProxierWith(ctx, family, nodeName, topo, m, nil, nil)
}

// newFamilyProxierWith is newFamilyProxier with the trackers' constructors
// of the caller's service ports and endpoints (nil: the base types) and
// this node's addresses, which no cluster IP may be.
func newFamilyProxierWith(ctx context.Context, family v1.IPFamily, nodeName string, topo *changetracker.NodeTopology, m *metrics,
	makeServicePort changetracker.MakeServicePortFunc, makeEndpoint changetracker.MakeEndpointFunc, nodeIPs ...netip.Addr) *familyProxier {
	logger := changetracker.WithLogger(klog.FromContext(ctx).WithValues("ipFamily", family))
	p := &familyProxier{
		family:      family,
		svcTracker:  changetracker.NewServiceChangeTracker(family, makeServicePort, logger, changetracker.WithNodeIPs(nodeIPs...)),
		epTracker:   changetracker.NewEndpointsChangeTracker(family, nodeName, makeEndpoint, logger),
		topology:    topo,
		metrics:     m,
		requestSync: func() {},
		svcMap:      changetracker.ServicePortMap{},
		epMap:       changetracker.EndpointsMap{},
		deletedUDP:  sets.New[netip.Addr](),
		healthPorts: map[types.NamespacedName]uint16{},
		healthLocal: map[types.NamespacedName]int{},
		needFull:    true,
		ports:       map[types.NamespacedName][]changetracker.ServicePortName{},
		noChanges:   map[types.NamespacedName][]changetracker.ServicePortName{},
	}
	// Alone in its family until the Proxier makes it join a share.
	newFamilyShare(family, nil, m).join(p)
	return p
}

// currentNodeIPs returns the node's addresses of the family; the slice is
// never changed once stored.
func (p *familyProxier) currentNodeIPs() []netip.Addr {
	if ips := p.nodeIPs.Load(); ips != nil {
		return *ips
	}
	return nil
}

// setNodeIPs makes ips the family's node addresses from the next sync on,
// and reports whether they changed.
func (p *familyProxier) setNodeIPs(ips []netip.Addr) bool {
	if slices.Equal(p.currentNodeIPs(), ips) {
		return false
	}
	ips = slices.Clone(ips)
	p.nodeIPs.Store(&ips)
	return true
}

// queued records that a change waits for a sync, and asks for one.
func (p *familyProxier) queued() {
	p.share.queued(p)
	p.metrics.lastQueued.WithLabelValues(string(p.family)).SetToCurrentTime()
	p.requestSync()
}

// update brings the maps up to date with the trackers' pending changes and
// returns the backend's input.
func (p *familyProxier) update() *proxy.FamilyInput {
	in := &proxy.FamilyInput{
		Family:       p.family,
		Services:     p.svcMap,
		Endpoints:    p.epMap,
		NodeLabels:   p.topology.Labels(),
		ServiceCIDRs: p.serviceCIDRs.forFamily(p.family),
		NodeIPs:      p.currentNodeIPs(),
		PodCIDRs:     p.currentPodCIDRs(),
	}
	p.share.takeChanges(p, func() {
		in.ServiceChanges = p.svcMap.Update(p.svcTracker)
		in.EndpointChanges = p.epMap.Update(p.epTracker)
	})
	// An idle sync allocates no index of its own.
	in.ChangedServices = p.noChanges
	if len(in.ServiceChanges.UpdatedServices)+len(in.EndpointChanges.UpdatedServices) > 0 {
		in.ChangedServices = p.changedServices(in)
	}
	if !maps.Equal(in.NodeLabels, p.lastLabels) || !slices.Equal(in.NodeIPs, p.lastNodeIPs) {
		// Topology and node addresses reach every port: kube-proxy's
		// proxiers sync everything when they change.
		p.needFull = true
		p.lastLabels, p.lastNodeIPs = in.NodeLabels, in.NodeIPs
	}
	if !slices.Equal(in.PodCIDRs, p.lastPodCIDRs) {
		// The pod range is NodeCIDR mode's local-traffic detector, in
		// the rules of every port.
		p.needFull = true
		p.lastPodCIDRs = in.PodCIDRs
	}
	in.Full = p.needFull
	for ip := range in.ServiceChanges.DeletedUDPClusterIPs {
		p.deletedUDP.Insert(ip)
	}
	p.conntrackDue = p.conntrackDue || in.EndpointChanges.ConntrackCleanupRequired
	if p.svcHealth != nil {
		// A later update's value replaces an earlier one's: each is the
		// Service's state after its update.
		maps.Copy(p.healthPorts, in.ServiceChanges.HealthCheckNodePorts)
		maps.Copy(p.healthLocal, in.EndpointChanges.LocalReadyEndpoints)
	}
	return in
}

// changedServices keeps the ports index up to date with in's service
// changes and returns in.ChangedServices.
func (p *familyProxier) changedServices(in *proxy.FamilyInput) map[types.NamespacedName][]changetracker.ServicePortName {
	ports := in.ServiceChanges.PortsIn(p.svcMap)
	changed := make(map[types.NamespacedName][]changetracker.ServicePortName, len(in.ServiceChanges.UpdatedServices)+len(in.EndpointChanges.UpdatedServices))
	for svc := range in.ServiceChanges.UpdatedServices {
		if ps := ports[svc]; len(ps) > 0 {
			p.ports[svc] = ps
		} else {
			delete(p.ports, svc)
		}
		changed[svc] = p.ports[svc]
	}
	for svc := range in.EndpointChanges.UpdatedServices {
		changed[svc] = p.ports[svc]
	}
	return changed
}

// synced reports the backend's work on in, which took took and failed
// with err, and does what follows a good one; all of it is best effort.
func (p *familyProxier) synced(ctx context.Context, in *proxy.FamilyInput, out proxy.SyncResult, took time.Duration, err error) {
	// The logger is the context's: a logger with values of its own
	// would cost allocations at every sync, the idle ones included.
	logger := klog.FromContext(ctx)
	family := string(p.family)
	if out.Full {
		p.metrics.syncFullDuration.WithLabelValues(family).Observe(took.Seconds())
	} else {
		p.metrics.syncPartialDuration.WithLabelValues(family).Observe(took.Seconds())
	}
	if err != nil {
		return
	}
	p.share.applied(p, in.EndpointChanges.LastChangeTriggerTimes)
	p.share.noLocalEndpoints(p, out.NoLocalEndpointsInternal, out.NoLocalEndpointsExternal)

	// After the rules, so that the next packet of a deleted flow goes
	// through them. A full sync also cleans, which catches flows left
	// from before a restart.
	if p.ct != nil && (out.Full || p.conntrackDue || p.deletedUDP.Len() > 0) {
		start := time.Now()
		n, err := p.ct.CleanStaleEntries(ctx, p.family, p.svcMap, p.epMap, p.deletedUDP)
		p.metrics.conntrackDuration.WithLabelValues(family).Observe(time.Since(start).Seconds())
		p.metrics.conntrackDeleted.WithLabelValues(family).Add(float64(n))
		if err != nil {
			logger.Error(err, "Clearing stale conntrack entries; will try again after the next sync", "ipFamily", p.family, "deleted", n)
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
		// sync's every Service would make each later sync a walk. An
		// empty one is kept, so that an idle sync allocates none.
		if len(p.healthPorts) > 0 {
			p.healthPorts = map[types.NamespacedName]uint16{}
		}
		if len(p.healthLocal) > 0 {
			p.healthLocal = map[types.NamespacedName]int{}
		}
	}
	p.share.updated(p)
	if v := logger.V(2); v.Enabled() {
		// Behind the check: the arguments' boxing allocates even when
		// the line is not written.
		v.Info("Synced proxy rules", "ipFamily", p.family, "full", out.Full, "servicePorts", out.ServicePorts, "endpoints", out.Endpoints, "took", took)
	}
}

// syncGroup is what one runner syncs: a BackendGroup with its families'
// state. In iptables mode every family is a group of its own, with its own
// runner, so that a failing ip6tables-restore does not hold IPv4 back.
// In IPVS mode the node's families form one group: the virtual servers and
// ipsets of both live in one kernel table, which ipvsmode.Applier reconciles
// from every family's translation at once, so the families are synced
// together rather than each applying the other's last state.
type syncGroup struct {
	backend  proxy.Backend
	families []*familyProxier
	// lost is set by resync, from any goroutine, until a sync takes it.
	lost atomic.Bool
}

// resync makes the backend's next sync full and asks for it, for when
// another program removed its rules. It is the lost of Backend.Run, safe
// to call from any goroutine: the flag is taken by the next sync.
func (g *syncGroup) resync() {
	g.lost.Store(true)
	for _, p := range g.families {
		p.queued()
	}
}

// sync is the work of one sync. It returns the backend's error, after which
// the runner retries.
func (g *syncGroup) sync(ctx context.Context) error {
	start := time.Now()
	lost := g.lost.Swap(false)
	ins := make([]*proxy.FamilyInput, len(g.families))
	for i, p := range g.families {
		ins[i] = p.update()
		ins[i].Full = ins[i].Full || lost
	}
	outs, err := g.backend.Sync(ctx, ins)
	took := time.Since(start)
	if len(outs) != len(ins) {
		// A broken Backend, not bad input. The proxy must not crash for
		// it: the sync counts as failed (so it is retried, and health
		// reports the families behind) and the next one is asked to be
		// full, in case the backend applied part of it.
		err = errors.Join(err, fmt.Errorf("proxier: a Backend's Sync returned %d results for %d inputs", len(outs), len(ins)))
		outs = make([]proxy.SyncResult, len(ins))
	} else {
		for _, p := range g.families {
			p.needFull = false
		}
	}
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

// service and slice deliver an event to each family once, through the
// share of its first group, which gives it to every group at once.
func (h *handlers) service(previous, current *v1.Service) {
	h.metrics.serviceChanges.Inc()
	for _, p := range h.families {
		if p.leads() {
			p.share.serviceChanged(previous, current)
		}
	}
}

func (h *handlers) slice(s *discoveryv1.EndpointSlice, deleted bool) {
	h.metrics.endpointChanges.Inc()
	for _, p := range h.families {
		if p.leads() {
			p.share.sliceChanged(s, deleted)
		}
	}
}

// leads reports whether p is the first group of its family. The members
// are fixed before the handlers get events.
func (p *familyProxier) leads() bool {
	p.share.events.RLock()
	defer p.share.events.RUnlock()
	return p.share.members[0] == p
}
