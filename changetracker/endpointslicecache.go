package changetracker

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// maxEndpointsPerSlice is the API server's limit. Bigger slices (from
// manifests or a misbehaving controller) are still handled, but logged.
const maxEndpointsPerSlice = 1000

// The endpoint-slice cache keeps, per Service, a compact copy of each of its
// EndpointSlices as last applied and as pending, and the per-port endpoint
// lists computed from the applied ones. Only Services with a pending change
// are recomputed by EndpointsMap.Update, so a change costs what it touches.

// serviceSlices is the cache entry of one Service.
type serviceSlices struct {
	nn     types.NamespacedName
	dirty  bool // listed in EndpointsChangeTracker.dirty
	slices []*sliceState
	// oneSlice backs slices for the usual single-slice Service.
	oneSlice [1]*sliceState
	// ports holds the endpoints built from the applied slices, as stored in
	// the EndpointsMap, sorted by port name and protocol.
	ports []portEndpoints
	// onePort backs ports, in turns with an allocated array, for the
	// usual Service of one port in one slice: a change's previous ports
	// must stay readable until the Update that applies the change is
	// done, so the new ones are built where the previous are not.
	onePort [1]portEndpoints
}

// sliceState is one EndpointSlice of a Service.
type sliceState struct {
	name    string
	applied *sliceInfo // nil when not applied yet
	// pending is the state to apply at the next Update when hasPending is
	// set; a nil pending then means "remove the slice".
	pending    *sliceInfo
	hasPending bool
}

// sliceInfo is the part of an EndpointSlice the proxy uses. It is kept small
// because there is one per slice in the cluster.
type sliceInfo struct {
	ports []slicePort // sorted by name, then protocol
	// onePort backs ports for the usual single-port slice, saving an
	// allocation per slice.
	onePort [1]slicePort
	// endpoints is sorted as CompareHostPort orders them. When the slice
	// has exactly one port its number is filled in, and a Service with
	// that one slice uses this array as its endpoint list as it is: the
	// common case then costs one BaseEndpoint per endpoint, not two
	// structures.
	endpoints []BaseEndpoint
}

type slicePort struct {
	name     string
	protocol v1.Protocol
	port     int32
}

// portEndpoints is the endpoint list of one service port.
type portEndpoints struct {
	name ServicePortName
	// base holds the tracker's data for each endpoint, allocated in one
	// block; endpoints holds what MakeEndpointFunc made of them.
	base      []BaseEndpoint
	endpoints []Endpoint
}

// sliceKey returns the Service an EndpointSlice belongs to, or an error naming
// the slice when it cannot be attributed to one or the API server would
// refuse its name, namespace or service-name label (see validateSliceObject).
func sliceKey(slice *discoveryv1.EndpointSlice) (types.NamespacedName, error) {
	if err := validateSliceObject(slice); err != nil {
		return types.NamespacedName{}, fmt.Errorf("endpoint slice %q in namespace %q: %w", slice.Name, slice.Namespace, err)
	}
	return types.NamespacedName{Namespace: slice.Namespace, Name: slice.Labels[discoveryv1.LabelServiceName]}, nil
}

// sliceKey is the package's sliceKey, which validates the slice's names,
// except for a slice the tracker already holds under the same name for the
// same Service: its namespace, name and service-name label are then the
// strings that passed when it was stored, so an update of a known slice
// (the usual event) costs no regular-expression matching.
func (t *EndpointsChangeTracker) sliceKey(slice *discoveryv1.EndpointSlice) (types.NamespacedName, error) {
	nn := types.NamespacedName{Namespace: slice.Namespace, Name: slice.Labels[discoveryv1.LabelServiceName]}
	known := false
	t.mu.Lock()
	if ss := t.services[nn]; ss != nil {
		for _, s := range ss.slices {
			if s.name == slice.Name {
				known = true
				break
			}
		}
	}
	t.mu.Unlock()
	if known {
		return nn, nil
	}
	return sliceKey(slice)
}

