package ebpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/portcheck"
	"github.com/proxykit/proxykit/proxy"
)

// WriterConfig configures a [Writer]. Only Family is required.
type WriterConfig struct {
	// Family is the family of the maps the writer writes, v1.IPv4Protocol
	// or v1.IPv6Protocol; one writer per family. It must be the family of
	// the Maps handed to NewWriter.
	Family v1.IPFamily

	// Node holds the settings every mode shares. The writer reads Name
	// (topology and Local policies), NodePortAddresses and NodePortPrimary:
	// node ports are served on the node's addresses of the family as each
	// FamilyInput.NodeIPs gives them, those inside a NodePortAddresses
	// prefix of the family when there is one. A socket-level balancer
	// knows no other local address (loopback, an address missing from the
	// Node object): a packet-level backend beside it serves those.
	Node proxy.NodeConfig

	// FullSyncPeriod, when positive, makes a sync full if the last full
	// sync is at least that old; a full sync reads the kernel's maps and
	// repairs what differs. Zero means full syncs happen only at the
	// start, after a failed write, when the node's addresses or labels
	// change, on FamilyInput.Full and on RequestFullSync.
	FullSyncPeriod time.Duration

	// Clock is read for FullSyncPeriod; nil means the real clock.
	Clock clock.PassiveClock
}

// SyncResult is what [Writer.Sync] did.
type SyncResult struct {
	// Full is true for a full sync: the kernel's maps were read and every
	// element that differed from the desired state was written.
	Full bool
	// Updates and Deletes count the elements the sync wrote and deleted,
	// in however few batches.
	Updates, Deletes int
	// Drifted counts, in a full sync, the elements the kernel held that
	// differed from what the writer had written (another program's
	// writes, or a write whose outcome was unknown).
	Drifted int
	// ServicePorts and Endpoints count what the writer now programs: the
	// service ports with a frontend and the endpoint ids of their sets.
	ServicePorts, Endpoints int
	// NoLocalEndpointsInternal counts the service ports whose internal
	// traffic is refused for want of an endpoint on this node under
	// internalTrafficPolicy Local. Traffic from local sockets to external
	// addresses never is (it goes to the cluster endpoints), so there is
	// no external count.
	NoLocalEndpointsInternal int
}

// Proxy returns r as the composition's SyncResult.
func (r SyncResult) Proxy() proxy.SyncResult {
	return proxy.SyncResult{
		Full: r.Full, ServicePorts: r.ServicePorts, Endpoints: r.Endpoints,
		NoLocalEndpointsInternal: r.NoLocalEndpointsInternal,
	}
}

// Writer turns one family's service and endpoint maps into the elements
// of the socket load balancer's maps, and writes them. A partial sync
// touches only the service ports that changed, and within them only the
// elements that changed: one endpoint more or less is its endpoint
// entry, one or two slots and the count of each frontend of its set.
//
// What the programs do for the sockets of the cgroup they are attached
// to, from the writer's maps:
//   - a cluster IP sends to the endpoints of the internal traffic policy
//     (CategorizeEndpoints' cluster endpoints, or the local ones for
//     internalTrafficPolicy Local);
//   - an external IP, load-balancer VIP or node port sends to the cluster
//     endpoints, as kube-proxy short-circuits traffic from the node and
//     its pods to them even under externalTrafficPolicy Local;
//   - a port without endpoints there refuses connect and sendmsg with
//     ECONNREFUSED (kube-proxy rejects where a port has no endpoint at
//     all, and drops where a Local policy finds none on the node; a
//     socket-level balancer refuses both, which the caller sees at once);
//   - ClientIP affinity holds per network namespace: every socket of a pod
//     shares its namespace, and the host's sockets the host's.
//
// Load-balancer VIPs of a port with loadBalancerSourceRanges are left
// out: which source a socket will have is not known when it connects.
//
// A frontend that two service ports claim (an external IP equal to
// another Service's cluster IP, say) belongs to the first that claimed it
// and the other is logged; it passes to the other at the next full sync
// after the first lets it go. Service ports and endpoints that
// portcheck refuses are logged and left out.
//
// Sync is never called concurrently with itself; Drift and
// RequestFullSync may be called from other goroutines.
type Writer struct {
	m     Maps
	cfg   WriterConfig
	clock clock.PassiveClock
	sizes Sizes

	mu          sync.Mutex
	written     *State
	ports       map[changetracker.ServicePortName]*portState
	byService   map[types.NamespacedName][]changetracker.ServicePortName
	owner       map[Frontend]changetracker.ServicePortName
	setIDs      idAlloc
	endpointIDs idAlloc
	needFull    bool
	lastFull    time.Time
	nodeIPs     []netip.Addr
	nodeLabels  map[string]string
	check       portcheck.Checker
	// counts are the SyncResult's totals, kept as ports change so that a
	// partial sync need not walk every port.
	counts struct{ ports, endpoints, noLocal int }

	// Buffers kept from sync to sync, so that a partial sync's
	// allocations grow with the ports that change, not with the
	// elements: its two States, the writes by map, and updateSet's.
	old, desired *State
	batch        batch
	names        []changetracker.ServicePortName
	changedPorts []*portState
	want         []netip.AddrPort
	held         []bool
}

