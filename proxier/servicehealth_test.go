package proxier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/internal/testkit/clustertest"
	"github.com/proxykit/proxykit/proxy"
)

// readLog records which Services' ports and endpoints were read, through
// the ServicePort and Endpoint wrappers below.
type readLog struct {
	mu   sync.Mutex
	read sets.Set[types.NamespacedName]
}

func (l *readLog) add(nn types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.read.Insert(nn)
}

// take returns the Services read since the last take, sorted.
func (l *readLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for nn := range l.read {
		names = append(names, nn.String())
	}
	l.read = sets.New[types.NamespacedName]()
	return sets.List(sets.New(names...))
}

// loggedPort is a ServicePort that logs the reads that a walk over every
// Service's health or rules would do.
type loggedPort struct {
	changetracker.ServicePort
	nn  types.NamespacedName
	log *readLog
}

func (p *loggedPort) ClusterIP() netip.Addr { p.log.add(p.nn); return p.ServicePort.ClusterIP() }
func (p *loggedPort) Port() int             { p.log.add(p.nn); return p.ServicePort.Port() }
func (p *loggedPort) NodePort() int         { p.log.add(p.nn); return p.ServicePort.NodePort() }
func (p *loggedPort) HealthCheckNodePort() int {
	p.log.add(p.nn)
	return p.ServicePort.HealthCheckNodePort()
}
func (p *loggedPort) ExternalPolicyLocal() bool {
	p.log.add(p.nn)
	return p.ServicePort.ExternalPolicyLocal()
}

// loggedEndpoint is an Endpoint that logs the same.
type loggedEndpoint struct {
	changetracker.Endpoint
	nn  types.NamespacedName
	log *readLog
}

func (e *loggedEndpoint) IP() netip.Addr { e.log.add(e.nn); return e.Endpoint.IP() }
func (e *loggedEndpoint) IsLocal() bool  { e.log.add(e.nn); return e.Endpoint.IsLocal() }
func (e *loggedEndpoint) IsReady() bool  { e.log.add(e.nn); return e.Endpoint.IsReady() }
func (e *loggedEndpoint) IsServing() bool {
	e.log.add(e.nn)
	return e.Endpoint.IsServing()
}

// idleListener is a listener that accepts nothing until it is closed: the
// service health server serves on it without any traffic.
type idleListener struct {
	closed chan struct{}
	once   sync.Once
}

func (l *idleListener) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *idleListener) Close() error              { l.once.Do(func() { close(l.closed) }); return nil }
func (l *idleListener) Addr() net.Addr            { return &net.TCPAddr{} }

func listenIdle(context.Context, string, string) (net.Listener, error) {
	return &idleListener{closed: make(chan struct{})}, nil
}

