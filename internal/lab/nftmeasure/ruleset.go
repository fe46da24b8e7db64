package nftmeasure

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"time"

	"sigs.k8s.io/knftables"
)

// Layout is how a ruleset spreads a service's endpoints over nftables
// objects.
type Layout string

const (
	// KubeProxyLike gives every service chain an anonymous verdict map
	// (`numgen random mod N vmap { 0 : goto ..., ... }`), as kube-proxy's
	// nftables mode does: one kernel set per service.
	KubeProxyLike Layout = "kube-proxy-like"
	// SharedMap gives every service a range of offsets in one named verdict
	// map, EndpointsMap, which its chain addresses with
	// `numgen random mod N offset O vmap @service-endpoints`: two kernel
	// maps in all, whatever the number of services.
	SharedMap Layout = "shared-map"
	// NumgenCascade gives every service chain one rule per endpoint, each
	// `numgen random mod K 0 goto ENDPOINT` with K counting down from the
	// number of endpoints to 1 (the last rule is a plain goto), as
	// iptables' statistic cascade: uniform, and no kernel sets at all.
	NumgenCascade Layout = "numgen-cascade"
)

// Names of the objects every generated ruleset has, in family ip.
const (
	Family          = knftables.IPv4Family
	Table           = "proxykit"
	ServiceIPsMap   = "service-ips"
	EndpointsMap    = "service-endpoints"
	ServicesChain   = "services"
	PreroutingChain = "nat-prerouting"
	OutputChain     = "nat-output"
)

// serviceIPsType is the type of ServiceIPsMap in every layout.
const serviceIPsType = "ipv4_addr . inet_proto . inet_service : verdict"

// MaxEndpoints is the width of a service's range of offsets in the
// SharedMap layout, and so the most endpoints a generated service may have.
// The nftables writer would allocate ranges as services come and go; a
// fixed stride is enough to measure the kernel's cost.
const MaxEndpoints = 16

// Service is one generated service port (TCP) and its endpoints.
type Service struct {
	// Index numbers the service from 0; it picks the service's range of
	// offsets in EndpointsMap.
	Index     int
	ClusterIP netip.Addr
	Port      uint16
	Endpoints []netip.AddrPort
	// Local marks the endpoints that run on this node (by index; a
	// missing entry is false): in the DataMap layout their addresses go
	// to HairpinSet.
	Local []bool
	// Affinity is the ClientIP affinity timeout; zero is no affinity.
	// Only the DataMap layout implements it.
	Affinity time.Duration
	// DropWithoutEndpoints makes the DataMap layout drop, rather than
	// reject, packets to the service while it has no endpoints.
	DropWithoutEndpoints bool
	// SourceRanges, if any, are the only clients the DataMap layout lets
	// reach the service (loadBalancerSourceRanges).
	SourceRanges []netip.Prefix
}

func (s Service) isLocal(j int) bool { return j < len(s.Local) && s.Local[j] }

// LocalEvery is how often Cluster puts a service's first endpoint on this
// node: one service in LocalEvery, so that a 10,000-service cluster has 100
// local endpoints, as a node of a 100-node cluster would.
const LocalEvery = 100

