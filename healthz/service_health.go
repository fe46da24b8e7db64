package healthz

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
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
// [ServiceHealthServer.SyncServices] returns one per such port (joined),
// keeps serving the others, and tries the port again on its next call.
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
}

// healthCheck is one Service's open port: one HTTP server per listen
// address.
type healthCheck struct {
	port    uint16
	servers []*http.Server
	wg      sync.WaitGroup
}

// NewServiceHealthServer returns a server with no ports open. nodeName is
// used in logs. proxy says whether the proxy itself is healthy; a nil proxy
// counts as always healthy. Options: [WithListenFunc],
// [WithNodeAddresses].
func NewServiceHealthServer(nodeName string, proxy HealthReporter, opts ...Option) *ServiceHealthServer {
	o := newOptions(opts)
	return &ServiceHealthServer{
		nodeName:  nodeName,
		proxy:     proxy,
		listen:    o.listen,
		addresses: o.addresses,
		services:  map[types.NamespacedName]*healthCheck{},
		endpoints: map[types.NamespacedName]int{},
	}
}

// SyncServices makes the open ports match ports (Service → health-check
// node port, as changetracker's ServicePortMap.HealthCheckNodePorts returns
// them): it closes the ports of Services no longer there or whose port
// changed, opens the new ones, and leaves the others serving without a
// break. A port that cannot be opened (in use, or 0) is logged and
// returned as a *BindError, joined with the others; it does not stop the
// rest, and the next call tries it again.
func (s *ServiceHealthServer) SyncServices(ctx context.Context, ports map[types.NamespacedName]uint16) error {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, hc := range s.services {
		if port, ok := ports[name]; !ok || port != hc.port {
			logger.V(2).Info("Closing service health check", "service", name, "port", hc.port)
			hc.close()
			delete(s.services, name)
		}
	}
	var errs []error
	for name, port := range ports {
		if s.services[name] != nil {
			continue
		}
		hc, err := s.open(ctx, name, port)
		if err != nil {
			berr := &BindError{Service: name, Port: port, Err: err}
			logger.Error(berr, "Failed to open service health check", "node", s.nodeName, "service", name, "port", port)
			errs = append(errs, berr)
			continue
		}
		logger.V(2).Info("Opened service health check", "service", name, "port", port)
		s.services[name] = hc
	}
	return errors.Join(errs...)
}

// open listens on port on every address and starts serving name's health.
// On failure it closes whatever it opened.
func (s *ServiceHealthServer) open(ctx context.Context, name types.NamespacedName, port uint16) (*healthCheck, error) {
	if port == 0 {
		return nil, fmt.Errorf("port 0 is not a health-check node port")
	}
	hosts := []string{""}
	if len(s.addresses) > 0 {
		hosts = hosts[:0]
		for _, a := range s.addresses {
			hosts = append(hosts, a.String())
		}
	}
	hc := &healthCheck{port: port}
	handler := s.handler(name)
	for _, host := range hosts {
		ln, err := s.listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
		if err != nil {
			hc.close()
			return nil, err
		}
		srv := newHTTPServer(handler)
		hc.servers = append(hc.servers, srv)
		hc.wg.Add(1)
		go func() {
			defer hc.wg.Done()
			_ = srv.Serve(ln) // returns when close() closes srv
		}()
	}
	return hc, nil
}

// close stops the servers and waits for them to return.
func (hc *healthCheck) close() {
	for _, srv := range hc.servers {
		_ = srv.Close()
	}
	hc.wg.Wait()
}

// SyncEndpoints records how many endpoints each Service has on this node.
// It replaces the previous counts: a Service missing from counts has none.
// Counts of Services without an open port are kept, so the order of
// SyncServices and SyncEndpoints does not matter.
func (s *ServiceHealthServer) SyncEndpoints(counts map[types.NamespacedName]int) {
	c := maps.Clone(counts)
	if c == nil {
		c = map[types.NamespacedName]int{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endpoints = c
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

// Close closes every open port and waits for its server to stop. The
// server can be used again: a later SyncServices opens ports anew.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, hc := range s.services {
		hc.close()
		delete(s.services, name)
	}
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
