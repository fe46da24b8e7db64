package ipvsmode_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// The node of the translation tests.
const nodeName = "node-a"

// svcPort describes one port of a Service, and its endpoints, for the
// translation tests; zero fields mean "none" or the API default.
type svcPort struct {
	name         string // "ns/svc"
	portName     string
	proto        v1.Protocol // TCP if empty
	clusterIP    string
	port         int32
	nodePort     int32
	externalIPs  []string
	lbVIPs       []string
	sourceRanges []string
	etpLocal     bool
	itpLocal     bool
	affinity     int32 // ClientIP timeout in seconds
	hcNodePort   int32
	endpoints    []endpoint
}

// endpoint is a backend of a svcPort, on nodeName when local. It is ready
// unless notReady or terminating (a terminating endpoint still serves
// unless notServing).
type endpoint struct {
	ip          string
	port        int
	local       bool
	notReady    bool
	terminating bool
	notServing  bool
	zoneHints   []string
}

// service returns the v1.Service of p.
func (p svcPort) service(family v1.IPFamily) *v1.Service {
	ns, name, _ := strings.Cut(p.name, "/")
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:                     v1.ServiceTypeClusterIP,
			ClusterIP:                p.clusterIP,
			ClusterIPs:               []string{p.clusterIP},
			IPFamilies:               []v1.IPFamily{family},
			ExternalIPs:              p.externalIPs,
			LoadBalancerSourceRanges: p.sourceRanges,
			HealthCheckNodePort:      p.hcNodePort,
			Ports: []v1.ServicePort{{
				Name: p.portName, Protocol: cmpOr(p.proto, v1.ProtocolTCP), Port: p.port,
				NodePort: p.nodePort, TargetPort: intstr.FromInt32(p.port),
			}},
		},
	}
	if p.nodePort != 0 {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	if len(p.lbVIPs) > 0 {
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		for _, vip := range p.lbVIPs {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: vip})
		}
	}
	if p.etpLocal {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	if p.itpLocal {
		svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	if p.affinity != 0 {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(p.affinity)}}
	}
	return svc
}

func cmpOr[T comparable](v, dflt T) T {
	var zero T
	if v == zero {
		return dflt
	}
	return v
}

// portMaps builds the maps a proxier would have for ports, as the change
// trackers build them (changetracker.NewBaseServicePort and
// NewBaseEndpoint, sorted by address).
func portMaps(t testing.TB, family v1.IPFamily, ports ...svcPort) (changetracker.ServicePortMap, changetracker.EndpointsMap) {
	t.Helper()
	svcs, eps := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
	quiet := klog.Background().V(10)
	for _, p := range ports {
		svc := p.service(family)
		sp, err := changetracker.NewBaseServicePort(quiet, svc, &svc.Spec.Ports[0], family)
		if err != nil {
			t.Fatalf("service port %s: %v", p.name, err)
		}
		name := changetracker.ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name},
			Port:           p.portName, Protocol: svc.Spec.Ports[0].Protocol,
		}
		svcs[name] = sp
		for _, e := range p.endpoints {
			eps[name] = append(eps[name], makeEndpoint(e))
		}
		slices.SortFunc(eps[name], func(a, b changetracker.Endpoint) int {
			if c := a.IP().Compare(b.IP()); c != 0 {
				return c
			}
			return a.Port() - b.Port()
		})
	}
	return svcs, eps
}

func makeEndpoint(e endpoint) changetracker.Endpoint {
	info := changetracker.EndpointInfo{
		IP:          netip.MustParseAddr(e.ip),
		Port:        cmpOr(e.port, 8080),
		NodeName:    "node-b",
		IsLocal:     e.local,
		Ready:       !e.notReady && !e.terminating,
		Serving:     !e.notReady && !e.notServing,
		Terminating: e.terminating,
	}
	if e.local {
		info.NodeName = nodeName
	}
	if len(e.zoneHints) > 0 {
		info.ZoneHints = sets.New(e.zoneHints...)
	}
	return changetracker.NewBaseEndpoint(info)
}

