package changetracker

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// ServicePortMap maps every proxied service port to its ServicePort. A
// proxier keeps one per IP family and brings it up to date with Update.
type ServicePortMap map[ServicePortName]ServicePort

// ServiceChangeTracker records changes to Services, for one IP family, until a
// ServicePortMap takes them with Update. Create it with
// NewServiceChangeTracker. Its methods are safe for concurrent use: informer
// goroutines call Update while the sync goroutine calls ServicePortMap.Update.
type ServiceChangeTracker struct {
	ipFamily        v1.IPFamily
	makeServicePort MakeServicePortFunc
	logger          klog.Logger
	nodeIPs         []netip.Addr

	mu sync.Mutex
	// items holds, per Service with a pending change, its ports as last
	// applied and as they are now. nil when nothing is pending.
	items map[types.NamespacedName]*serviceChange
}

// serviceChange is the accumulated change of one Service since the last
// ServicePortMap.Update: previous is the state that was applied, current the
// latest one seen.
type serviceChange struct {
	previous []namedServicePort
	current  []namedServicePort
}

type namedServicePort struct {
	name ServicePortName
	port ServicePort
}

// NewServiceChangeTracker returns a tracker for Services of one IP family
// (v1.IPv4Protocol or v1.IPv6Protocol; with any other value every Service is
// skipped). makeServicePort may be nil, to store *BaseServicePort values; it
// is only called for ports that passed validation (see Update).
func NewServiceChangeTracker(ipFamily v1.IPFamily, makeServicePort MakeServicePortFunc, opts ...Option) *ServiceChangeTracker {
	o := newOptions(opts)
	if ipFamily != v1.IPv4Protocol && ipFamily != v1.IPv6Protocol {
		o.logger.Error(nil, "Service change tracker created for an unknown IP family; it will track nothing", "ipFamily", ipFamily)
	}
	return &ServiceChangeTracker{
		ipFamily:        ipFamily,
		makeServicePort: makeServicePort,
		logger:          o.logger,
		nodeIPs:         o.nodeIPs,
	}
}

// Update records a change to one Service: an add (previous nil), an update, or
// a delete (current nil). Changes to the same Service accumulate until the
// next ServicePortMap.Update, and a change that ends where it started (for
// example an add followed by a delete, or an update that only touched fields
// the proxy does not use) is dropped.
//
// Services that the proxy does not handle in this IP family (headless,
// ExternalName, without a cluster IP of the family) count as having no ports,
// so a Service that becomes headless is removed. So do Services the API server
// would refuse (see the package documentation for the checks): a Service
// updated to an invalid state is removed, with one log line at the default
// verbosity naming it. Bad ports (a number out of range, an unknown protocol,
// a name used twice) are logged with the Service's name and the port's and
// skipped, and the Service's other ports are kept.
//
// As in kube-proxy, it returns true when the tracker has any pending change,
// whether or not this call added one. Update(nil, nil) does nothing.
func (t *ServiceChangeTracker) Update(previous, current *v1.Service) bool {
	svc := current
	if svc == nil {
		svc = previous
	}
	if svc == nil {
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.items) > 0
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	cur := t.servicePorts(t.logger, current)

	t.mu.Lock()
	change, ok := t.items[nn]
	if !ok {
		// Build the previous state outside the lock: informers for other
		// Services and the sync goroutine should not wait for it.
		t.mu.Unlock()
		// previous was logged about when it was current; the zero
		// Logger discards.
		prev := t.servicePorts(klog.Logger{}, previous)
		t.mu.Lock()
		if change, ok = t.items[nn]; !ok {
			change = &serviceChange{previous: prev}
			if t.items == nil {
				t.items = make(map[types.NamespacedName]*serviceChange)
			}
			t.items[nn] = change
		}
	}
	defer t.mu.Unlock()
	change.current = cur
	if servicePortsEqual(change.previous, change.current) {
		delete(t.items, nn)
	}
	return len(t.items) > 0
}

// PendingChanges returns the names of Services with a change that the next
// ServicePortMap.Update will apply; an empty set when there are none.
func (t *ServiceChangeTracker) PendingChanges() sets.Set[types.NamespacedName] {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := sets.New[types.NamespacedName]()
	for nn := range t.items {
		s.Insert(nn)
	}
	return s
}

