package changetracker

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// EndpointsMap maps every service port with endpoints to its endpoints,
// sorted by their "ip:port" strings as kube-proxy sorts them (see
// CompareHostPort). Ports without endpoints are absent. A proxier
// keeps one per IP family and brings it up to date with Update.
type EndpointsMap map[ServicePortName][]Endpoint

// EndpointsChangeTracker records changes to EndpointSlices, for one IP family,
// until an EndpointsMap takes them with Update. Create it with
// NewEndpointsChangeTracker. Its methods are safe for concurrent use: informer
// goroutines call EndpointSliceUpdate while the sync goroutine calls
// EndpointsMap.Update.
type EndpointsChangeTracker struct {
	ipFamily     v1.IPFamily
	addressType  discoveryv1.AddressType
	nodeName     string
	makeEndpoint MakeEndpointFunc
	logger       klog.Logger
	startTime    time.Time

	mu       sync.Mutex
	services map[types.NamespacedName]*serviceSlices
	// dirty lists the Services with a pending slice change, each once
	// (serviceSlices.dirty tells whether it is listed), so that Update
	// visits only them.
	dirty        []*serviceSlices
	triggerTimes map[types.NamespacedName][]time.Time
	// scratch is buildPorts' reusable buffer, used under mu.
	scratch []candidate
	// changes is checkout's list, lent to one Update at a time and
	// handed back empty, so that an Update allocates none.
	changes []endpointsChange
}

// NewEndpointsChangeTracker returns a tracker for EndpointSlices of one IP
// family (v1.IPv4Protocol or v1.IPv6Protocol; with any other value every slice
// is ignored). nodeName is this node's name, used for Endpoint.IsLocal; with
// "" no endpoint is local. makeEndpoint may be nil, to store *BaseEndpoint
// values; it only sees endpoints that passed validation (see
// EndpointSliceUpdate).
func NewEndpointsChangeTracker(ipFamily v1.IPFamily, nodeName string, makeEndpoint MakeEndpointFunc, opts ...Option) *EndpointsChangeTracker {
	o := newOptions(opts)
	t := &EndpointsChangeTracker{
		ipFamily:     ipFamily,
		nodeName:     nodeName,
		makeEndpoint: makeEndpoint,
		logger:       o.logger,
		startTime:    o.clock.Now(),
		services:     make(map[types.NamespacedName]*serviceSlices),
	}
	switch ipFamily {
	case v1.IPv4Protocol:
		t.addressType = discoveryv1.AddressTypeIPv4
	case v1.IPv6Protocol:
		t.addressType = discoveryv1.AddressTypeIPv6
	default:
		o.logger.Error(nil, "Endpoints change tracker created for an unknown IP family; it will track nothing", "ipFamily", ipFamily)
	}
	return t
}

