package iptables_test

import (
	"context"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/iptables"
	iptablestest "github.com/proxykit/proxykit/iptables/testing"
)

// cluster is a proxier's view of a cluster for tests of the writer:
// Services and EndpointSlices go through the real change trackers into the
// maps the writer reads.
type cluster struct {
	family     v1.IPFamily
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker
	svcs       changetracker.ServicePortMap
	eps        changetracker.EndpointsMap
	labels     map[string]string
	services   map[string]*v1.Service
	slices     map[string]*discoveryv1.EndpointSlice
}

func newCluster(family v1.IPFamily, node string) *cluster {
	quiet := changetracker.WithLogger(klog.Background().V(10))
	return &cluster{
		family:     family,
		svcTracker: changetracker.NewServiceChangeTracker(family, nil, quiet),
		epTracker:  changetracker.NewEndpointsChangeTracker(family, node, nil, quiet),
		svcs:       changetracker.ServicePortMap{},
		eps:        changetracker.EndpointsMap{},
		services:   map[string]*v1.Service{},
		slices:     map[string]*discoveryv1.EndpointSlice{},
	}
}

// setService adds or replaces a Service.
func (c *cluster) setService(svc *v1.Service) {
	key := svc.Namespace + "/" + svc.Name
	c.svcTracker.Update(c.services[key], svc)
	c.services[key] = svc
}

func (c *cluster) deleteService(ns, name string) {
	key := ns + "/" + name
	c.svcTracker.Update(c.services[key], nil)
	delete(c.services, key)
}

// setEndpoints replaces the endpoints of Service ns/name (one slice named
// after it) with eps, on the ports of the Service's slice ports.
func (c *cluster) setEndpoints(ns, name string, ports []discoveryv1.EndpointPort, eps ...ep) {
	s := makeSlice(c.family, ns, name, ports, eps...)
	c.epTracker.EndpointSliceUpdate(s, false)
	c.slices[ns+"/"+s.Name] = s
}

func (c *cluster) deleteEndpoints(ns, name string) {
	key := ns + "/" + name + "-1"
	if s := c.slices[key]; s != nil {
		c.epTracker.EndpointSliceUpdate(s, true)
		delete(c.slices, key)
	}
}

// input applies the pending changes to the maps and returns the writer's
// input.
func (c *cluster) input() iptables.SyncInput {
	return iptables.SyncInput{
		Services:        c.svcs,
		Endpoints:       c.eps,
		ServiceChanges:  c.svcs.Update(c.svcTracker),
		EndpointChanges: c.eps.Update(c.epTracker),
		NodeLabels:      c.labels,
	}
}

type svcOpt func(*v1.Service)

// makeService makes a ClusterIP Service with one TCP port "p" 80, unless
// opts say otherwise.
func makeService(ns, name, clusterIP string, opts ...svcOpt) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

func withPorts(ports ...v1.ServicePort) svcOpt {
	return func(s *v1.Service) { s.Spec.Ports = ports }
}

// withNodePort gives the Service's first port node port np, and makes a
// ClusterIP Service a NodePort one.
func withNodePort(np int32) svcOpt {
	return func(s *v1.Service) {
		if s.Spec.Type == v1.ServiceTypeClusterIP {
			s.Spec.Type = v1.ServiceTypeNodePort
		}
		s.Spec.Ports[0].NodePort = np
	}
}

func withExternalIPs(ips ...string) svcOpt {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

// withLoadBalancer makes the Service a LoadBalancer with one ingress VIP.
func withLoadBalancer(vip string, ranges ...string) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: vip}}
		s.Spec.LoadBalancerSourceRanges = ranges
	}
}

func withHealthCheckNodePort(port int32) svcOpt {
	return func(s *v1.Service) { s.Spec.HealthCheckNodePort = port }
}

func withExternalLocal() svcOpt {
	return func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
}

func withInternalLocal() svcOpt {
	return func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
}

func withAffinity(seconds int32) svcOpt {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(seconds)}}
	}
}

// ep describes one endpoint of a slice: ready unless notReady or
// terminating (a terminating endpoint is still serving).
type ep struct {
	ip          string
	node        string
	notReady    bool
	terminating bool
	zoneHints   []string
}

// slicePort is a port of an EndpointSlice.
func slicePort(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
}

// tcp8080 is the slice port for makeService's default port.
var tcp8080 = []discoveryv1.EndpointPort{slicePort("p", 8080, v1.ProtocolTCP)}

// makeSlice makes the slice "svc-1" of Service ns/svc.
func makeSlice(family v1.IPFamily, ns, svc string, ports []discoveryv1.EndpointPort, eps ...ep) *discoveryv1.EndpointSlice {
	at := discoveryv1.AddressTypeIPv4
	if family == v1.IPv6Protocol {
		at = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: svc + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: at,
		Ports:       ports,
	}
	for _, e := range eps {
		d := discoveryv1.Endpoint{
			Addresses: []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{
				Ready:       ptr.To(!e.notReady && !e.terminating),
				Serving:     ptr.To(!e.notReady),
				Terminating: ptr.To(e.terminating),
			},
		}
		if e.node != "" {
			d.NodeName = ptr.To(e.node)
		}
		if len(e.zoneHints) > 0 {
			d.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.zoneHints {
				d.Hints.ForZones = append(d.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}

func mustWriter(t testing.TB, cfg iptables.WriterConfig) *iptables.Writer {
	t.Helper()
	w, err := iptables.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// syncFake syncs w and applies the result to f, as a proxier does, and
// fails t if the restore fails.
func syncFake(t testing.TB, w *iptables.Writer, f *iptablestest.Fake, in iptables.SyncInput) iptables.SyncResult {
	t.Helper()
	res := w.Sync(context.Background(), in)
	err := applyFake(f, res)
	w.Applied(err)
	if err != nil {
		t.Fatalf("applying the %s sync:\n%s\nerror: %v", syncKind(res), res.Payload, err)
	}
	return res
}

func applyFake(f *iptablestest.Fake, res iptables.SyncResult) error {
	ctx := context.Background()
	if res.Full {
		if err := iptables.EnsureJumpRules(ctx, f); err != nil {
			return err
		}
	}
	if len(res.Payload) == 0 {
		return nil
	}
	return f.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
}

func syncKind(res iptables.SyncResult) string {
	if res.Full {
		return "full"
	}
	return "partial"
}