// batch is one sync's element writes, by map and kind.
type batch struct {
	epIDs     []uint32
	eps       []Endpoint
	slotKeys  []SlotKey
	slotIDs   []uint32
	fronts    []Frontend
	svcs      []Service
	delFronts []Frontend
	delSlots  []SlotKey
	delEps    []uint32
}

func (b *batch) reset() {
	b.epIDs, b.eps = b.epIDs[:0], b.eps[:0]
	b.slotKeys, b.slotIDs = b.slotKeys[:0], b.slotIDs[:0]
	b.fronts, b.svcs = b.fronts[:0], b.svcs[:0]
	b.delFronts, b.delSlots, b.delEps = b.delFronts[:0], b.delSlots[:0], b.delEps[:0]
}

// count adds ps's contribution to the totals, or takes it away (sign -1).
func (w *Writer) count(ps *portState, sign int) {
	if ps == nil {
		return
	}
	w.counts.ports += sign
	w.counts.endpoints += sign * ps.endpointIDs()
	if ps.noLocalInternal {
		w.counts.noLocal += sign
	}
}

// portState is what the writer programs for one service port: its
// frontends and its one or two backend sets.
type portState struct {
	// frontends are few (one per address of the port), so a slice
	// serves them better than a map: no hashing and one allocation.
	frontends []frontendElem
	// internal serves the cluster IP; external the other frontends, and
	// is the same set as internal unless the two policies differ.
	internal, external *backendSet
	noLocalInternal    bool
}

// frontendElem is one element of the services map.
type frontendElem struct {
	f   Frontend
	svc Service
}

// backendSet is one set of endpoints in slot order: slot i holds the
// endpoint id slots[i], whose address is addrs[i].
type backendSet struct {
	id    uint32
	slots []uint32
	addrs []netip.AddrPort
}

// NewWriter returns a writer to m for cfg.Family. It fails if the
// family is not IPv4 or IPv6 or m is of another family. It reads m's
// sizes, which bound the endpoint ids it hands out.
func NewWriter(m Maps, cfg WriterConfig) (*Writer, error) {
	if cfg.Family != v1.IPv4Protocol && cfg.Family != v1.IPv6Protocol {
		return nil, fmt.Errorf("ebpf: writer family %s is not IPv4 or IPv6", logsafe.Quote(string(cfg.Family)))
	}
	if m == nil || m.Family() != cfg.Family {
		return nil, fmt.Errorf("ebpf: writer of %s needs maps of that family", cfg.Family)
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	sizes := m.Sizes()
	return &Writer{
		m: m, cfg: cfg, clock: clk, sizes: sizes,
		written:     NewState(),
		ports:       map[changetracker.ServicePortName]*portState{},
		byService:   map[types.NamespacedName][]changetracker.ServicePortName{},
		owner:       map[Frontend]changetracker.ServicePortName{},
		setIDs:      idAlloc{limit: uint32(2 * sizes.Services)},
		endpointIDs: idAlloc{limit: uint32(sizes.Endpoints)},
		needFull:    true,
		check:       portcheck.New(cfg.Family),
	}, nil
}

// RequestFullSync makes the next Sync full.
func (w *Writer) RequestFullSync() {
	w.mu.Lock()
	w.needFull = true
	w.mu.Unlock()
}

// Written returns a copy of the state the writer last wrote; after a
// sync that failed it may differ from the kernel's until the next one.
func (w *Writer) Written() *State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written.Clone()
}

