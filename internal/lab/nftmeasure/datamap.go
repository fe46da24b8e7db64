package nftmeasure

import (
	"fmt"
	"net/netip"
	"strconv"

	"sigs.k8s.io/knftables"
)

// DataMap is the layout that keeps both the kernel's set code and its
// jump validation out of the cost of a change, found by measurement (see
// BENCHMARKS.md). Its objects do not grow with the services except as map
// and set elements:
//
//   - EndpointsDataMap, one data map (not a verdict map) from
//     service IP . protocol . port . endpoint index to endpoint address .
//     port;
//   - one shared chain per endpoint count K (LBChain), whose rule is
//     `dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod K
//     map @endpoints`: at most MaxEndpoints rules look the data map up, so
//     the kernel's per-binding loops (every element added walks the map's
//     bindings; every new binding walks the map's elements) stay short;
//   - ServiceIPsMap sends a service's packets to the LBChain of its
//     endpoint count: nothing per service but that element;
//   - the masquerade mark for sources outside ClusterCIDR is set in the
//     LBChain, the hairpin masquerade in nat-postrouting by looking
//     `ip saddr . ip daddr` up in HairpinSet, which holds `ep . ep` for the
//     node's local endpoints only (a pod can reach itself through a service
//     only from its own node);
//   - services without endpoints are elements of NoEndpointRejectSet or
//     NoEndpointDropSet, matched by filter chains; source ranges are
//     elements of FirewallIPsSet and FirewallAllowSet (a concatenated
//     interval set), matched in filter-prerouting before DNAT;
//   - services with ClientIP affinity, the rare case, keep kube-proxy's
//     shape: a service chain that sends a known client to its endpoint's
//     chain through a per-endpoint set with a timeout, else picks one with a
//     numgen cascade; the endpoint chain records the client and DNATs.
//
// So an endpoint change is element operations only: replacing an endpoint
// rewrites one element of EndpointsDataMap, and a change of the endpoint
// count also points the service's ServiceIPsMap element at another LBChain.
const DataMap Layout = "data-map"

// Names of the DataMap layout's objects (family ip, table Table).
const (
	EndpointsDataMap      = "endpoints"
	HairpinSet            = "hairpin-endpoints"
	NoEndpointRejectSet   = "no-endpoint-reject"
	NoEndpointDropSet     = "no-endpoint-drop"
	FirewallIPsSet        = "firewall-ips"
	FirewallAllowSet      = "firewall-allow"
	PostroutingChain      = "nat-postrouting"
	FilterPreroutingChain = "filter-prerouting"
	FilterForwardChain    = "filter-forward"
	FilterOutputChain     = "filter-output"
	FilterInputChain      = "filter-input"
	rejectChain           = "reject-no-endpoints"
	serviceKeyType        = "ipv4_addr . inet_proto . inet_service"
	// tcp dport, not th dport: nft 1.0.6 cannot add a rule that looks up
	// an existing map whose typeof holds th dport ("conflicting protocols
	// specified: ip vs. th"), only one declared in the same transaction.
	// So the shared chains need a lookup rule per protocol (the generated
	// services are TCP only).
	endpointsDataMapTypeOf = "ip daddr . meta l4proto . tcp dport . numgen random mod 1 : ip daddr . tcp dport"
)

// MasqueradeMark is the mark bit that makes nat-postrouting masquerade a
// packet, kube-proxy's default.
const MasqueradeMark = 0x4000

// ClusterCIDR is the pod network of the generated clusters: traffic to a
// service from outside it is marked for masquerade, as kube-proxy does when
// given --cluster-cidr.
var ClusterCIDR = netip.MustParsePrefix("10.0.0.0/8")

// LBChain is the DataMap layout's shared chain for services of k endpoints.
func LBChain(k int) string { return "lb-" + strconv.Itoa(k) }

// AffinitySet is the set of clients that svc's endpoint j has seen, in the
// DataMap layout (services with Affinity only).
func AffinitySet(svc Service, j int) string {
	return fmt.Sprintf("affinity-%s-bench/svc-%d/tcp/p__%s", nameHash(svc.Index, j), svc.Index, svc.Endpoints[j].Addr())
}