// servicePorts builds the ports of service that this tracker proxies, in the
// order of spec.ports. It returns nil for a nil Service, for Services that
// are not proxied in the tracker's family, and for Services the API server
// would refuse (see validateServiceObject). Refusals are logged through
// logger, once per object and port, at the default verbosity.
func (t *ServiceChangeTracker) servicePorts(logger klog.Logger, service *v1.Service) []namedServicePort {
	if service == nil {
		return nil
	}
	if err := validateServiceObject(service); err != nil {
		logger.Error(err, "Ignoring invalid service", "service", logsafe.KObj(service))
		return nil
	}
	clusterIP, err := serviceClusterIP(service, t.ipFamily, t.nodeIPs)
	if err != nil {
		// Headless, ExternalName and single-stack Services of the other
		// family are normal; an unparsable address deserves a log.
		if errors.Is(err, errInvalid) {
			logger.Error(err, "Ignoring invalid service", "service", logsafe.KObj(service), "ipFamily", t.ipFamily)
		} else {
			logger.V(4).Info("Skipping service for this IP family", "service", logsafe.KObj(service), "ipFamily", t.ipFamily, "reason", err.Error())
		}
		return nil
	}
	if len(service.Spec.Ports) == 0 {
		return nil
	}
	w, err := serviceWide(logger, service, t.ipFamily)
	if err != nil {
		logger.Error(err, "Ignoring invalid service", "service", logsafe.KObj(service))
		return nil
	}
	ports := make([]namedServicePort, 0, len(service.Spec.Ports))
	for i := range service.Spec.Ports {
		sp := &service.Spec.Ports[i]
		if err := validateServicePortNumbers(sp); err != nil {
			logger.Error(err, "Ignoring invalid service port", "service", logsafe.KObj(service), "portName", logsafe.Quote(sp.Name))
			continue
		}
		proto := sp.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if !validProtocol(proto) {
			logger.Error(nil, "Ignoring service port with unknown protocol", "service", logsafe.KObj(service), "portName", logsafe.Quote(sp.Name), "protocol", logsafe.Quote(string(sp.Protocol)))
			continue
		}
		name := ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: service.Namespace, Name: service.Name},
			Port:           sp.Name,
			Protocol:       proto,
		}
		if hasServicePortName(ports, name) {
			logger.Error(nil, "Ignoring duplicate service port", "service", logsafe.KObj(service), "portName", logsafe.Quote(sp.Name), "protocol", logsafe.Quote(string(proto)))
			continue
		}
		base := newBaseServicePort(service, sp, clusterIP, w)
		var port ServicePort = base
		if t.makeServicePort != nil {
			port = t.makeServicePort(sp, service, base)
			if isNil(port) {
				continue
			}
		}
		ports = append(ports, namedServicePort{name: name, port: port})
	}
	return ports
}

func hasServicePortName(ports []namedServicePort, name ServicePortName) bool {
	for i := range ports {
		if ports[i].name == name {
			return true
		}
	}
	return false
}

// isNil reports whether an interface holds nothing or a nil pointer, so that a
// MakeServicePortFunc returning a typed nil is treated as "drop".
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

func servicePortsEqual(a, b []namedServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || !servicePortEqual(a[i].port, b[i].port) {
			return false
		}
	}
	return true
}

func servicePortEqual(a, b ServicePort) bool {
	if ba, ok := a.(*BaseServicePort); ok {
		if bb, ok := b.(*BaseServicePort); ok {
			return ba.equal(bb)
		}
		return false
	}
	return reflect.DeepEqual(a, b)
}

// UpdateServiceMapResult tells a proxier what a ServicePortMap.Update changed.
type UpdateServiceMapResult struct {
	// UpdatedServices holds the Services whose ports were added, changed or
	// removed. An iptables-style backend can resync just these. Never nil.
	UpdatedServices sets.Set[types.NamespacedName]
	// DeletedUDPClusterIPs holds the cluster IPs of UDP ports that were
	// removed, whose conntrack entries should be cleared. Never nil.
	DeletedUDPClusterIPs sets.Set[netip.Addr]
	// HealthCheckNodePorts holds, for every Service in UpdatedServices, its
	// health-check node port after the update as
	// ServicePortMap.HealthCheckNodePorts returns it, or 0 when it has none
	// now (it was removed, lost its ports, or no longer has a valid one).
	// Applying these to the previous HealthCheckNodePorts (0 deletes) gives
	// the new one, so a proxier can keep its health checks up to date at the
	// cost of the change instead of walking the map. Never nil.
	HealthCheckNodePorts map[types.NamespacedName]uint16
	// Ports holds, for every Service in UpdatedServices, the names of its
	// ports in the map after the update, sorted by CompareServicePortNames
	// (none when it was removed or has no ports now), so that a partial
	// sync finds a changed Service's ports at the cost of the change
	// instead of walking the map. Never nil from Update; a result made by
	// hand may leave it nil, which says nothing about the ports. The
	// slices are shared: read them, do not modify them.
	Ports map[types.NamespacedName][]ServicePortName
}