// node is a node of fakes that translations are applied to with an
// ipvsmode.Applier, as a proxier applies them to the kernel.
type node struct {
	ipvs    *ipvstest.Fake
	binder  *ipvstest.Binder
	sets    *ipsettest.Fake
	ipt     map[v1.IPFamily]*iptablestest.Fake
	applier *ipvsmode.Applier
	// nodeIPs are the node's own addresses, for traces.
	nodeIPs []netip.Addr
}

func newNode(nodeIPs ...netip.Addr) *node {
	n := &node{ipvs: ipvstest.NewFake(), binder: ipvstest.NewBinder(), sets: ipsettest.NewFake(), nodeIPs: nodeIPs}
	n.ipt = map[v1.IPFamily]*iptablestest.Fake{
		v1.IPv4Protocol: iptablestest.NewFake(iptablestest.WithIPSetFake(n.sets)),
		v1.IPv6Protocol: iptablestest.NewIPv6Fake(iptablestest.WithIPSetFake(n.sets)),
	}
	n.applier = ipvsmode.NewApplier(
		ipvs.NewReconciler(n.ipvs, n.binder),
		ipset.NewReconciler(n.sets, ipvsmode.SetPrefix),
		n.ipt[v1.IPv4Protocol], n.ipt[v1.IPv6Protocol],
	)
	return n
}

// apply applies trs and fails t on error.
func (n *node) apply(t testing.TB, trs ...ipvsmode.SyncResult) ipvsmode.ApplyResult {
	t.Helper()
	res, err := n.applier.Apply(context.Background(), trs...)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res
}

// trace follows p through the rules of p's family, with the node's
// addresses and the addresses bound to the dummy interface local; the
// iptables fake decides every set match from the ipset fake's members.
func (n *node) trace(t testing.TB, p iptablestest.Packet) []iptablestest.Outcome {
	t.Helper()
	family := v1.IPv4Protocol
	if p.Destination.Is6() {
		family = v1.IPv6Protocol
	}
	bound, _ := n.binder.Addresses(context.Background(), ipvs.DummyDevice)
	p.NodeAddrs = append(slices.Clone(n.nodeIPs), bound...)
	out, err := n.ipt[family].Trace(p)
	if err != nil {
		t.Fatalf("trace of %+v: %v", p, err)
	}
	return out
}

// verdicts summarises outcomes as their String forms, without the rule
// paths.
func verdicts(out []iptablestest.Outcome) []string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = o.String()
	}
	return s
}

// translate makes a translator for cfg and translates ports, failing t
// if the config is refused.
func translate(t testing.TB, cfg ipvsmode.WriterConfig, ports ...svcPort) ipvsmode.SyncResult {
	t.Helper()
	return translateWith(t, cfg, testNodeIPs, ports...)
}

// translateWith is translate with the node's addresses nodeIPs.
func translateWith(t testing.TB, cfg ipvsmode.WriterConfig, nodeIPs []netip.Addr, ports ...svcPort) ipvsmode.SyncResult {
	t.Helper()
	tr, err := ipvsmode.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svcs, eps := portMaps(t, cfg.Family, ports...)
	return tr.Sync(context.Background(), &proxy.FamilyInput{Services: svcs, Endpoints: eps, NodeIPs: nodeIPs})
}

// testNodeIPs are the node's addresses translate gives the writer:
// modeNodeIPs, and one IPv6 address for the IPv6 tests.
var testNodeIPs = append(slices.Clone(modeNodeIPs), addr("fd00:1::10"))

// addr and prefix parse, for tables.
func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// realServerList is the virtual servers of tr as "VS -> RS RS" lines,
// sorted, with "(bound)" after the bound ones.
func realServerList(services []ipvs.Service) []string {
	var out []string
	for _, s := range services {
		line := s.VirtualServer.String()
		if s.Bind {
			line += " (bound)"
		}
		line += " ->"
		for _, rs := range s.RealServers {
			line += " " + rs.String()
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}