// newSliceInfo copies what the proxy uses out of slice, skipping (with a log
// line naming the slice) ports without a number, duplicate ports, endpoints
// without an address, addresses that do not parse or are of the other family,
// and addresses that cannot be a backend (see SpecialAddressReason). The slice's
// names and port names must have been validated.
func newSliceInfo(logger klog.Logger, slice *discoveryv1.EndpointSlice, ipFamily v1.IPFamily, nodeName string) *sliceInfo {
	info := &sliceInfo{}
	if len(slice.Ports) == 1 {
		info.ports = info.onePort[:0]
	} else if len(slice.Ports) > 1 {
		info.ports = make([]slicePort, 0, len(slice.Ports))
	}
	for i := range slice.Ports {
		p := &slice.Ports[i]
		sp := slicePort{protocol: v1.ProtocolTCP}
		if p.Name != nil {
			sp.name = *p.Name
		}
		if p.Protocol != nil && *p.Protocol != "" {
			sp.protocol = *p.Protocol
		}
		if p.Port == nil {
			// A nil port means "all ports" in the API, which a
			// port-mapping proxy cannot express.
			logger.V(2).Info("Ignoring endpoint slice port without a number", "endpointSlice", logsafe.KObj(slice), "portName", logsafe.Quote(sp.name))
			continue
		}
		if err := firstPortNumMsg("port", int(*p.Port)); err != nil {
			logger.Error(err, "Ignoring invalid endpoint slice port", "endpointSlice", logsafe.KObj(slice), "portName", logsafe.Quote(sp.name))
			continue
		}
		sp.port = *p.Port
		info.ports = append(info.ports, sp)
	}
	// Sort (stably, so the first of duplicates stays first) and drop
	// duplicate names: sorting keeps this O(n log n) for hostile input.
	slices.SortStableFunc(info.ports, compareSlicePorts)
	info.ports = slices.CompactFunc(info.ports, func(a, b slicePort) bool {
		if a.name == b.name && a.protocol == b.protocol {
			logger.Error(nil, "Ignoring duplicate endpoint slice port", "endpointSlice", logsafe.KObj(slice), "portName", logsafe.Quote(b.name), "protocol", logsafe.Quote(string(b.protocol)))
			return true
		}
		return false
	})

	if len(slice.Endpoints) > maxEndpointsPerSlice {
		logger.V(2).Info("Endpoint slice has more endpoints than the API allows", "endpointSlice", logsafe.KObj(slice), "endpoints", len(slice.Endpoints), "limit", maxEndpointsPerSlice)
	}
	if len(slice.Endpoints) > 0 {
		info.endpoints = make([]BaseEndpoint, 0, len(slice.Endpoints))
	}
	var onlyPort int32
	if len(info.ports) == 1 {
		onlyPort = info.ports[0].port
	}
	// First the usable addresses, in a small array of sort keys: the
	// endpoints are then built once, in order, rather than moved around
	// by a sort (they are large and hold pointers).
	var refBuf [128]endpointRef
	var addrBuf [128]netip.Addr
	refs, addrs := refBuf[:0], addrBuf[:0]
	if len(slice.Endpoints) > len(refBuf) {
		refs = make([]endpointRef, 0, len(slice.Endpoints))
		addrs = make([]netip.Addr, 0, len(slice.Endpoints))
	}
	sorted := true
	for i := range slice.Endpoints {
		ep := &slice.Endpoints[i]
		if len(ep.Addresses) == 0 {
			logger.V(2).Info("Ignoring endpoint without an address", "endpointSlice", logsafe.KObj(slice), "index", i)
			continue
		}
		addr, ok := parseAddr(ep.Addresses[0])
		if !ok {
			logger.Error(nil, "Ignoring endpoint with an unparsable address", "endpointSlice", logsafe.KObj(slice), "address", logsafe.Quote(ep.Addresses[0]))
			continue
		}
		if familyOf(addr) != ipFamily {
			logger.V(4).Info("Ignoring endpoint of the other IP family", "endpointSlice", logsafe.KObj(slice), "address", logsafe.Quote(ep.Addresses[0]))
			continue
		}
		if reason := SpecialAddressReason(addr); reason != "" {
			logger.Error(nil, "Ignoring endpoint that cannot be a backend", "endpointSlice", logsafe.KObj(slice), "address", logsafe.Quote(ep.Addresses[0]), "reason", reason)
			continue
		}
		r := endpointRef{slice: int32(i), addr: int32(len(addrs))}
		if addr.Is4() {
			r.key = ipv4TextKey(addr)
		}
		addrs = append(addrs, addr)
		if n := len(refs); n > 0 && compareEndpointRefs(refs[n-1], r, addrs) > 0 {
			sorted = false
		}
		refs = append(refs, r)
	}
	if !sorted {
		// With several ports the order of "ip:p" strings is the same
		// for any one port p (see CompareHostPort), so buildPorts keeps
		// this order.
		slices.SortFunc(refs, func(a, b endpointRef) int { return compareEndpointRefs(a, b, addrs) })
	}

	var lastZones, lastNodes sets.Set[string]
	var lastHintSrc *discoveryv1.EndpointHints
	for _, r := range refs {
		ep := &slice.Endpoints[r.slice]
		info.endpoints = append(info.endpoints, BaseEndpoint{ip: addrs[r.addr], port: onlyPort})
		be := &info.endpoints[len(info.endpoints)-1]
		if ep.NodeName != nil {
			be.nodeName = *ep.NodeName
			if nodeName != "" && be.nodeName == nodeName {
				be.flags |= flagLocal
			}
		}
		if ep.Zone != nil {
			be.zone = *ep.Zone
		}
		c := &ep.Conditions
		if c.Ready == nil || *c.Ready {
			be.flags |= flagReady
		}
		if c.Serving == nil || *c.Serving {
			be.flags |= flagServing
		}
		if c.Terminating != nil && *c.Terminating {
			be.flags |= flagTerminating
		}
		if h := ep.Hints; h != nil && (len(h.ForZones) > 0 || len(h.ForNodes) > 0) {
			// Endpoints next to each other usually carry the same hints;
			// share the sets rather than building them per endpoint.
			if lastHintSrc == nil || !sameHints(lastHintSrc, h) {
				lastZones, lastNodes = hintSets(h)
				lastHintSrc = h
			}
			be.zoneHints, be.nodeHints = lastZones, lastNodes
		}
	}
	return info
}