// EndpointSliceUpdate records an added or updated EndpointSlice, or a deleted
// one when removeSlice is set. Slices of the other address family (and FQDN
// slices) are ignored. The slice is checked as the API server checks it: a
// slice whose namespace is not a DNS-1123 label, whose name is not a DNS-1123
// subdomain, or whose kubernetes.io/service-name label is missing or not a
// DNS-1123 label cannot be attributed and is logged and ignored; a slice with
// a port name that is not a DNS-1123 label or a protocol other than TCP, UDP
// and SCTP is logged and counts as removed. Inside a valid slice, ports
// without a valid number and endpoints without a usable address (unparsable, or
// unspecified, loopback, link-local, multicast or broadcast, which cannot be
// a backend) are logged and skipped, and the rest of the slice is used. Each
// refusal is one log line at the default verbosity naming the slice.
//
// It returns true when the call recorded a change that needs a sync, and false
// when the slice was ignored, is unchanged from what is already pending or
// applied, or the call undid a pending change (so an add followed by a delete
// before a sync leaves nothing to do). Note that this differs from
// ServiceChangeTracker.Update, as in kube-proxy.
func (t *EndpointsChangeTracker) EndpointSliceUpdate(slice *discoveryv1.EndpointSlice, removeSlice bool) bool {
	if slice == nil {
		return false
	}
	if t.addressType == "" || slice.AddressType != t.addressType {
		return false
	}
	nn, err := t.sliceKey(slice)
	if err != nil {
		if !removeSlice {
			// The add or update was logged; its removal needs no line.
			t.logger.Error(err, "Ignoring invalid endpoint slice")
		}
		return false
	}
	var info *sliceInfo
	if !removeSlice {
		if err := validateSlicePorts(slice); err != nil {
			// Treated as a removal: keeping the slice's previous
			// endpoints would serve what its owner no longer lists.
			t.logger.Error(err, "Ignoring invalid endpoint slice", "endpointSlice", logsafe.KObj(slice))
			removeSlice = true
		} else {
			info = newSliceInfo(t.logger, slice, t.ipFamily, t.nodeName)
		}
	}
	// Parse the trigger time outside the lock, too.
	var trigger time.Time
	if !removeSlice {
		trigger = t.lastChangeTriggerTime(slice)
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	ss := t.services[nn]
	if ss == nil {
		if removeSlice {
			return false
		}
		ss = &serviceSlices{nn: nn}
		ss.slices = ss.oneSlice[:0]
		t.services[nn] = ss
	}
	changed := ss.setPending(slice.Name, info)
	if len(ss.slices) == 0 && len(ss.ports) == 0 && !ss.dirty {
		delete(t.services, nn)
	}
	// A deleted slice's annotation dates from its last update, not from the
	// deletion, so it would report a wrong latency (kubernetes#81360); and
	// a deletion that cancels a pending add leaves nothing to measure.
	if removeSlice {
		delete(t.triggerTimes, nn)
	}
	if !changed {
		return false
	}
	if !ss.dirty {
		ss.dirty = true
		t.dirty = append(t.dirty, ss)
	}
	if !trigger.IsZero() {
		if t.triggerTimes == nil {
			t.triggerTimes = make(map[types.NamespacedName][]time.Time)
		}
		t.triggerTimes[nn] = append(t.triggerTimes[nn], trigger)
	}
	return true
}

// lastChangeTriggerTime returns the slice's
// endpoints.kubernetes.io/last-change-trigger-time, or the zero time when it
// is missing, unparsable (logged) or from before the tracker started.
func (t *EndpointsChangeTracker) lastChangeTriggerTime(slice *discoveryv1.EndpointSlice) time.Time {
	s, ok := slice.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.logger.Error(err, "Ignoring unparsable last-change-trigger-time", "endpointSlice", logsafe.KObj(slice), "value", logsafe.Quote(s))
		return time.Time{}
	}
	if !ts.After(t.startTime) {
		return time.Time{}
	}
	return ts
}

// PendingChanges returns the names of Services with an EndpointSlice change
// that the next EndpointsMap.Update will look at; an empty set when none.
func (t *EndpointsChangeTracker) PendingChanges() sets.Set[types.NamespacedName] {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := sets.New[types.NamespacedName]()
	for _, ss := range t.dirty {
		if ss.hasPending() {
			s.Insert(ss.nn)
		}
	}
	return s
}

// endpointsChange is the change of one Service's endpoints.
type endpointsChange struct {
	nn       types.NamespacedName
	previous []portEndpoints
	current  []portEndpoints
}