// Cluster returns n services with perService endpoints each, on distinct
// cluster IPs from 172.30.0.0 and endpoint addresses from 10.0.0.1. It fails
// when perService is outside 1..MaxEndpoints or the addresses would run out
// of their /16 and /8. The first endpoint of every LocalEvery-th service is
// Local.
func Cluster(n, perService int) ([]Service, error) {
	if perService < 1 || perService > MaxEndpoints {
		return nil, fmt.Errorf("%d endpoints per service: want 1 to %d", perService, MaxEndpoints)
	}
	if n < 0 || n > 1<<16 || n*perService >= 1<<24 {
		return nil, fmt.Errorf("%d services of %d endpoints: too many for the generated address ranges", n, perService)
	}
	svcs := make([]Service, n)
	for i := range svcs {
		eps := make([]netip.AddrPort, perService)
		for j := range eps {
			eps[j] = netip.AddrPortFrom(addr4(10<<24+uint32(i*perService+j+1)), 8080)
		}
		svcs[i] = Service{Index: i, ClusterIP: addr4(172<<24 | 30<<16 | uint32(i)), Port: 80, Endpoints: eps}
		if i%LocalEvery == 0 {
			svcs[i].Local = []bool{true}
		}
	}
	return svcs, nil
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// ServiceChain is the name of svc's chain, in kube-proxy's style
// (service-HASH-namespace/name/protocol/port): the names' length matters to
// nft's and the kernel's cost, so they are as long as kube-proxy's.
func ServiceChain(svc Service) string {
	return fmt.Sprintf("service-%s-bench/svc-%d/tcp/p", nameHash(svc.Index, -1), svc.Index)
}

// EndpointChain is the name of the chain that DNATs to svc's endpoint j.
func EndpointChain(svc Service, j int) string {
	return fmt.Sprintf("endpoint-%s-bench/svc-%d/tcp/p__%s", nameHash(svc.Index, j), svc.Index, svc.Endpoints[j].Addr())
}

func nameHash(i, j int) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d", i, j)
	return fmt.Sprintf("%08X", h.Sum32())
}

// Verb is what an Op does with its object.
type Verb string

// The verbs a Change uses, as knftables' Transaction methods name them.
const (
	Add    Verb = "add"
	Flush  Verb = "flush"
	Delete Verb = "delete"
)

// Op is one operation of a Change.
type Op struct {
	Verb   Verb
	Object knftables.Object
}

// Change is an ordered list of operations: the one model that both ways to
// the kernel take, knftables' transaction (Transaction) and a netlink batch
// (the translator in netlink_linux.go).
type Change []Op

// Transaction appends c's operations to tx. It fails on a verb it does not
// know, before adding anything.
func (c Change) Transaction(tx *knftables.Transaction) error {
	for _, op := range c {
		switch op.Verb {
		case Add, Flush, Delete:
		default:
			return fmt.Errorf("operation %q on %T: unknown verb", op.Verb, op.Object)
		}
	}
	for _, op := range c {
		switch op.Verb {
		case Add:
			tx.Add(op.Object)
		case Flush:
			tx.Flush(op.Object)
		case Delete:
			tx.Delete(op.Object)
		}
	}
	return nil
}

// FullLoad is the change that creates the whole table for svcs in layout:
// base chains hooked at prerouting and output, the dispatch of
// ServiceIPsMap, a chain per service and per endpoint.
func FullLoad(layout Layout, svcs []Service) (Change, error) {
	if layout == DataMap {
		skeleton, elements := DataMapLoad(svcs)
		return append(skeleton, elements...), nil
	}
	if layout != KubeProxyLike && layout != SharedMap && layout != NumgenCascade {
		return nil, fmt.Errorf("unknown layout %q", layout)
	}
	nat, dstnat := knftables.NATType, knftables.DNATPriority
	pre, out := knftables.PreroutingHook, knftables.OutputHook
	c := Change{
		{Add, &knftables.Table{}},
		{Add, &knftables.Map{Name: ServiceIPsMap, Type: serviceIPsType}},
		{Add, &knftables.Chain{Name: ServicesChain}},
		{Add, &knftables.Rule{Chain: ServicesChain, Rule: "ip daddr . meta l4proto . th dport vmap @" + ServiceIPsMap}},
	}
	if layout == SharedMap {
		// typeof, not type: nft has no named 32-bit integer type that
		// numgen's result matches.
		c = append(c, Op{Add, &knftables.Map{Name: EndpointsMap, TypeOf: "numgen random mod 1 : verdict"}})
	}
	for _, base := range []struct {
		name string
		hook *knftables.BaseChainHook
	}{{PreroutingChain, &pre}, {OutputChain, &out}} {
		c = append(c,
			Op{Add, &knftables.Chain{Name: base.name, Type: &nat, Hook: base.hook, Priority: &dstnat}},
			Op{Add, &knftables.Rule{Chain: base.name, Rule: "jump " + ServicesChain}})
	}
	for _, svc := range svcs {
		c = append(c, ServiceChange(layout, svc)...)
		c = append(c, AddServiceIP(svc)...)
	}
	return c, nil
}