// endpointRef is an endpoint of a slice being sorted: its index in the
// slice, its parsed address's index, and ipv4TextKey of that address (0 for
// IPv6, which compares by text).
type endpointRef struct {
	key   uint64
	slice int32
	addr  int32
}

// compareEndpointRefs orders refs as CompareHostPort orders their
// addresses (all with one port), then by position in the slice, so that the
// sort is stable: of duplicate addresses, the first listed comes first.
func compareEndpointRefs(a, b endpointRef, addrs []netip.Addr) int {
	if c := cmp.Compare(a.key, b.key); c != 0 {
		return c
	}
	if c := CompareHostPort(addrs[a.addr], 0, addrs[b.addr], 0); c != 0 {
		return c
	}
	return cmp.Compare(a.slice, b.slice)
}

func compareSlicePorts(a, b slicePort) int {
	if c := cmp.Compare(a.name, b.name); c != 0 {
		return c
	}
	return cmp.Compare(a.protocol, b.protocol)
}

func hintSets(h *discoveryv1.EndpointHints) (zones, nodes sets.Set[string]) {
	if len(h.ForZones) > 0 {
		zones = make(sets.Set[string], len(h.ForZones))
		for _, z := range h.ForZones {
			zones.Insert(z.Name)
		}
	}
	if len(h.ForNodes) > 0 {
		nodes = make(sets.Set[string], len(h.ForNodes))
		for _, n := range h.ForNodes {
			nodes.Insert(n.Name)
		}
	}
	return zones, nodes
}