// TestPartialSyncReadsOnlyChangedServices checks that a partial sync of
// a Proxier, with its service health bookkeeping, reads the ports and
// endpoints of the changed Service alone, so that it costs the same
// whatever the number of Services: the
// health-check node ports and local endpoint counts must come from the
// update results, not from walks over the maps.
func TestPartialSyncReadsOnlyChangedServices(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	log := &readLog{read: sets.New[types.NamespacedName]()}
	m, err := newMetrics(nil, func() int { return 0 }, func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	backend := newWriterBackend(t)
	fp := newFamilyProxierWith(ctx, v1.IPv4Protocol, "node-a", changetracker.NewNodeTopology("node-a"), m,
		func(_ *v1.ServicePort, svc *v1.Service, base *changetracker.BaseServicePort) changetracker.ServicePort {
			return &loggedPort{ServicePort: base, nn: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, log: log}
		},
		func(base *changetracker.BaseEndpoint, name *changetracker.ServicePortName) changetracker.Endpoint {
			return &loggedEndpoint{Endpoint: base, nn: name.NamespacedName, log: log}
		})
	server := healthz.NewServiceHealthServer("node-a", nil, healthz.WithListenFunc(listenIdle))
	defer server.Close()
	fp.svcHealth = newServiceHealth(server)
	g := &syncGroup{backend: backend, families: []*familyProxier{fp}}

	// 40 Services with a local endpoint each, every fourth with a
	// health-check node port.
	services := map[string]*v1.Service{}
	slices := map[string]*discoveryv1.EndpointSlice{}
	wantPorts := map[types.NamespacedName]uint16{}
	for _, o := range clustertest.Cluster(40, 3) {
		switch o := o.(type) {
		case *v1.Service:
			var i int
			if _, err := fmt.Sscanf(o.Name, "svc-%d", &i); err != nil {
				t.Fatalf("service %s: %v", o.Name, err)
			}
			if i%4 == 0 {
				o.Spec.Type = v1.ServiceTypeLoadBalancer
				o.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				o.Spec.HealthCheckNodePort = int32(30000 + i)
				o.Spec.Ports[0].NodePort = int32(31000 + i)
				wantPorts[types.NamespacedName{Namespace: o.Namespace, Name: o.Name}] = uint16(30000 + i)
			}
			services[o.Name] = o
			fp.svcTracker.Update(nil, o)
		case *discoveryv1.EndpointSlice:
			slices[o.Labels[discoveryv1.LabelServiceName]] = o
			fp.epTracker.EndpointSliceUpdate(o, false)
		}
	}
	if err := g.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(log.take()); n != 40 {
		t.Fatalf("the first sync read %d Services, want all 40", n)
	}
	if diff := cmp.Diff(wantPorts, server.Ports()); diff != "" {
		t.Fatalf("health-check node ports after the first sync (-want +got):\n%s", diff)
	}

	// svc-8's local endpoint stops being ready.
	s := slices["svc-8"].DeepCopy()
	s.Endpoints[0].Conditions.Ready = ptr.To(false)
	fp.epTracker.EndpointSliceUpdate(s, false)
	if err := g.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"bench/svc-8"}, log.take()); diff != "" {
		t.Errorf("Services read by the partial sync of an endpoint change (-want +got):\n%s", diff)
	}

	// svc-12's health-check node port moves, svc-4 loses its own.
	svc12 := services["svc-12"].DeepCopy()
	svc12.Spec.HealthCheckNodePort = 30100
	svc4 := services["svc-4"].DeepCopy()
	svc4.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	svc4.Spec.HealthCheckNodePort = 0
	fp.svcTracker.Update(services["svc-12"], svc12)
	fp.svcTracker.Update(services["svc-4"], svc4)
	if err := g.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"bench/svc-12", "bench/svc-4"}, log.take()); diff != "" {
		t.Errorf("Services read by the partial sync of a Service change (-want +got):\n%s", diff)
	}
	delete(wantPorts, types.NamespacedName{Namespace: "bench", Name: "svc-4"})
	wantPorts[types.NamespacedName{Namespace: "bench", Name: "svc-12"}] = 30100
	if diff := cmp.Diff(wantPorts, server.Ports()); diff != "" {
		t.Errorf("health-check node ports after the change (-want +got):\n%s", diff)
	}

	// A sync with no change reads nothing.
	if err := g.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); len(got) != 0 {
		t.Errorf("a sync with nothing to do read %q", got)
	}
}

// switchBackend is a backend that programs nothing, and whose sync fails
// while fail is set.
type switchBackend struct{ fail bool }

var _ proxy.Backend = (*switchBackend)(nil)

func (b *switchBackend) Sync(_ context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	outs := make([]proxy.SyncResult, len(ins))
	if b.fail {
		return outs, errors.New("the kernel refused the rules")
	}
	return outs, nil
}
func (b *switchBackend) Run(context.Context, func()) {}