// checkout applies the pending slice changes of dirty Services and returns the
// Services whose endpoints changed, with the trigger times collected since the
// last checkout.
func (t *EndpointsChangeTracker) checkout() ([]endpointsChange, map[types.NamespacedName][]time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	times := t.triggerTimes
	t.triggerTimes = nil
	if len(t.dirty) == 0 {
		return nil, times
	}
	// An Update that overlapped another (which the one map per tracker
	// rules out) would find t.changes nil and allocate its own.
	changes := slices.Grow(t.changes[:0], len(t.dirty))
	t.changes = nil
	for _, ss := range t.dirty {
		ss.dirty = false
		if !ss.hasPending() {
			if len(ss.slices) == 0 && len(ss.ports) == 0 {
				delete(t.services, ss.nn)
			}
			continue
		}
		ss.applyPending()
		var ports []portEndpoints
		ports, t.scratch = ss.buildPorts(ss.nn, t.scratch)
		if !portsEqual(ss.ports, ports) {
			t.makeEndpoints(ports)
			changes = append(changes, endpointsChange{nn: ss.nn, previous: ss.ports, current: ports})
			ss.ports = ports
		}
		// Otherwise the slices changed but the endpoints did not (for
		// example an endpoint moved from one slice to another).
		if len(ss.slices) == 0 {
			delete(t.services, ss.nn)
		}
	}
	clear(t.dirty)
	t.dirty = t.dirty[:0]
	return changes, times
}

// makeEndpoints fills in the Endpoint values of freshly built ports, through
// the MakeEndpointFunc when there is one. A port left without endpoints is
// kept (so that the change is seen) but not stored in the map.
func (t *EndpointsChangeTracker) makeEndpoints(ports []portEndpoints) {
	for i := range ports {
		p := &ports[i]
		p.endpoints = make([]Endpoint, 0, len(p.base))
		for k := range p.base {
			b := &p.base[k]
			if t.makeEndpoint == nil {
				p.endpoints = append(p.endpoints, b)
				continue
			}
			ep := t.makeEndpoint(b, &p.name)
			if isNil(ep) {
				continue
			}
			p.endpoints = append(p.endpoints, ep)
		}
	}
}

// UpdateEndpointsMapResult tells a proxier what an EndpointsMap.Update
// changed.
type UpdateEndpointsMapResult struct {
	// UpdatedServices holds the Services whose endpoints were added, changed
	// or removed. An iptables-style backend can resync just these. Never nil.
	UpdatedServices sets.Set[types.NamespacedName]
	// ConntrackCleanupRequired is true when the endpoints of any UDP port
	// changed, so stale conntrack entries may need clearing (UDP entries
	// outlive the endpoints they point to, and entries created while a port
	// had no endpoints keep black-holing traffic).
	ConntrackCleanupRequired bool
	// ConntrackCleanupPorts holds the UDP service ports whose endpoints
	// changed, gained their first endpoint or lost their last one. Never nil.
	ConntrackCleanupPorts sets.Set[ServicePortName]
	// LastChangeTriggerTimes holds, per Service, the
	// endpoints.kubernetes.io/last-change-trigger-time values of the slice
	// updates taken since the last Update (after the tracker started), for a
	// network-programming-latency metric. Never nil.
	LastChangeTriggerTimes map[types.NamespacedName][]time.Time
	// LocalReadyEndpoints holds, for every Service in UpdatedServices, its
	// count after the update as EndpointsMap.LocalReadyEndpoints returns
	// it, or 0 when it has no local ready endpoint now. Applying these to
	// the previous LocalReadyEndpoints (0 deletes) gives the new one, so a
	// proxier can keep its health checks up to date at the cost of the
	// change instead of walking the map. Never nil.
	LocalReadyEndpoints map[types.NamespacedName]int
}