// Drift reads the maps and returns how many elements differ from what
// the writer wrote; when some do, the next Sync is full, which repairs
// them. It returns the error of reading the maps, and then asks for a
// full sync too.
func (w *Writer) Drift() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	got, err := w.m.Dump()
	if err != nil {
		w.needFull = true
		return 0, fmt.Errorf("ebpf: reading the maps: %w", err)
	}
	n := countDiff(got, w.written)
	if n > 0 {
		w.needFull = true
	}
	return n, nil
}

// Sync brings the maps to what in says, writing only what changed since
// the last sync, or everything that differs from the kernel's maps in a
// full sync. It returns what it did and the first error of the writes;
// after an error the next sync is full. A service port that cannot get
// an endpoint id because the endpoint map is full is left out and makes
// the error wrap ErrMapFull; the others are written.
func (w *Writer) Sync(ctx context.Context, in *proxy.FamilyInput) (SyncResult, error) {
	logger := klog.FromContext(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()

	full := w.needFull || in.Full
	if in.Family != "" && in.Family != w.cfg.Family {
		logger.Error(nil, "Input of another IP family; its service ports are not programmed", "ipFamily", w.cfg.Family, "inputFamily", logsafe.Quote(string(in.Family)))
		return SyncResult{}, fmt.Errorf("ebpf: input of family %s to a writer of %s", logsafe.Quote(string(in.Family)), w.cfg.Family)
	}
	if ips := proxy.NodeIPsOf(w.cfg.Family, in.NodeIPs); !slices.Equal(ips, w.nodeIPs) {
		// Node ports are on the node's addresses, and no cluster IP may
		// be one of them: every port is judged again.
		full = true
		w.nodeIPs = ips
	}
	if !maps.Equal(w.nodeLabels, in.NodeLabels) {
		full = true
		w.nodeLabels = maps.Clone(in.NodeLabels)
	}
	check := portcheck.New(w.cfg.Family, w.nodeIPs...).WithServiceCIDRs(in.ServiceCIDRs)
	if !check.SameServiceCIDRs(w.check) {
		full = true
	}
	w.check = check
	now := w.clock.Now()
	if w.cfg.FullSyncPeriod > 0 && now.Sub(w.lastFull) >= w.cfg.FullSyncPeriod {
		full = true
	}

	var res SyncResult
	var err error
	if full {
		res, err = w.syncFull(logger, in)
		w.lastFull = now
	} else {
		res, err = w.syncPartial(logger, in)
	}
	w.needFull = err != nil
	res.ServicePorts, res.Endpoints, res.NoLocalEndpointsInternal = w.counts.ports, w.counts.endpoints, w.counts.noLocal
	return res, err
}

// syncFull recomputes every port, reads the kernel's maps and writes
// what differs.
func (w *Writer) syncFull(logger klog.Logger, in *proxy.FamilyInput) (SyncResult, error) {
	res := SyncResult{Full: true}
	got, err := w.m.Dump()
	if err != nil {
		return res, fmt.Errorf("ebpf: reading the maps: %w", err)
	}
	res.Drifted = countDiff(got, w.written)

	names := slices.SortedFunc(maps.Keys(in.Services), changetracker.CompareServicePortNames)
	clear(w.owner)
	clear(w.byService)
	if len(w.ports) == 0 && len(in.Services) > 0 {
		// Sized once, as the first sync fills them.
		w.ports = make(map[changetracker.ServicePortName]*portState, len(in.Services))
		w.owner = make(map[Frontend]changetracker.ServicePortName, len(in.Services))
		w.byService = make(map[types.NamespacedName][]changetracker.ServicePortName, len(in.Services))
	}
	var errs []error
	for name := range w.ports {
		if _, ok := in.Services[name]; !ok {
			w.dropPort(name)
		}
	}
	w.counts = struct{ ports, endpoints, noLocal int }{}
	res.Updates, res.Deletes, w.written, errs = w.writePorts(logger, in, names, got, nil, errs)
	w.setIDs.commit()
	w.endpointIDs.commit()
	return res, joinErrors(errs)
}

// syncPartial recomputes the ports of the Services that changed and
// writes the difference between their old and new elements.
func (w *Writer) syncPartial(logger klog.Logger, in *proxy.FamilyInput) (SyncResult, error) {
	var res SyncResult
	changed := in.ChangedServices
	if changed == nil {
		changed = w.changedServices(in)
	}
	names := w.names[:0]
	for nn, now := range changed {
		names = append(names, now...)
		for _, old := range w.byService[nn] {
			if !slices.Contains(now, old) {
				names = append(names, old)
			}
		}
		delete(w.byService, nn)
	}
	slices.SortFunc(names, changetracker.CompareServicePortNames)
	w.names = names

	old, desired := w.partialStates()
	// Every changed port lets go of its frontends before any claims
	// them again, so that one moving from a port to another in the same
	// change follows it.
	for _, name := range names {
		if ps := w.ports[name]; ps != nil {
			ps.entries(old)
			w.count(ps, -1)
			w.release(ps)
		}
	}
	var errs []error
	res.Updates, res.Deletes, _, errs = w.writePorts(logger, in, names, old, desired, errs)
	for f := range old.Services {
		delete(w.written.Services, f)
	}
	for k := range old.Slots {
		delete(w.written.Slots, k)
	}
	for id := range old.Endpoints {
		delete(w.written.Endpoints, id)
	}
	maps.Copy(w.written.Services, desired.Services)
	maps.Copy(w.written.Slots, desired.Slots)
	maps.Copy(w.written.Endpoints, desired.Endpoints)
	w.setIDs.commit()
	w.endpointIDs.commit()
	return res, joinErrors(errs)
}

// writePorts recomputes the ports names into desired (nil: a new State
// sized for them), then writes the difference from old, the elements the
// kernel holds for them. It returns the counts of writes, desired, and
// errs with the errors met.
func (w *Writer) writePorts(logger klog.Logger, in *proxy.FamilyInput, names []changetracker.ServicePortName, old, desired *State, errs []error) (ups, dels int, _ *State, _ []error) {
	pss := w.changedPorts[:0]
	fronts, eps := 0, 0
	for _, name := range names {
		ps, err := w.updatePort(logger, in, name)
		if err != nil {
			errs = append(errs, err)
		}
		if ps != nil {
			pss = append(pss, ps)
			w.count(ps, 1)
			fronts += len(ps.frontends)
			eps += ps.endpointIDs()
		}
	}
	if desired == nil {
		// Sized for the ports: growing maps of hundreds of thousands
		// of elements step by step rehashes each many times.
		desired = &State{
			Services:  make(map[Frontend]Service, fronts),
			Slots:     make(map[SlotKey]uint32, eps),
			Endpoints: make(map[uint32]Endpoint, eps),
		}
	}
	for _, ps := range pss {
		ps.entries(desired)
	}
	clear(pss)
	w.changedPorts = pss[:0]
	ups, dels, err := w.apply(old, desired)
	w.batch.release()
	if err != nil {
		errs = append(errs, err)
	}
	return ups, dels, desired, errs
}

// partialStates returns the two States of a partial sync, empty. They are
// kept for the next partial sync unless a large change made them big,
// since clearing a map costs its capacity.
func (w *Writer) partialStates() (old, desired *State) {
	const keep = 1024
	for _, s := range []**State{&w.old, &w.desired} {
		if *s == nil || len((*s).Slots) > keep || len((*s).Services) > keep {
			*s = NewState()
			continue
		}
		clear((*s).Services)
		clear((*s).Slots)
		clear((*s).Endpoints)
	}
	return w.old, w.desired
}

// changedServices is FamilyInput.ChangedServices for a caller that does
// not fill it: the ports of a Service whose ports changed are in the
// service change result, and those of a Service whose endpoints alone
// changed are the ones the writer last saw. Only a result made by hand,
// without Ports, makes it walk the map.
func (w *Writer) changedServices(in *proxy.FamilyInput) map[types.NamespacedName][]changetracker.ServicePortName {
	changed := map[types.NamespacedName][]changetracker.ServicePortName{}
	walk := false
	for nn := range in.ServiceChanges.UpdatedServices {
		ports, ok := in.ServiceChanges.Ports[nn]
		walk = walk || !ok
		changed[nn] = ports
	}
	for nn := range in.EndpointChanges.UpdatedServices {
		if _, ok := changed[nn]; !ok {
			changed[nn] = w.byService[nn]
		}
	}
	if walk {
		for nn := range in.ServiceChanges.UpdatedServices {
			changed[nn] = nil
		}
		for name := range in.Services {
			if _, ok := in.ServiceChanges.UpdatedServices[name.NamespacedName]; ok {
				changed[name.NamespacedName] = append(changed[name.NamespacedName], name)
			}
		}
	}
	return changed
}

// release lets go of the frontends ps owns and frees its ids (for reuse
// after this sync is written).
func (w *Writer) release(ps *portState) {
	for _, e := range ps.frontends {
		delete(w.owner, e.f)
	}
	ps.frontends = ps.frontends[:0]
}

// dropPort forgets a port that no longer gets elements and frees its ids.
func (w *Writer) dropPort(name changetracker.ServicePortName) {
	ps := w.ports[name]
	if ps == nil {
		return
	}
	w.release(ps)
	if ps.internal != nil {
		w.freeSet(ps.internal)
	}
	if ps.external != nil && ps.external != ps.internal {
		w.freeSet(ps.external)
	}
	delete(w.ports, name)
}

// updatePort recomputes the port name from in, reusing its sets' ids,
// and returns its new state, or nil when it gets no elements (then any
// old state is dropped).
func (w *Writer) updatePort(logger klog.Logger, in *proxy.FamilyInput, name changetracker.ServicePortName) (*portState, error) {
	svc, ok := in.Services[name]
	if !ok {
		w.dropPort(name)
		return nil, nil
	}
	w.byService[name.NamespacedName] = append(w.byService[name.NamespacedName], name)
	if _, ok := protocolNumber(svc); !ok || !w.check.Usable(logger, name, svc, "", nil) {
		w.dropPort(name)
		return nil, nil
	}
	eps := w.check.UsableEndpoints(logger, name, in.Endpoints[name])
	cluster, local, _, hasAny := changetracker.CategorizeEndpoints(eps, svc, w.cfg.Node.Name, in.NodeLabels)
	internal := cluster
	if svc.InternalPolicyLocal() {
		internal = local
	}
	// Traffic from the node and its pods to an external address is
	// short-circuited to the cluster endpoints, whatever the external
	// policy, as kube-proxy does; so only internalTrafficPolicy Local
	// gives a port's two kinds of frontend different endpoints.
	external := cluster
	sameSets := !svc.InternalPolicyLocal() || !svc.ExternallyAccessible()

	ps := w.ports[name]
	if ps == nil {
		ps = &portState{}
		w.ports[name] = ps
	}
	var err error
	if ps.internal, err = w.updateSet(ps.internal, internal); err != nil {
		w.dropPort(name)
		return nil, fmt.Errorf("service port %s: %w", name, err)
	}
	prevExternal := ps.external
	if prevExternal == ps.internal {
		prevExternal = nil
	}
	switch {
	case sameSets:
		if prevExternal != nil {
			w.freeSet(prevExternal)
		}
		ps.external = ps.internal
	default:
		if ps.external, err = w.updateSet(prevExternal, external); err != nil {
			w.dropPort(name)
			return nil, fmt.Errorf("service port %s: %w", name, err)
		}
	}
	// As kube-proxy counts it: a port with no usable endpoint anywhere is
	// refused for want of any endpoint, not of a local one.
	ps.noLocalInternal = svc.InternalPolicyLocal() && len(local) == 0 && hasAny

	var affinity uint32
	if svc.SessionAffinityType() == v1.ServiceAffinityClientIP {
		affinity = uint32(svc.StickyMaxAgeSeconds())
	}
	port := uint16(svc.Port())
	ps.frontends = ps.frontends[:0]
	w.claim(logger, name, ps, Frontend{svc.ClusterIP(), port, svc.Protocol()}, ps.internal, affinity, 0)
	for _, ip := range svc.ExternalIPs() {
		if w.check.OwnAddr(ip) {
			w.claim(logger, name, ps, Frontend{ip, port, svc.Protocol()}, ps.external, affinity, FlagExternalIP)
		}
	}
	// A socket-level balancer cannot tell the source a connection will
	// have, so VIPs that only some sources may reach are left to a
	// packet-level backend, which checks loadBalancerSourceRanges.
	for _, ip := range svc.LoadBalancerVIPs() {
		if w.check.OwnAddr(ip) && !w.check.RestrictsSources(svc) {
			w.claim(logger, name, ps, Frontend{ip, port, svc.Protocol()}, ps.external, affinity, FlagLoadBalancer)
		}
	}
	if np := svc.NodePort(); np != 0 {
		for _, ip := range w.nodePortIPs() {
			w.claim(logger, name, ps, Frontend{ip, uint16(np), svc.Protocol()}, ps.external, affinity, FlagNodePort)
		}
	}
	return ps, nil
}

// claim gives f to the port name unless another port has it.
func (w *Writer) claim(logger klog.Logger, name changetracker.ServicePortName, ps *portState, f Frontend, set *backendSet, affinity uint32, flags Flags) {
	if other, ok := w.owner[f]; ok && other != name {
		logger.Info("Service port's address is another service port's; left out", "servicePort", logsafe.Quote(name.String()), "address", f.String(), "owner", logsafe.Quote(other.String()))
		return
	}
	for _, e := range ps.frontends {
		if e.f == f {
			return
		}
	}
	w.owner[f] = name
	ps.frontends = append(ps.frontends, frontendElem{f, Service{ID: set.id, Count: uint32(len(set.slots)), AffinitySeconds: affinity, Flags: flags}})
}

// nodePortIPs returns the node's addresses node ports are served on.
func (w *Writer) nodePortIPs() []netip.Addr {
	if w.cfg.Node.NodePortPrimary {
		return w.nodeIPs
	}
	prefixes := w.cfg.Node.NodePortPrefixes(w.cfg.Family)
	if len(prefixes) == 0 {
		return w.nodeIPs
	}
	var ips []netip.Addr
	for _, ip := range w.nodeIPs {
		for _, p := range prefixes {
			if p.Bits() == 0 || p.Contains(ip) {
				ips = append(ips, ip)
				break
			}
		}
	}
	return ips
}

// updateSet brings set (nil for a new one) to eps: endpoints that stay
// keep their slot, a removed endpoint's slot takes the last slot's
// endpoint, and new endpoints are appended in address order, so that one
// endpoint more or less rewrites at most one slot besides the last.
func (w *Writer) updateSet(set *backendSet, eps []changetracker.Endpoint) (*backendSet, error) {
	if set == nil {
		id, err := w.setIDs.get("backend sets", w.sizes.Services)
		if err != nil {
			return nil, err
		}
		set = &backendSet{id: id}
	}
	// The wanted addresses, sorted and without repeats, each marked once
	// a slot holds it: a binary search instead of a map per set.
	want := w.want[:0]
	for _, ep := range eps {
		want = append(want, netip.AddrPortFrom(ep.IP(), uint16(ep.Port())))
	}
	slices.SortFunc(want, netip.AddrPort.Compare)
	want = slices.Compact(want)
	held := slices.Grow(w.held[:0], len(want))[:len(want)]
	if extra := len(want) - len(set.slots); extra > 0 {
		set.slots, set.addrs = slices.Grow(set.slots, extra), slices.Grow(set.addrs, extra)
	}
	clear(held)
	w.want, w.held = want, held
	for i := 0; i < len(set.slots); {
		if j, ok := slices.BinarySearchFunc(want, set.addrs[i], netip.AddrPort.Compare); ok && !held[j] {
			held[j] = true
			i++
			continue
		}
		w.endpointIDs.free(set.slots[i])
		last := len(set.slots) - 1
		set.slots[i], set.addrs[i] = set.slots[last], set.addrs[last]
		set.slots, set.addrs = set.slots[:last], set.addrs[:last]
	}
	for j, ap := range want {
		if held[j] {
			continue
		}
		id, err := w.endpointIDs.get("endpoints", w.sizes.Endpoints)
		if err != nil {
			return set, err
		}
		set.slots = append(set.slots, id)
		set.addrs = append(set.addrs, ap)
	}
	return set, nil
}

// freeSet frees a set's id and its endpoints' ids.
func (w *Writer) freeSet(set *backendSet) {
	w.setIDs.free(set.id)
	for _, id := range set.slots {
		w.endpointIDs.free(id)
	}
}

// entries adds the port's elements to s.
func (ps *portState) entries(s *State) {
	for _, e := range ps.frontends {
		s.Services[e.f] = e.svc
	}
	for i, set := range [2]*backendSet{ps.internal, ps.external} {
		if set == nil || i == 1 && set == ps.internal {
			continue
		}
		for slot, id := range set.slots {
			s.Slots[SlotKey{set.id, uint32(slot)}] = id
			ap := set.addrs[slot]
			s.Endpoints[id] = Endpoint{Service: set.id, Addr: ap.Addr(), Port: ap.Port()}
		}
	}
}

// endpointIDs returns how many endpoint ids the port's sets hold.
func (ps *portState) endpointIDs() int {
	n := len(ps.internal.slots)
	if ps.external != ps.internal {
		n += len(ps.external.slots)
	}
	return n
}

// apply writes the difference from old to desired in an order that keeps
// every state in between usable by the programs: endpoints before the
// slots that name them, slots before the counts that reach them, and
// deletions in the reverse order. Frontends that go are deleted before
// the others are written, which makes room in a full services map. Each
// map's writes are one call of Maps, so one batch on the kernel's; the
// first error stops the writes, and the next sync, full, finds what was
// written and writes the rest.
func (w *Writer) apply(old, desired *State) (ups, dels int, err error) {
	b := &w.batch
	b.reset()
	// Room for every element that may change, so that a full sync's
	// slices grow once.
	b.epIDs, b.eps = slices.Grow(b.epIDs, len(desired.Endpoints)), slices.Grow(b.eps, len(desired.Endpoints))
	b.slotKeys, b.slotIDs = slices.Grow(b.slotKeys, len(desired.Slots)), slices.Grow(b.slotIDs, len(desired.Slots))
	b.fronts, b.svcs = slices.Grow(b.fronts, len(desired.Services)), slices.Grow(b.svcs, len(desired.Services))
	for id, ep := range desired.Endpoints {
		if o, ok := old.Endpoints[id]; !ok || o != ep {
			b.epIDs, b.eps = append(b.epIDs, id), append(b.eps, ep)
		}
	}
	for k, id := range desired.Slots {
		if o, ok := old.Slots[k]; !ok || o != id {
			b.slotKeys, b.slotIDs = append(b.slotKeys, k), append(b.slotIDs, id)
		}
	}
	for f, svc := range desired.Services {
		if o, ok := old.Services[f]; !ok || o != svc {
			b.fronts, b.svcs = append(b.fronts, f), append(b.svcs, svc)
		}
	}
	for f := range old.Services {
		if _, ok := desired.Services[f]; !ok {
			b.delFronts = append(b.delFronts, f)
		}
	}
	for k := range old.Slots {
		if _, ok := desired.Slots[k]; !ok {
			b.delSlots = append(b.delSlots, k)
		}
	}
	for id := range old.Endpoints {
		if _, ok := desired.Endpoints[id]; !ok {
			b.delEps = append(b.delEps, id)
		}
	}

	if len(b.epIDs) > 0 {
		n, err := w.m.UpdateEndpoints(b.epIDs, b.eps)
		if ups += n; err != nil {
			return ups, dels, notWritten(len(b.epIDs), n, err, func(i int) string {
				return fmt.Sprintf("endpoint %d (%s)", b.epIDs[i], b.eps[i].AddrPort())
			})
		}
	}
	if len(b.slotKeys) > 0 {
		n, err := w.m.UpdateSlots(b.slotKeys, b.slotIDs)
		if ups += n; err != nil {
			return ups, dels, notWritten(len(b.slotKeys), n, err, func(i int) string {
				return fmt.Sprintf("slot %d of set %d", b.slotKeys[i].Slot, b.slotKeys[i].Service)
			})
		}
	}
	if len(b.delFronts) > 0 {
		n, err := w.m.DeleteServices(b.delFronts)
		if dels += n; err != nil {
			return ups, dels, notWritten(len(b.delFronts), n, err, func(i int) string {
				return "frontend " + b.delFronts[i].String()
			})
		}
	}
	if len(b.fronts) > 0 {
		n, err := w.m.UpdateServices(b.fronts, b.svcs)
		if ups += n; err != nil {
			return ups, dels, notWritten(len(b.fronts), n, err, func(i int) string {
				return "frontend " + b.fronts[i].String()
			})
		}
	}
	if len(b.delSlots) > 0 {
		n, err := w.m.DeleteSlots(b.delSlots)
		if dels += n; err != nil {
			return ups, dels, notWritten(len(b.delSlots), n, err, func(i int) string {
				return fmt.Sprintf("slot %d of set %d", b.delSlots[i].Slot, b.delSlots[i].Service)
			})
		}
	}
	if len(b.delEps) > 0 {
		n, err := w.m.DeleteEndpoints(b.delEps)
		if dels += n; err != nil {
			return ups, dels, notWritten(len(b.delEps), n, err, func(i int) string {
				return fmt.Sprintf("endpoint %d", b.delEps[i])
			})
		}
	}
	return ups, dels, nil
}

// release lets go of a full sync's buffers, which a partial sync does not
// need, and keeps a partial sync's.
func (b *batch) release() {
	const keep = 4096
	if cap(b.epIDs) > keep || cap(b.slotKeys) > keep || cap(b.fronts) > keep {
		*b = batch{}
	}
}

// notWritten returns the error of a write of total elements that stopped
// after done with err: it names the element that failed and counts the
// others left unwritten.
func notWritten(total, done int, err error, name func(i int) string) error {
	if done < 0 || done >= total {
		// Maps broke its contract; name the last element.
		done = total - 1
	}
	if rest := total - done - 1; rest > 0 {
		return fmt.Errorf("ebpf: %s, and %d more after it, not written: %w", name(done), rest, err)
	}
	return fmt.Errorf("ebpf: %s: %w", name(done), err)
}

// joinErrors joins the first few errors of a sync and counts the rest:
// a map too small fails every port after the first that does not fit.
func joinErrors(errs []error) error {
	const shown = 3
	if len(errs) <= shown {
		return errors.Join(errs...)
	}
	return errors.Join(append(errs[:shown:shown], fmt.Errorf("and %d more service ports", len(errs)-shown))...)
}

// countDiff counts the keys whose elements differ between a and b.
func countDiff(a, b *State) int {
	return diffMap(a.Services, b.Services) + diffMap(a.Slots, b.Slots) + diffMap(a.Endpoints, b.Endpoints)
}

func diffMap[K, V comparable](a, b map[K]V) int {
	n := 0
	for k, v := range a {
		if o, ok := b[k]; !ok || o != v {
			n++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			n++
		}
	}
	return n
}

// protocolNumber returns the IP protocol number of svc's protocol.
func protocolNumber(svc changetracker.ServicePort) (uint8, bool) {
	if svc == nil {
		return 0, false
	}
	return ProtocolNumber(svc.Protocol())
}

// ProtocolNumber returns the IP protocol number the maps key p by (6, 17
// or 132), and false for any other protocol.
func ProtocolNumber(p v1.Protocol) (uint8, bool) {
	switch p {
	case v1.ProtocolTCP:
		return 6, true
	case v1.ProtocolUDP:
		return 17, true
	case v1.ProtocolSCTP:
		return 132, true
	}
	return 0, false
}

// idAlloc hands out ids 1 to limit. A freed id is reused only after the
// sync that freed it is written (commit), so that no element is given a
// new meaning while the slots that named it are still being rewritten.
type idAlloc struct {
	next    uint32
	limit   uint32
	free_   []uint32
	pending []uint32
}

func (a *idAlloc) get(what string, size int) (uint32, error) {
	if n := len(a.free_); n > 0 {
		id := a.free_[n-1]
		a.free_ = a.free_[:n-1]
		return id, nil
	}
	if a.next >= a.limit {
		return 0, mapFull(what, size)
	}
	a.next++
	return a.next, nil
}

func (a *idAlloc) free(id uint32) { a.pending = append(a.pending, id) }

func (a *idAlloc) commit() {
	a.free_ = append(a.free_, a.pending...)
	a.pending = a.pending[:0]
}