// dataMapSkeleton is the part of the DataMap layout that does not depend
// on the services: sets, maps, base chains, the shared chains.
func dataMapSkeleton() Change {
	nat, filter := knftables.NATType, knftables.FilterType
	dstnat, srcnat := knftables.DNATPriority, knftables.SNATPriority
	preDNAT := knftables.BaseChainPriority("dstnat - 10")
	filterPrio := knftables.BaseChainPriority("filter - 10")
	hook := func(h knftables.BaseChainHook) *knftables.BaseChainHook { return &h }
	c := Change{
		{Add, &knftables.Table{}},
		{Add, &knftables.Map{Name: ServiceIPsMap, Type: serviceIPsType}},
		{Add, &knftables.Map{Name: EndpointsDataMap, TypeOf: endpointsDataMapTypeOf}},
		{Add, &knftables.Set{Name: HairpinSet, Type: "ipv4_addr . ipv4_addr"}},
		{Add, &knftables.Set{Name: NoEndpointRejectSet, Type: serviceKeyType}},
		{Add, &knftables.Set{Name: NoEndpointDropSet, Type: serviceKeyType}},
		{Add, &knftables.Set{Name: FirewallIPsSet, Type: serviceKeyType}},
		{Add, &knftables.Set{Name: FirewallAllowSet, Type: serviceKeyType + " . ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}}},
		{Add, &knftables.Chain{Name: ServicesChain}},
		{Add, &knftables.Rule{Chain: ServicesChain, Rule: "ip daddr . meta l4proto . th dport vmap @" + ServiceIPsMap}},
		{Add, &knftables.Chain{Name: PreroutingChain, Type: &nat, Hook: hook(knftables.PreroutingHook), Priority: &dstnat}},
		{Add, &knftables.Rule{Chain: PreroutingChain, Rule: "jump " + ServicesChain}},
		{Add, &knftables.Chain{Name: OutputChain, Type: &nat, Hook: hook(knftables.OutputHook), Priority: &dstnat}},
		{Add, &knftables.Rule{Chain: OutputChain, Rule: "jump " + ServicesChain}},
		{Add, &knftables.Chain{Name: PostroutingChain, Type: &nat, Hook: hook(knftables.PostroutingHook), Priority: &srcnat}},
		// A pod that reached itself through a service must see the
		// node as the client, or it would answer itself directly.
		{Add, &knftables.Rule{Chain: PostroutingChain, Rule: fmt.Sprintf("ct status dnat ip saddr . ip daddr @%s meta mark set meta mark or %#x", HairpinSet, MasqueradeMark)}},
		{Add, &knftables.Rule{Chain: PostroutingChain, Rule: fmt.Sprintf("meta mark and %#x == 0 return", MasqueradeMark)}},
		{Add, &knftables.Rule{Chain: PostroutingChain, Rule: fmt.Sprintf("meta mark set meta mark xor %#x", MasqueradeMark)}},
		{Add, &knftables.Rule{Chain: PostroutingChain, Rule: "masquerade fully-random"}},
		// Source ranges are checked before DNAT, on the address the client
		// asked for, and on new connections only, as kube-proxy does:
		// established ones are not looked up on every packet.
		{Add, &knftables.Chain{Name: FilterPreroutingChain, Type: &filter, Hook: hook(knftables.PreroutingHook), Priority: &preDNAT}},
		{Add, &knftables.Rule{Chain: FilterPreroutingChain, Rule: fmt.Sprintf(
			"ct state new ip daddr . meta l4proto . th dport @%s ip daddr . meta l4proto . th dport . ip saddr != @%s drop", FirewallIPsSet, FirewallAllowSet)}},
		{Add, &knftables.Chain{Name: rejectChain}},
		{Add, &knftables.Rule{Chain: rejectChain, Rule: fmt.Sprintf("ip daddr . meta l4proto . th dport @%s reject", NoEndpointRejectSet)}},
		{Add, &knftables.Rule{Chain: rejectChain, Rule: fmt.Sprintf("ip daddr . meta l4proto . th dport @%s drop", NoEndpointDropSet)}},
	}
	// A service without endpoints is never DNATed, so its packets reach
	// these hooks with the service's address.
	for _, base := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{FilterForwardChain, knftables.ForwardHook}, {FilterOutputChain, knftables.OutputHook}, {FilterInputChain, knftables.InputHook}} {
		c = append(c,
			Op{Add, &knftables.Chain{Name: base.name, Type: &filter, Hook: hook(base.hook), Priority: &filterPrio}},
			Op{Add, &knftables.Rule{Chain: base.name, Rule: "ct state new jump " + rejectChain}})
	}
	for k := 1; k <= MaxEndpoints; k++ {
		c = append(c,
			Op{Add, &knftables.Chain{Name: LBChain(k)}},
			Op{Add, masqueradeOffCluster(LBChain(k))},
			Op{Add, &knftables.Rule{Chain: LBChain(k), Rule: fmt.Sprintf(
				"dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod %d map @%s", k, EndpointsDataMap)}})
	}
	return c
}

func masqueradeOffCluster(chain string) *knftables.Rule {
	return &knftables.Rule{Chain: chain, Rule: fmt.Sprintf("ip saddr != %s meta mark set meta mark or %#x", ClusterCIDR, MasqueradeMark)}
}

// DataMapLoad is the DataMap layout's full load in two parts: skeleton,
// the objects that do not depend on the services plus the chains and sets
// of services with affinity, and elements, every map and set element. The
// split lets the elements, nearly all of a large table, take a faster way
// to the kernel than the rules (see BENCHMARKS.md). FullLoad(DataMap) is
// both in one change.
func DataMapLoad(svcs []Service) (skeleton, elements Change) {
	skeleton = dataMapSkeleton()
	for _, svc := range svcs {
		if svc.Affinity > 0 && len(svc.Endpoints) > 0 {
			skeleton = append(skeleton, affinityChains(svc)...)
		}
		elements = append(elements, dataMapElements(svc)...)
	}
	return skeleton, elements
}

// dataMapElements are svc's elements in the DataMap layout.
func dataMapElements(svc Service) Change {
	var c Change
	for _, p := range svc.SourceRanges {
		c = append(c, Op{Add, &knftables.Element{Set: FirewallAllowSet, Key: append(serviceKey(svc), p.String())}})
	}
	if len(svc.SourceRanges) > 0 {
		c = append(c, Op{Add, &knftables.Element{Set: FirewallIPsSet, Key: serviceKey(svc)}})
	}
	if len(svc.Endpoints) == 0 {
		set := NoEndpointRejectSet
		if svc.DropWithoutEndpoints {
			set = NoEndpointDropSet
		}
		return append(c, Op{Add, &knftables.Element{Set: set, Key: serviceKey(svc)}})
	}
	for j, ep := range svc.Endpoints {
		if svc.Affinity == 0 {
			c = append(c, Op{Add, endpointElement(svc, j, ep)})
		}
		if svc.isLocal(j) {
			c = append(c, Op{Add, hairpinElement(ep.Addr())})
		}
	}
	return append(c, Op{Add, dataMapServiceIP(svc, len(svc.Endpoints))})
}

// affinityChains are the chains and sets of a service with ClientIP
// affinity, kube-proxy's shape with a numgen cascade instead of an
// anonymous verdict map.
func affinityChains(svc Service) Change {
	sc := ServiceChain(svc)
	timeout := svc.Affinity
	c := Change{{Add, &knftables.Chain{Name: sc}}, {Add, masqueradeOffCluster(sc)}}
	for j, ep := range svc.Endpoints {
		set, ec := AffinitySet(svc, j), EndpointChain(svc, j)
		c = append(c,
			Op{Add, &knftables.Set{Name: set, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &timeout}},
			Op{Add, &knftables.Chain{Name: ec}},
			Op{Add, &knftables.Rule{Chain: ec, Rule: "update @" + set + " { ip saddr }"}},
			Op{Add, dnatRule(ec, ep)},
			Op{Add, &knftables.Rule{Chain: sc, Rule: "ip saddr @" + set + " goto " + ec}})
	}
	n := len(svc.Endpoints)
	for j := range svc.Endpoints {
		rule := "goto " + EndpointChain(svc, j)
		if k := n - j; k > 1 {
			rule = fmt.Sprintf("numgen random mod %d 0 %s", k, rule)
		}
		c = append(c, Op{Add, &knftables.Rule{Chain: sc, Rule: rule}})
	}
	return c
}

func serviceKey(svc Service) []string {
	return []string{svc.ClusterIP.String(), "tcp", strconv.Itoa(int(svc.Port))}
}

// dataMapServiceIP is svc's ServiceIPsMap element when it has n endpoints:
// to the shared chain of n endpoints, or to its own chain with affinity.
func dataMapServiceIP(svc Service, n int) *knftables.Element {
	to := LBChain(n)
	if svc.Affinity > 0 {
		to = ServiceChain(svc)
	}
	return &knftables.Element{Map: ServiceIPsMap, Key: serviceKey(svc), Value: []string{"goto " + to}}
}

func endpointElement(svc Service, j int, ep netip.AddrPort) *knftables.Element {
	return &knftables.Element{
		Map:   EndpointsDataMap,
		Key:   append(serviceKey(svc), strconv.Itoa(j)),
		Value: []string{ep.Addr().String(), strconv.Itoa(int(ep.Port()))},
	}
}

func hairpinElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: HairpinSet, Key: []string{a.String(), a.String()}}
}