func sameHints(a, b *discoveryv1.EndpointHints) bool {
	return slices.Equal(a.ForZones, b.ForZones) && slices.Equal(a.ForNodes, b.ForNodes)
}

// equal reports whether two slice infos carry the same data; nil equals nil.
func (s *sliceInfo) equal(o *sliceInfo) bool {
	if s == nil || o == nil {
		return s == o
	}
	return slices.Equal(s.ports, o.ports) && baseListEqual(s.endpoints, o.endpoints)
}

// findSlice returns the state of the named slice, or nil.
func (s *serviceSlices) findSlice(name string) *sliceState {
	for _, st := range s.slices {
		if st.name == name {
			return st
		}
	}
	return nil
}

// setPending records info (nil: removal) as the pending state of the named
// slice. It returns whether a sync is needed for it: false when info matches
// what is already pending, or when it cancels a pending change by returning to
// the applied state.
func (s *serviceSlices) setPending(name string, info *sliceInfo) (changed bool) {
	st := s.findSlice(name)
	if st == nil {
		if info == nil {
			return false
		}
		s.slices = append(s.slices, &sliceState{name: name, pending: info, hasPending: true})
		return true
	}
	if st.hasPending {
		if st.pending.equal(info) {
			return false
		}
		if st.applied.equal(info) {
			// Back to where it started: nothing to do for this slice.
			st.pending, st.hasPending = nil, false
			s.dropIfEmpty(st)
			return false
		}
		st.pending = info
		return true
	}
	if st.applied.equal(info) {
		return false
	}
	st.pending, st.hasPending = info, true
	return true
}

// dropIfEmpty forgets a slice that is neither applied nor pending.
func (s *serviceSlices) dropIfEmpty(st *sliceState) {
	if st.applied != nil || st.hasPending {
		return
	}
	s.slices = slices.DeleteFunc(s.slices, func(o *sliceState) bool { return o == st })
}

// hasPending reports whether any slice of the service has a pending change.
func (s *serviceSlices) hasPending() bool {
	for _, st := range s.slices {
		if st.hasPending {
			return true
		}
	}
	return false
}

// applyPending moves pending slice states to applied.
func (s *serviceSlices) applyPending() {
	kept := s.slices[:0]
	for _, st := range s.slices {
		if st.hasPending {
			st.applied, st.pending, st.hasPending = st.pending, nil, false
		}
		if st.applied != nil {
			kept = append(kept, st)
		}
	}
	clear(s.slices[len(kept):])
	s.slices = kept
}

// candidate is one endpoint of one slice for one port, before de-duplication.
type candidate struct {
	ep   *BaseEndpoint
	port int32
}

// buildPorts computes the base endpoints of every port of the Service nn from
// its applied slices. An address listed more than once for a port number
// (in several slices while the controller moves an endpoint, or for two
// pods while a terminating pod's IP is reused) is kept once, as preferCopy
// chooses. Lists are sorted by "ip:port" string, as
// kube-proxy sorts them (see CompareHostPort). scratch
// is a reusable buffer; the grown buffer is returned.
func (s *serviceSlices) buildPorts(nn types.NamespacedName, scratch []candidate) ([]portEndpoints, []candidate) {
	if len(s.slices) == 1 && len(s.slices[0].applied.ports) == 1 && uniqueAddrs(s.slices[0].applied.endpoints) {
		// The common case: one slice with one port, whose endpoints already
		// carry the port number.
		info := s.slices[0].applied
		p := info.ports[0]
		out := s.onePort[:]
		if len(s.ports) > 0 && &s.ports[0] == &s.onePort[0] {
			out = make([]portEndpoints, 1)
		}
		out[0] = portEndpoints{
			name: ServicePortName{NamespacedName: nn, Port: p.name, Protocol: p.protocol},
			base: info.endpoints,
		}
		return out, scratch
	}
	// Group the ports of all slices by name and protocol; sorting keeps
	// this O(n log n) however many ports and slices there are.
	type portRef struct {
		slicePort
		info *sliceInfo
	}
	var refs []portRef
	for _, st := range s.slices {
		for _, p := range st.applied.ports {
			refs = append(refs, portRef{slicePort: p, info: st.applied})
		}
	}
	slices.SortStableFunc(refs, func(a, b portRef) int { return compareSlicePorts(a.slicePort, b.slicePort) })
	var out []portEndpoints
	cands := scratch
	for i := 0; i < len(refs); {
		j := i + 1
		for j < len(refs) && refs[j].name == refs[i].name && refs[j].protocol == refs[i].protocol {
			j++
		}
		cands = cands[:0]
		for _, r := range refs[i:j] {
			for k := range r.info.endpoints {
				cands = append(cands, candidate{ep: &r.info.endpoints[k], port: r.port})
			}
		}
		if j-i > 1 {
			// Several slices: merge their (sorted) lists.
			slices.SortStableFunc(cands, func(a, b candidate) int {
				return compareHostPort(a.ep.ip, a.port, b.ep.ip, b.port)
			})
		}
		out = append(out, portEndpoints{
			name: ServicePortName{NamespacedName: nn, Port: refs[i].name, Protocol: refs[i].protocol},
			base: baseEndpoints(cands),
		})
		i = j
	}
	clear(cands) // do not keep slice data alive through the buffer
	return out, cands[:0]
}

