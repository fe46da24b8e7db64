package healthz

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// HealthReporter is what the service health server asks about the proxy:
// *ProxyHealthServer is one.
type HealthReporter interface {
	// Health returns the proxy's health; only Healthy is used.
	Health() ProxyHealth
}

// ServiceHealth is the JSON body of a service health check response.
type ServiceHealth struct {
	// Service is the Service the port belongs to.
	Service ServiceName `json:"service"`
	// LocalEndpoints is the number of the Service's endpoints on this
	// node.
	LocalEndpoints int `json:"localEndpoints"`
	// ServiceProxyHealthy is the proxy's own health.
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// ServiceName is a Service's namespace and name, as the JSON body has it.
type ServiceName struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// BindError reports a health-check node port that could not be opened.
// [ServiceHealthServer.SyncServices] and [ServiceHealthServer.UpdateServices]
// return one per such port (joined), keep serving the others, and try the
// port again on their next call.
type BindError struct {
	// Service is the Service whose port failed.
	Service types.NamespacedName
	// Port is the health-check node port.
	Port uint16
	// Err is the listener's error.
	Err error
}

// Error names the Service, the port and the cause.
func (e *BindError) Error() string {
	return fmt.Sprintf("health check of service %s on port %d: %v", e.Service, e.Port, e.Err)
}

// Unwrap returns the listener's error.
func (e *BindError) Unwrap() error { return e.Err }

// ServiceHealthServer serves the health-check node ports of Services with
// externalTrafficPolicy: Local. Its methods are safe for concurrent use.
type ServiceHealthServer struct {
	nodeName  string
	proxy     HealthReporter
	listen    ListenFunc
	addresses []netip.Addr

	mu        sync.RWMutex
	services  map[types.NamespacedName]*healthCheck
	endpoints map[types.NamespacedName]int
	// failed holds the ports asked for that could not be opened, tried
	// again on every SyncServices and UpdateServices.
	failed map[types.NamespacedName]uint16
}

// healthCheck is one Service's open port: one HTTP server per listen
// address.
type healthCheck struct {
	port    uint16
	handler http.Handler
	// servers are by listen host, "" for every address.
	servers map[string]*http.Server
	wg      sync.WaitGroup
}

// NewServiceHealthServer returns a server with no ports open. nodeName is
// used in logs. proxy says whether the proxy itself is healthy; a nil proxy
// counts as always healthy. Options: [WithListenFunc],
// [WithNodeAddresses]; SetNodeAddresses changes the addresses later.
func NewServiceHealthServer(nodeName string, proxy HealthReporter, opts ...Option) *ServiceHealthServer {
	o := newOptions(opts)
	return &ServiceHealthServer{
		nodeName:  nodeName,
		proxy:     proxy,
		listen:    o.listen,
		addresses: o.addresses,
		services:  map[types.NamespacedName]*healthCheck{},
		endpoints: map[types.NamespacedName]int{},
		failed:    map[types.NamespacedName]uint16{},
	}
}

// SyncServices makes the open ports match ports (Service → health-check
// node port, as changetracker's ServicePortMap.HealthCheckNodePorts returns
// them): it closes the ports of Services no longer there or whose port
// changed, opens the new ones, and leaves the others serving without a
// break. A port that cannot be opened (in use, or 0) is logged and
// returned as a *BindError, joined with the others; it does not stop the
// rest, and the next call (of SyncServices or UpdateServices) tries it
// again. Its cost is proportional to the number of Services; after a sync
// that changed a few, UpdateServices costs that few.
func (s *ServiceHealthServer) SyncServices(ctx context.Context, ports map[types.NamespacedName]uint16) error {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, hc := range s.services {
		if port, ok := ports[name]; !ok || port != hc.port {
			s.closeLocked(logger, name, hc)
		}
	}
	clear(s.failed)
	var errs []error
	for name, port := range ports {
		if s.services[name] != nil {
			continue
		}
		if err := s.openLocked(ctx, name, port); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// UpdateServices changes the ports of the Services in changes alone, for a
// proxier that knows what its last sync changed (changetracker's
// UpdateServiceMapResult.HealthCheckNodePorts): a port makes it the
// Service's health-check node port, opening it and closing the Service's
// previous one when it differs, while the same port keeps serving without
// a break; 0 closes the Service's port. Services not in changes keep
// theirs. A port that cannot be opened is logged and returned as a
// *BindError, joined with the others, as by SyncServices; every port that
// an earlier call could not open is tried again, whether or not its
// Service is in changes. Its cost is proportional to the size of changes
// and the number of such ports, not to the number of Services.
func (s *ServiceHealthServer) UpdateServices(ctx context.Context, changes map[types.NamespacedName]uint16) error {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	// Every close before any open, so that a port can pass from one
	// Service to another in one call.
	for name, port := range changes {
		delete(s.failed, name)
		if hc := s.services[name]; hc != nil && hc.port != port {
			s.closeLocked(logger, name, hc)
		}
	}
	var errs []error
	for name, port := range changes {
		if port == 0 || s.services[name] != nil {
			continue
		}
		if err := s.openLocked(ctx, name, port); err != nil {
			errs = append(errs, err)
		}
	}
	for name, port := range s.failed {
		if _, ok := changes[name]; ok {
			continue // tried just now
		}
		if err := s.openLocked(ctx, name, port); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closeLocked closes name's port and forgets it. s.mu must be held.
func (s *ServiceHealthServer) closeLocked(logger klog.Logger, name types.NamespacedName, hc *healthCheck) {
	logger.V(2).Info("Closing service health check", "service", name, "port", hc.port)
	hc.close()
	delete(s.services, name)
}

// openLocked opens name's port, or logs the failure, records it to be
// tried again and returns it as a *BindError. s.mu must be held.
func (s *ServiceHealthServer) openLocked(ctx context.Context, name types.NamespacedName, port uint16) error {
	logger := klog.FromContext(ctx)
	hc, err := s.open(ctx, name, port)
	if err != nil {
		berr := &BindError{Service: name, Port: port, Err: err}
		logger.Error(berr, "Failed to open service health check", "node", s.nodeName, "service", name, "port", port)
		s.failed[name] = port
		return berr
	}
	logger.V(2).Info("Opened service health check", "service", name, "port", port)
	s.services[name] = hc
	delete(s.failed, name)
	return nil
}

// open listens on port on every address and starts serving name's health.
// On failure it closes whatever it opened.
func (s *ServiceHealthServer) open(ctx context.Context, name types.NamespacedName, port uint16) (*healthCheck, error) {
	if port == 0 {
		return nil, fmt.Errorf("port 0 is not a health-check node port")
	}
	hc := &healthCheck{port: port, handler: s.handler(name), servers: map[string]*http.Server{}}
	for _, host := range s.hosts() {
		if err := hc.listen(ctx, s.listen, host); err != nil {
			hc.close()
			return nil, err
		}
	}
	return hc, nil
}

// hosts are the hosts to listen on: the node addresses, or "" for every
// address when there are none.
func (s *ServiceHealthServer) hosts() []string {
	if len(s.addresses) == 0 {
		return []string{""}
	}
	hosts := make([]string, 0, len(s.addresses))
	for _, a := range s.addresses {
		hosts = append(hosts, a.String())
	}
	return hosts
}

// listen opens hc's port on host and serves it there.
func (hc *healthCheck) listen(ctx context.Context, listen ListenFunc, host string) error {
	ln, err := listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(hc.port))))
	if err != nil {
		return err
	}
	srv := newHTTPServer(hc.handler)
	hc.servers[host] = srv
	hc.wg.Add(1)
	go func() {
		defer hc.wg.Done()
		_ = srv.Serve(ln) // returns when srv is closed
	}()
	return nil
}

// move makes hc listen on hosts: it closes the listeners on other hosts
// first, so that a specific address can take the place of every address
// on the same port, and then opens the missing ones. The listeners on
// hosts it keeps serve without a break. On failure some may be open: the
// caller closes hc.
func (hc *healthCheck) move(ctx context.Context, listen ListenFunc, hosts []string) error {
	for host, srv := range hc.servers {
		if !slices.Contains(hosts, host) {
			_ = srv.Close() // closes the listener before it returns
			delete(hc.servers, host)
		}
	}
	for _, host := range hosts {
		if hc.servers[host] != nil {
			continue
		}
		if err := hc.listen(ctx, listen, host); err != nil {
			return err
		}
	}
	return nil
}

// close stops the servers and waits for them to return.
func (hc *healthCheck) close() {
	for _, srv := range hc.servers {
		_ = srv.Close()
	}
	hc.wg.Wait()
}

// SetNodeAddresses makes every open port, and those opened later, listen
// on addrs instead of the addresses the server had (WithNodeAddresses, or
// an earlier call), for a node whose addresses changed: a port's listeners
// on addresses in both keep serving without a break, those on addresses
// no longer given are closed, and new ones are opened. Invalid addresses
// are skipped and no valid address means every address, as with
// WithNodeAddresses; the same addresses in another order change nothing.
// A port that cannot be opened on one of the new addresses is closed on
// all of them (as SyncServices leaves a port open on every address or on
// none), logged and returned as a *BindError, joined with the others, and
// the next call of SyncServices or UpdateServices tries it again.
func (s *ServiceHealthServer) SetNodeAddresses(ctx context.Context, addrs ...netip.Addr) error {
	logger := klog.FromContext(ctx)
	valid := validAddresses(addrs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameAddresses(valid, s.addresses) {
		return nil
	}
	logger.Info("Node addresses changed; moving the service health checks", "node", logsafe.KRef("", s.nodeName),
		"oldAddresses", s.addresses, "addresses", valid, "ports", len(s.services))
	s.addresses = valid
	hosts := s.hosts()
	var errs []error
	for name, hc := range s.services {
		if err := hc.move(ctx, s.listen, hosts); err != nil {
			hc.close()
			delete(s.services, name)
			s.failed[name] = hc.port
			berr := &BindError{Service: name, Port: hc.port, Err: err}
			logger.Error(berr, "Failed to move service health check", "node", logsafe.KRef("", s.nodeName),
				"service", logsafe.KRef(name.Namespace, name.Name), "port", hc.port)
			errs = append(errs, berr)
		}
	}
	return errors.Join(errs...)
}

// NodeAddresses returns the addresses the server listens on, as
// WithNodeAddresses or SetNodeAddresses gave them; none means every
// address.
func (s *ServiceHealthServer) NodeAddresses() []netip.Addr {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.addresses)
}

// validAddresses returns the valid ones of addrs, each once, nil when
// there is none.
func validAddresses(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.IsValid() && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// sameAddresses reports whether a and b, each without repeats, hold the
// same addresses in any order.
func sameAddresses(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(a, b)
}

// SyncEndpoints records how many endpoints each Service has on this node.
// It replaces the previous counts: a Service missing from counts, or with a
// count of 0 or less, has none.
// Counts of Services without an open port are kept, so the order of
// SyncServices and SyncEndpoints does not matter. Its cost is proportional
// to the size of counts; after a sync that changed a few Services,
// UpdateEndpoints costs that few.
func (s *ServiceHealthServer) SyncEndpoints(counts map[types.NamespacedName]int) {
	c := maps.Clone(counts)
	if c == nil {
		c = map[types.NamespacedName]int{}
	}
	maps.DeleteFunc(c, func(_ types.NamespacedName, n int) bool { return n <= 0 })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endpoints = c
}

// UpdateEndpoints changes the counts of the Services in changes alone (as
// changetracker's UpdateEndpointsMapResult.LocalReadyEndpoints gives them):
// 0 or less means the Service has no endpoint on this node. The others keep
// theirs. As with SyncEndpoints, counts of Services without an open port
// are kept.
func (s *ServiceHealthServer) UpdateEndpoints(changes map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, n := range changes {
		if n > 0 {
			s.endpoints[name] = n
		} else {
			delete(s.endpoints, name)
		}
	}
}

// Ports returns the ports open now, by Service. The map is a copy.
func (s *ServiceHealthServer) Ports() map[types.NamespacedName]uint16 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ports := make(map[types.NamespacedName]uint16, len(s.services))
	for name, hc := range s.services {
		ports[name] = hc.port
	}
	return ports
}

// LocalEndpoints returns the local endpoint counts the server holds, by
// Service, whether or not the Service has an open port; Services with none
// are absent. The map is a copy.
func (s *ServiceHealthServer) LocalEndpoints() map[types.NamespacedName]int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.endpoints)
}

// Close closes every open port and waits for its server to stop, and
// forgets the ports that could not be opened. The server can be used
// again: a later SyncServices or UpdateServices opens ports anew.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, hc := range s.services {
		hc.close()
		delete(s.services, name)
	}
	clear(s.failed)
}

// handler answers the health check of one Service: 200 when it has local
// endpoints and the proxy is healthy, 503 otherwise (including after its
// port was closed, for a request already in flight).
func (s *ServiceHealthServer) handler(name types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.RLock()
		count := s.endpoints[name]
		if s.services[name] == nil {
			count = 0
		}
		s.mu.RUnlock()
		healthy := s.proxy == nil || s.proxy.Health().Healthy
		status := http.StatusServiceUnavailable
		if count > 0 && healthy {
			status = http.StatusOK
		}
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		writeJSON(w, status, ServiceHealth{
			Service:             ServiceName{Namespace: name.Namespace, Name: name.Name},
			LocalEndpoints:      count,
			ServiceProxyHealthy: healthy,
		})
	})
}