// DataMapReplaceEndpoint is the DataMap layout's one-endpoint change that
// keeps the endpoint count: svc's endpoint j becomes to (a service without
// affinity). One element of EndpointsDataMap is rewritten; nothing that
// holds a verdict changes.
func DataMapReplaceEndpoint(svc Service, j int, to netip.AddrPort) Change {
	return Change{
		{Delete, endpointElement(svc, j, svc.Endpoints[j])},
		{Add, endpointElement(svc, j, to)},
	}
}

// DataMapRemoveEndpoint is the DataMap layout's one-endpoint change that
// lowers the endpoint count: svc (without affinity) loses its endpoint j.
// The last endpoint takes index j, the last index goes, and the service's
// ServiceIPsMap element is pointed at the shared chain of one endpoint
// fewer: the one verdict of the change, which makes the kernel validate
// the table's jumps on commit. HairpinSet is left alone, in this change
// and in DataMapReplaceEndpoint: an endpoint may serve other services, so a
// writer counts its uses. When j is the only endpoint, the service's
// ServiceIPsMap element goes and it joins NoEndpointRejectSet (or
// NoEndpointDropSet). A j out of range is no change (nil).
func DataMapRemoveEndpoint(svc Service, j int) Change {
	n := len(svc.Endpoints)
	if j < 0 || j >= n {
		return nil
	}
	last := svc.Endpoints[n-1]
	c := Change{{Delete, endpointElement(svc, n-1, last)}}
	if j != n-1 {
		c = append(c,
			Op{Delete, endpointElement(svc, j, svc.Endpoints[j])},
			Op{Add, endpointElement(svc, j, last)})
	}
	c = append(c, Op{Delete, dataMapServiceIP(svc, n)})
	if n == 1 {
		empty := svc
		empty.Endpoints = nil
		return append(c, dataMapElements(empty)...)
	}
	return append(c, Op{Add, dataMapServiceIP(svc, n-1)})
}