// TestServiceHealthFollowsTheMaps drives a dual-stack node, each family
// synced by a runner of its own, through the changes that move
// health-check node ports and local endpoint counts, and after every step
// compares what the service health server holds with what the whole maps
// give as of each family's last good sync: a Service's port served while
// either family has it (IPv4's first should they differ), its local
// endpoint count the larger of the two. A change the incremental
// bookkeeping missed shows up as a difference.
func TestServiceHealthFollowsTheMaps(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, err := newMetrics(nil, func() int { return 0 }, func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	topo := changetracker.NewNodeTopology("node-a")
	fp4 := newFamilyProxier(ctx, v1.IPv4Protocol, "node-a", topo, m)
	fp6 := newFamilyProxier(ctx, v1.IPv6Protocol, "node-a", topo, m)
	b4, b6 := &switchBackend{}, &switchBackend{}
	groups := map[v1.IPFamily]*syncGroup{
		v1.IPv4Protocol: {backend: b4, families: []*familyProxier{fp4}},
		v1.IPv6Protocol: {backend: b6, families: []*familyProxier{fp6}},
	}
	backends := map[v1.IPFamily]*switchBackend{v1.IPv4Protocol: b4, v1.IPv6Protocol: b6}
	// Ports in busy cannot be opened.
	busy := sets.New[string]()
	server := healthz.NewServiceHealthServer("node-a", nil, healthz.WithListenFunc(
		func(ctx context.Context, network, address string) (net.Listener, error) {
			if busy.Has(address) {
				return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRINUSE}
			}
			return listenIdle(ctx, network, address)
		}))
	defer server.Close()
	fp4.svcHealth = newServiceHealth(server)
	fp6.svcHealth = fp4.svcHealth
	h := &handlers{families: []*familyProxier{fp4, fp6}, metrics: m}

	nn := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }
	lb := func(name string, clusterIPs []string, hc int32, ports ...v1.ServicePort) *v1.Service {
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{
				Type:                  v1.ServiceTypeLoadBalancer,
				ClusterIP:             clusterIPs[0],
				ClusterIPs:            clusterIPs,
				ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster,
				Ports:                 ports,
			},
		}
		if hc != 0 {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			svc.Spec.HealthCheckNodePort = hc
		}
		return svc
	}
	http := v1.ServicePort{Name: "http", Port: 80, NodePort: 31080, Protocol: v1.ProtocolTCP}
	http8080 := v1.ServicePort{Name: "http", Port: 8080, NodePort: 31080, Protocol: v1.ProtocolTCP}
	dns := v1.ServicePort{Name: "dns", Port: 53, NodePort: 31053, Protocol: v1.ProtocolUDP}
	apiPort := v1.ServicePort{Name: "api", Port: 443, NodePort: 31443, Protocol: v1.ProtocolTCP}
	type endpoint struct {
		ip, node string
		ready    bool
	}
	slice := func(svc, name string, at discoveryv1.AddressType, eps ...endpoint) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
				Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: at,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)},
				{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(v1.ProtocolUDP)},
				{Name: ptr.To("api"), Port: ptr.To[int32](8443), Protocol: ptr.To(v1.ProtocolTCP)},
			},
		}
		for _, e := range eps {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{e.ip},
				NodeName:   ptr.To(e.node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready)},
			})
		}
		return s
	}
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	dual := []string{"10.96.0.10", "fd00::10"}

	web := lb("web", dual, 30001, http, dns)
	webMoved := lb("web", dual, 30003, http, dns)
	webRenumbered := lb("web", dual, 30003, http8080, dns)
	webCluster := lb("web", dual, 0, http8080, dns)
	api := lb("api", []string{"10.96.0.20"}, 0, apiPort)
	apiLocal := lb("api", []string{"10.96.0.20"}, 30004, apiPort)
	six := lb("six", []string{"fd00::30"}, 30002, http)
	sixMoved := lb("six", []string{"fd00::30"}, 30005, http)
	web4 := slice("web", "web-4", v4, endpoint{"10.1.0.1", "node-a", true}, endpoint{"10.1.0.2", "node-b", true})
	web6 := slice("web", "web-6", v6, endpoint{"fd00:1::1", "node-a", true}, endpoint{"fd00:1::2", "node-a", true})
	web6Fewer := slice("web", "web-6", v6, endpoint{"fd00:1::1", "node-a", true})
	api4 := slice("api", "api-4", v4, endpoint{"10.2.0.1", "node-a", true})
	api4NotReady := slice("api", "api-4", v4, endpoint{"10.2.0.1", "node-a", false})
	six6 := slice("six", "six-6", v6, endpoint{"fd00:2::1", "node-a", false})
	six6Ready := slice("six", "six-6", v6, endpoint{"fd00:2::1", "node-a", true})

	type ports = map[types.NamespacedName]uint16
	type counts = map[types.NamespacedName]int
	// syncOf is a sync of one family; fail makes it fail.
	type syncOf struct {
		family v1.IPFamily
		fail   bool
	}
	both := []syncOf{{family: v1.IPv4Protocol}, {family: v1.IPv6Protocol}}
	steps := []struct {
		name      string
		services  [][2]*v1.Service // previous, current
		slices    []*discoveryv1.EndpointSlice
		deleted   []*discoveryv1.EndpointSlice
		busy      []string
		syncs     []syncOf
		wantPorts ports
		wantLocal counts
	}{{
		name:      "adds",
		services:  [][2]*v1.Service{{nil, web}, {nil, api}, {nil, six}},
		slices:    []*discoveryv1.EndpointSlice{web4, web6, api4, six6},
		syncs:     both,
		wantPorts: ports{nn("web"): 30001, nn("six"): 30002},
		wantLocal: counts{nn("web"): 2, nn("api"): 1},
	}, {
		name:      "a health-check node port moves",
		services:  [][2]*v1.Service{{web, webMoved}},
		syncs:     both,
		wantPorts: ports{nn("web"): 30003, nn("six"): 30002},
		wantLocal: counts{nn("web"): 2, nn("api"): 1},
	}, {
		name:      "a service port changes",
		services:  [][2]*v1.Service{{webMoved, webRenumbered}},
		syncs:     both,
		wantPorts: ports{nn("web"): 30003, nn("six"): 30002},
		wantLocal: counts{nn("web"): 2, nn("api"): 1},
	}, {
		name:     "Local to Cluster, IPv4 synced first",
		services: [][2]*v1.Service{{webRenumbered, webCluster}},
		syncs:    []syncOf{{family: v1.IPv4Protocol}},
		// IPv6 still has it.
		wantPorts: ports{nn("web"): 30003, nn("six"): 30002},
		wantLocal: counts{nn("web"): 2, nn("api"): 1},
	}, {
		name:      "then IPv6",
		syncs:     []syncOf{{family: v1.IPv6Protocol}},
		wantPorts: ports{nn("six"): 30002},
		wantLocal: counts{nn("web"): 2, nn("api"): 1},
	}, {
		name:      "Cluster to Local and an endpoint change, but the sync fails",
		services:  [][2]*v1.Service{{api, apiLocal}},
		slices:    []*discoveryv1.EndpointSlice{api4NotReady},
		syncs:     []syncOf{{family: v1.IPv4Protocol, fail: true}},
		wantPorts: ports{nn("six"): 30002},
		wantLocal: counts{nn("web"): 2, nn("api"): 1},
	}, {
		name:      "the next sync has no change of its own",
		syncs:     []syncOf{{family: v1.IPv4Protocol}},
		wantPorts: ports{nn("api"): 30004, nn("six"): 30002},
		wantLocal: counts{nn("web"): 2},
	}, {
		name:      "IPv6 loses a local endpoint",
		slices:    []*discoveryv1.EndpointSlice{web6Fewer},
		syncs:     both,
		wantPorts: ports{nn("api"): 30004, nn("six"): 30002},
		wantLocal: counts{nn("web"): 1},
	}, {
		name:      "a not ready endpoint becomes ready",
		slices:    []*discoveryv1.EndpointSlice{six6Ready},
		syncs:     both,
		wantPorts: ports{nn("api"): 30004, nn("six"): 30002},
		wantLocal: counts{nn("web"): 1, nn("six"): 1},
	}, {
		name:      "a port moves to one in use",
		services:  [][2]*v1.Service{{six, sixMoved}},
		busy:      []string{":30005"},
		syncs:     both,
		wantPorts: ports{nn("api"): 30004},
		wantLocal: counts{nn("web"): 1, nn("six"): 1},
	}, {
		name:      "it frees up: the next sync opens it",
		syncs:     []syncOf{{family: v1.IPv4Protocol}},
		wantPorts: ports{nn("api"): 30004, nn("six"): 30005},
		wantLocal: counts{nn("web"): 1, nn("six"): 1},
	}, {
		name:      "deletes",
		services:  [][2]*v1.Service{{webCluster, nil}, {apiLocal, nil}},
		deleted:   []*discoveryv1.EndpointSlice{web4, web6Fewer, api4NotReady},
		syncs:     both,
		wantPorts: ports{nn("six"): 30005},
		wantLocal: counts{nn("six"): 1},
	}, {
		name:      "the last goes",
		services:  [][2]*v1.Service{{sixMoved, nil}},
		deleted:   []*discoveryv1.EndpointSlice{six6Ready},
		syncs:     both,
		wantPorts: ports{},
		wantLocal: counts{},
	}}

	// The whole maps' health as of each family's last good sync.
	lastPorts := map[v1.IPFamily]ports{}
	lastLocal := map[v1.IPFamily]counts{}
	for _, step := range steps {
		for _, s := range step.services {
			h.service(s[0], s[1])
		}
		for _, s := range step.slices {
			h.slice(s, false)
		}
		for _, s := range step.deleted {
			h.slice(s, true)
		}
		busy = sets.New(step.busy...)
		for _, s := range step.syncs {
			backends[s.family].fail = s.fail
			err := groups[s.family].sync(ctx)
			if (err != nil) != s.fail {
				t.Fatalf("%s: %s sync: %v", step.name, s.family, err)
			}
			if !s.fail {
				fp := groups[s.family].families[0]
				lastPorts[s.family] = fp.svcMap.HealthCheckNodePorts()
				lastLocal[s.family] = fp.epMap.LocalReadyEndpoints()
			}
		}

		fullPorts, fullLocal := ports{}, counts{}
		for _, family := range []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol} { // IPv4's win
			maps.Copy(fullPorts, lastPorts[family])
			for nn, n := range lastLocal[family] {
				fullLocal[nn] = max(fullLocal[nn], n)
			}
		}
		maps.DeleteFunc(fullPorts, func(_ types.NamespacedName, port uint16) bool { return busy.Has(fmt.Sprintf(":%d", port)) })
		if diff := cmp.Diff(fullPorts, server.Ports()); diff != "" {
			t.Errorf("%s: open ports differ from the whole maps' (-maps +server):\n%s", step.name, diff)
		}
		if diff := cmp.Diff(fullLocal, server.LocalEndpoints()); diff != "" {
			t.Errorf("%s: local endpoint counts differ from the whole maps' (-maps +server):\n%s", step.name, diff)
		}
		if diff := cmp.Diff(step.wantPorts, server.Ports()); diff != "" {
			t.Errorf("%s: open ports (-want +got):\n%s", step.name, diff)
		}
		if diff := cmp.Diff(step.wantLocal, server.LocalEndpoints()); diff != "" {
			t.Errorf("%s: local endpoint counts (-want +got):\n%s", step.name, diff)
		}
	}
}