// PortsIn returns r.Ports, or, when it is nil (a result made by hand), the
// same computed from m, the map r's Update brought up to date, by one walk
// of the whole map. Services in UpdatedServices without ports in m have no
// entry in the computed map (and a nil one in r.Ports); either way a
// lookup gives none.
func (r UpdateServiceMapResult) PortsIn(m ServicePortMap) map[types.NamespacedName][]ServicePortName {
	if r.Ports != nil {
		return r.Ports
	}
	ports := make(map[types.NamespacedName][]ServicePortName)
	if len(r.UpdatedServices) == 0 {
		return ports
	}
	for name := range m {
		if r.UpdatedServices.Has(name.NamespacedName) {
			ports[name.NamespacedName] = append(ports[name.NamespacedName], name)
		}
	}
	for _, names := range ports {
		slices.SortFunc(names, CompareServicePortNames)
	}
	return ports
}

// Update applies the changes pending in t to m and returns what changed. Its
// cost is proportional to the number of changed Services, not to the size of
// m. A nil tracker changes nothing. m must be the only map updated from t.
func (m ServicePortMap) Update(t *ServiceChangeTracker) UpdateServiceMapResult {
	result := UpdateServiceMapResult{
		DeletedUDPClusterIPs: sets.New[netip.Addr](),
	}
	if t == nil {
		result.UpdatedServices = sets.New[types.NamespacedName]()
		result.HealthCheckNodePorts = map[types.NamespacedName]uint16{}
		result.Ports = map[types.NamespacedName][]ServicePortName{}
		return result
	}
	t.mu.Lock()
	items := t.items
	t.items = nil
	t.mu.Unlock()
	result.UpdatedServices = make(sets.Set[types.NamespacedName], len(items))
	result.HealthCheckNodePorts = make(map[types.NamespacedName]uint16, len(items))
	result.Ports = make(map[types.NamespacedName][]ServicePortName, len(items))
	// The port names of all the Services share one array, each Service
	// a full slice expression of it: one allocation per Update rather
	// than one per Service, which at start-up is one per Service in the
	// cluster.
	nPorts := 0
	for _, change := range items {
		nPorts += len(change.current)
	}
	var allNames []ServicePortName
	if nPorts > 0 {
		allNames = make([]ServicePortName, 0, nPorts)
	}

	for nn, change := range items {
		result.UpdatedServices.Insert(nn)
		// change.current is every port the Service has in m after this
		// update, since m holds change.previous for it before.
		result.HealthCheckNodePorts[nn] = 0
		for _, p := range change.current {
			if hc := healthCheckNodePort(p.port); hc != 0 {
				result.HealthCheckNodePorts[nn] = hc
				break
			}
		}
		for _, p := range change.previous {
			if hasServicePortName(change.current, p.name) {
				continue
			}
			delete(m, p.name)
			if p.port.Protocol() == v1.ProtocolUDP {
				result.DeletedUDPClusterIPs.Insert(p.port.ClusterIP())
			}
		}
		start := len(allNames)
		for _, p := range change.current {
			m[p.name] = p.port
			allNames = append(allNames, p.name)
		}
		var names []ServicePortName
		if len(allNames) > start {
			names = allNames[start:len(allNames):len(allNames)]
			slices.SortFunc(names, CompareServicePortNames)
		}
		result.Ports[nn] = names
	}
	return result
}

// HealthCheckNodePorts returns, for every Service with a health-check node
// port, that port (as uint16, the range the API allows). Services without
// one are absent; an empty map when none has one. The ports of a Service
// share its health-check node port; should a MakeServicePortFunc give them
// different ones, which of them is returned is unspecified. It walks the
// whole map: after a partial update, UpdateServiceMapResult.HealthCheckNodePorts
// says what changed at the cost of the change.
func (m ServicePortMap) HealthCheckNodePorts() map[types.NamespacedName]uint16 {
	ports := make(map[types.NamespacedName]uint16)
	for name, p := range m {
		if hc := healthCheckNodePort(p); hc != 0 {
			ports[name.NamespacedName] = hc
		}
	}
	return ports
}

// healthCheckNodePort returns p's health-check node port, or 0 when it has
// none or one outside the range of ports.
func healthCheckNodePort(p ServicePort) uint16 {
	if hc := p.HealthCheckNodePort(); hc > 0 && hc <= 65535 {
		return uint16(hc)
	}
	return 0
}