// uniqueAddrs reports whether a sorted list has no duplicate address (copies
// of one address are adjacent in the order of CompareHostPort).
func uniqueAddrs(eps []BaseEndpoint) bool {
	for i := 1; i < len(eps); i++ {
		if eps[i].ip == eps[i-1].ip {
			return false
		}
	}
	return true
}

// baseEndpoints turns sorted candidates into BaseEndpoints, keeping one of
// the copies of an address and port (see preferCopy).
func baseEndpoints(cands []candidate) []BaseEndpoint {
	n := 0
	for i := range cands {
		if i == 0 || !sameTarget(cands[i-1], cands[i]) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	base := make([]BaseEndpoint, n)
	j := -1
	for i := range cands {
		c := cands[i]
		if i > 0 && sameTarget(cands[i-1], c) {
			if !preferCopy(c.ep.flags, base[j].flags) {
				continue
			}
		} else {
			j++
		}
		b := &base[j]
		b.ip, b.port, b.flags = c.ep.ip, c.port, c.ep.flags
		b.nodeName, b.zone = c.ep.nodeName, c.ep.zone
		b.zoneHints, b.nodeHints = c.ep.zoneHints, c.ep.nodeHints
	}
	return base
}

// preferCopy reports whether a copy of an endpoint with flags c replaces
// the copy kept so far, with flags kept. A copy that is not terminating
// always wins over a terminating one, whatever the order of the slices:
// when the pod network hands a terminating pod's IP to a new pod before the
// old Pod object is gone, both pods are listed under the same address, and
// the new, running pod must get the traffic (kube-proxy does the same since
// kubernetes#135266). Between copies alike in that, a local copy wins, and
// otherwise the first in slice order stays.
func preferCopy(c, kept endpointFlags) bool {
	if cTerm, keptTerm := c&flagTerminating != 0, kept&flagTerminating != 0; cTerm != keptTerm {
		return keptTerm
	}
	return c&flagLocal != 0 && kept&flagLocal == 0
}

func sameTarget(a, b candidate) bool {
	return a.port == b.port && a.ep.ip == b.ep.ip
}

// portsEqual reports whether two built port lists carry the same data.
func portsEqual(a, b []portEndpoints) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || !baseListEqual(a[i].base, b[i].base) {
			return false
		}
	}
	return true
}

func baseListEqual(a, b []BaseEndpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].sameAs(&b[i]) {
			return false
		}
	}
	return true
}

// comparePortNames orders the ports of one Service by name, then protocol,
// the order of portEndpoints lists.
func comparePortNames(a, b ServicePortName) int {
	if c := cmp.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	return cmp.Compare(a.Protocol, b.Protocol)
}
