package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/nftables"
	nftablestest "github.com/proxykit/proxykit/nftables/testing"
)

// cluster is a proxier's view of a cluster: Services and EndpointSlices go
// through the real change trackers into the maps the writer reads.
type cluster struct {
	family     v1.IPFamily
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker
	svcs       changetracker.ServicePortMap
	eps        changetracker.EndpointsMap
	labels     map[string]string
	services   map[string]*v1.Service
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
	}
}

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
// after it).
func (c *cluster) setEndpoints(ns, name string, ports []discoveryv1.EndpointPort, eps ...ep) {
	c.epTracker.EndpointSliceUpdate(makeSlice(c.family, ns, name, ports, eps...), false)
}

func (c *cluster) input() nftables.SyncInput {
	return nftables.SyncInput{
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

func withLoadBalancer(vip string, ranges ...string) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: vip}}
		s.Spec.LoadBalancerSourceRanges = ranges
	}
}

// withExternalLocal sets externalTrafficPolicy Local, with the health
// check node port the API server would allocate.
func withExternalLocal() svcOpt {
	return func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
	}
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

// ep is one endpoint of a slice: ready unless notReady or terminating (a
// terminating endpoint is still serving).
type ep struct {
	ip          string
	node        string
	notReady    bool
	terminating bool
	zoneHints   []string
}

func slicePort(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
}

// tcp8080 is the slice port for makeService's default port.
var tcp8080 = []discoveryv1.EndpointPort{slicePort("p", 8080, v1.ProtocolTCP)}

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

func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func nftFamily(f v1.IPFamily) knftables.Family {
	if f == v1.IPv6Protocol {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// newFake returns a Fake for the writer's default table of family and a
// writer for cfg on it.
func newFake(t testing.TB, cfg nftables.WriterConfig) (*knftables.Fake, *nftables.Writer) {
	t.Helper()
	table := cfg.TableName
	if table == "" {
		table = nftables.DefaultTableName
	}
	fake := knftables.NewFake(nftFamily(cfg.IPFamily), table)
	w, err := nftables.NewWriter(fake, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return fake, w
}

// syncFake syncs w and runs the transaction on fake, as a proxier does,
// after checking it against what the kernel refuses and the Fake does not;
// it fails t if either fails.
func syncFake(t testing.TB, w *nftables.Writer, fake *knftables.Fake, in nftables.SyncInput) nftables.SyncResult {
	t.Helper()
	res := w.Sync(context.Background(), in)
	err := nftablestest.CheckTransaction(fake, res.Transaction)
	if err == nil {
		err = fake.Run(context.Background(), res.Transaction)
	}
	w.Applied(err)
	if err != nil {
		t.Fatalf("running the sync (full %v):\n%s\nerror: %v", res.Full, res.Transaction, err)
	}
	return res
}

// normalDump is fake's Dump with the elements of each set and map sorted:
// their order means nothing to nft, and a partial sync appends where a
// full sync writes in name order.
func normalDump(fake *knftables.Fake) string {
	return strings.Join(sortElementRuns(strings.Split(fake.Dump(), "\n")), "\n")
}

// sortElementRuns sorts each run of element lines in lines.
func sortElementRuns(lines []string) []string {
	start := -1
	for i := 0; i <= len(lines); i++ {
		isElem := i < len(lines) && strings.HasPrefix(lines[i], "add element ")
		if isElem && start < 0 {
			start = i
		}
		if !isElem && start >= 0 {
			slices.Sort(lines[start:i])
			start = -1
		}
	}
	return lines
}

// layoutDump is normalDump for comparing a table after partial syncs with
// a fresh full sync's: an endpoint's index in the endpoints maps depends
// on the syncs before (a partial sync moves the last endpoint into a freed
// index), so indexes become "#" once checked to run from 0 without gaps
// for every service key (a line says so if not), and shared chains that no
// element points at, which partial syncs keep, are left out.
func layoutDump(fake *knftables.Fake) string {
	lines := strings.Split(normalDump(fake), "\n")
	used := map[string]bool{}
	for _, l := range lines {
		if strings.HasPrefix(l, "add element ") {
			f := strings.Fields(l)
			for i := range f[:len(f)-1] {
				if f[i] == "goto" {
					used[strings.TrimSuffix(f[i+1], ",")] = true
				}
			}
		}
	}
	indexes := map[string][]int{}
	var out []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) > 4 && (f[1] == "chain" || f[1] == "rule") && strings.HasPrefix(f[4], "lb-") && !used[f[4]] {
			continue
		}
		if len(f) > 4 && f[1] == "element" && (f[4] == "endpoints" || f[4] == "nodeport-endpoints") {
			key, value, _ := strings.Cut(l[strings.Index(l, "{")+2:], " : ")
			parts := strings.Split(key, " . ")
			n, _ := strconv.Atoi(parts[len(parts)-1])
			svc := f[4] + " " + strings.Join(parts[:len(parts)-1], " . ")
			indexes[svc] = append(indexes[svc], n)
			l = "add element " + svc + " . # : " + value
		}
		out = append(out, l)
	}
	out = sortElementRuns(out)
	for svc, idx := range indexes {
		slices.Sort(idx)
		for i, n := range idx {
			if i != n {
				out = append(out, fmt.Sprintf("indexes of %s are %v, not 0..%d", svc, idx, len(idx)-1))
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