// ServiceChange adds svc's service chain, its endpoint chains and, in the
// SharedMap layout, its elements of EndpointsMap.
func ServiceChange(layout Layout, svc Service) Change {
	c := Change{{Add, &knftables.Chain{Name: ServiceChain(svc)}}}
	for j, ep := range svc.Endpoints {
		c = append(c,
			Op{Add, &knftables.Chain{Name: EndpointChain(svc, j)}},
			Op{Add, dnatRule(EndpointChain(svc, j), ep)})
	}
	n := len(svc.Endpoints)
	if layout == SharedMap {
		base := svc.Index * MaxEndpoints
		for j := range svc.Endpoints {
			c = append(c, Op{Add, &knftables.Element{Map: EndpointsMap, Key: []string{fmt.Sprint(base + j)}, Value: []string{"goto " + EndpointChain(svc, j)}}})
		}
		return append(c, Op{Add, &knftables.Rule{Chain: ServiceChain(svc), Rule: fmt.Sprintf("numgen random mod %d offset %d vmap @%s", n, base, EndpointsMap)}})
	}
	if layout == NumgenCascade {
		for j := range svc.Endpoints {
			rule := "goto " + EndpointChain(svc, j)
			if k := n - j; k > 1 {
				rule = fmt.Sprintf("numgen random mod %d 0 %s", k, rule)
			}
			c = append(c, Op{Add, &knftables.Rule{Chain: ServiceChain(svc), Rule: rule}})
		}
		return c
	}
	vmap := make([]byte, 0, n*100)
	vmap = fmt.Appendf(vmap, "numgen random mod %d vmap {", n)
	for j := range svc.Endpoints {
		if j > 0 {
			// The space keeps the comma out of the chain name for
			// readers that split on whitespace (knftables' Fake).
			vmap = append(vmap, " ,"...)
		}
		vmap = fmt.Appendf(vmap, " %d : goto %s", j, EndpointChain(svc, j))
	}
	vmap = append(vmap, " }"...)
	return append(c, Op{Add, &knftables.Rule{Chain: ServiceChain(svc), Rule: string(vmap)}})
}

func serviceIPElement(svc Service) *knftables.Element {
	return &knftables.Element{
		Map:   ServiceIPsMap,
		Key:   []string{svc.ClusterIP.String(), "tcp", fmt.Sprint(svc.Port)},
		Value: []string{"goto " + ServiceChain(svc)},
	}
}

// AddServiceIP adds svc's element of ServiceIPsMap: the one-element change.
func AddServiceIP(svc Service) Change {
	return Change{{Add, serviceIPElement(svc)}}
}

// DeleteServiceIP deletes svc's element of ServiceIPsMap.
func DeleteServiceIP(svc Service) Change {
	return Change{{Delete, serviceIPElement(svc)}}
}

// ReplaceEndpoint is the one-chain change: it flushes the chain of svc's
// endpoint j and gives it a rule that DNATs to to, and adds a chain named
// newChain with a rule that DNATs to to as well. The service's dispatch
// rule is left alone, so the change is the same in both layouts.
func ReplaceEndpoint(svc Service, j int, to netip.AddrPort, newChain string) Change {
	return Change{
		{Flush, &knftables.Chain{Name: EndpointChain(svc, j)}},
		{Add, dnatRule(EndpointChain(svc, j), to)},
		{Add, &knftables.Chain{Name: newChain}},
		{Add, dnatRule(newChain, to)},
	}
}

func dnatRule(chain string, to netip.AddrPort) *knftables.Rule {
	return &knftables.Rule{Chain: chain, Rule: "meta l4proto tcp dnat to " + to.String()}
}