// AffinityReplaceEndpoint is the one-endpoint change of a service with
// ClientIP affinity (svc.Affinity > 0), which keeps kube-proxy's shape:
// the new endpoint's set and chain are added, the service chain is
// rewritten to use them, and the old endpoint's chain and set are deleted.
// Clients that the old endpoint had seen are picked afresh, as in
// kube-proxy. Unlike the other services' changes it holds rules and jumps.
func AffinityReplaceEndpoint(svc Service, j int, to netip.AddrPort) Change {
	next := svc
	next.Endpoints = append([]netip.AddrPort(nil), svc.Endpoints...)
	next.Endpoints[j] = to
	var c Change
	for _, op := range affinityChains(next) {
		switch o := op.Object.(type) {
		case *knftables.Chain:
			if o.Name == ServiceChain(next) {
				c = append(c, op, Op{Flush, o})
				continue
			}
			if o.Name != EndpointChain(next, j) {
				continue
			}
		case *knftables.Set:
			if o.Name != AffinitySet(next, j) {
				continue
			}
		case *knftables.Rule:
			if o.Chain != ServiceChain(next) && o.Chain != EndpointChain(next, j) {
				continue
			}
		}
		c = append(c, op)
	}
	old := &knftables.Chain{Name: EndpointChain(svc, j)}
	return append(c,
		Op{Flush, old},
		Op{Delete, old},
		Op{Delete, &knftables.Set{Name: AffinitySet(svc, j)}})
}