// Update applies the changes pending in t to m and returns what changed. Its
// cost is proportional to the size of the changed Services, not to the size
// of m. A nil tracker changes nothing. m must be the only map updated from t.
func (m EndpointsMap) Update(t *EndpointsChangeTracker) UpdateEndpointsMapResult {
	result := UpdateEndpointsMapResult{
		ConntrackCleanupPorts: sets.New[ServicePortName](),
	}
	if t == nil {
		result.UpdatedServices = sets.New[types.NamespacedName]()
		result.LastChangeTriggerTimes = map[types.NamespacedName][]time.Time{}
		result.LocalReadyEndpoints = map[types.NamespacedName]int{}
		return result
	}
	changes, times := t.checkout()
	result.UpdatedServices = make(sets.Set[types.NamespacedName], len(changes))
	result.LocalReadyEndpoints = make(map[types.NamespacedName]int, len(changes))
	if times == nil {
		times = map[types.NamespacedName][]time.Time{}
	}
	result.LastChangeTriggerTimes = times
	var ips []netip.Addr
	for i := range changes {
		c := &changes[i]
		result.UpdatedServices.Insert(c.nn)
		// c.current is every port of the Service, so its endpoints are
		// all that m holds for it after this update.
		ips = ips[:0]
		for k := range c.current {
			ips = appendLocalReadyIPs(ips, c.current[k].endpoints)
		}
		result.LocalReadyEndpoints[c.nn] = countDistinct(ips)
		// Both lists are sorted by port name and protocol: walk them
		// together.
		prev, cur := c.previous, c.current
		for len(prev) > 0 || len(cur) > 0 {
			var order int
			switch {
			case len(prev) == 0:
				order = 1
			case len(cur) == 0:
				order = -1
			default:
				order = comparePortNames(prev[0].name, cur[0].name)
			}
			switch {
			case order < 0: // port gone
				p := &prev[0]
				delete(m, p.name)
				if p.name.Protocol == v1.ProtocolUDP && len(p.base) > 0 {
					result.ConntrackCleanupPorts.Insert(p.name)
				}
				prev = prev[1:]
			case order > 0: // new port
				p := &cur[0]
				storePort(m, p)
				if p.name.Protocol == v1.ProtocolUDP && len(p.base) > 0 {
					result.ConntrackCleanupPorts.Insert(p.name)
				}
				cur = cur[1:]
			default: // port kept, endpoints maybe changed
				p := &cur[0]
				storePort(m, p)
				if p.name.Protocol == v1.ProtocolUDP && !baseListEqual(prev[0].base, p.base) {
					result.ConntrackCleanupPorts.Insert(p.name)
				}
				prev, cur = prev[1:], cur[1:]
			}
		}
	}
	result.ConntrackCleanupRequired = result.ConntrackCleanupPorts.Len() > 0
	// Hand the list back, without the port lists it points to.
	clear(changes)
	t.mu.Lock()
	t.changes = changes[:0]
	t.mu.Unlock()
	return result
}

// storePort puts a port's endpoints in m, or removes the port when it has
// none left.
func storePort(m EndpointsMap, p *portEndpoints) {
	if len(p.endpoints) == 0 {
		delete(m, p.name)
	} else {
		m[p.name] = p.endpoints
	}
}

// LocalReadyEndpoints returns, for every Service with ready endpoints on this
// node, how many distinct local ready IPs it has (an IP serving two ports
// counts once). Terminating endpoints do not count, so that a node whose only
// endpoints are terminating fails its health check. Services with none are
// absent. It walks the whole map: after a partial update,
// UpdateEndpointsMapResult.LocalReadyEndpoints says what changed at the cost
// of the change.
func (m EndpointsMap) LocalReadyEndpoints() map[types.NamespacedName]int {
	ips := make(map[types.NamespacedName][]netip.Addr)
	for name, eps := range m {
		if s := appendLocalReadyIPs(ips[name.NamespacedName], eps); len(s) > 0 {
			ips[name.NamespacedName] = s
		}
	}
	counts := make(map[types.NamespacedName]int, len(ips))
	for nn, s := range ips {
		counts[nn] = countDistinct(s)
	}
	return counts
}

// appendLocalReadyIPs appends the addresses of the local, ready endpoints
// in eps to ips.
func appendLocalReadyIPs(ips []netip.Addr, eps []Endpoint) []netip.Addr {
	for _, ep := range eps {
		if ep.IsLocal() && ep.IsReady() {
			ips = append(ips, ep.IP())
		}
	}
	return ips
}

// countDistinct returns how many different addresses ips holds; it sorts
// ips.
func countDistinct(ips []netip.Addr) int {
	slices.SortFunc(ips, netip.Addr.Compare)
	return len(slices.Compact(ips))
}
