package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
)

// renderPort queues the chains, rules, affinity sets and element claims of
// one service port, and records in ps what it wrote. ps.chains and ps.sets
// are empty on entry; prevChains and prevSets are what it had, and listed,
// on a full sync that listed the table, the objects found in the kernel
// (nil otherwise). A partial sync leaves alone the endpoint chains whose
// content cannot have changed: everything an endpoint chain holds is in
// its name (service port, protocol, address and port) except whether it
// records affinity, and for how long.
func (w *Writer) renderPort(logger klog.Logger, ps *portState, svc changetracker.ServicePort, rawEps []changetracker.Endpoint, prevChains []string, prevSets []affinitySet, full bool, listed map[string]bool) {
	eps := w.usableEndpoints(logger, ps.name, rawEps)
	cluster, local, all, hasEndpoints := changetracker.CategorizeEndpoints(eps, svc, w.cfg.NodeName, w.nodeLabels)

	clusterChain := clusterChainPrefix + ps.base
	localChain := localChainPrefix + ps.base
	extChain := externalChainPrefix + ps.base
	fwChain := firewallChainPrefix + ps.base

	usesCluster := len(cluster) > 0 && svc.UsesClusterEndpoints()
	usesLocal := len(local) > 0 && svc.UsesLocalEndpoints()
	internalChain, usesInternal := clusterChain, usesCluster
	if svc.InternalPolicyLocal() {
		internalChain, usesInternal = localChain, usesLocal
	}
	externalChain, usesExternal := clusterChain, usesCluster
	if svc.ExternalPolicyLocal() {
		externalChain, usesExternal = localChain, usesLocal
	}
	// A policy whose chain is not written has no endpoints for its
	// traffic (for Local: none on this node).
	hasInternal := hasEndpoints && usesInternal
	hasExternal := hasEndpoints && usesExternal
	usesExt := hasEndpoints && svc.ExternallyAccessible()
	var vips []netip.Addr
	for _, ip := range svc.LoadBalancerVIPs() {
		if w.ownAddr(ip) {
			vips = append(vips, ip)
		}
	}
	usesFW := len(vips) > 0 && w.check.RestrictsSources(svc)
	ps.noLocal = 0
	if hasEndpoints && !hasInternal {
		ps.noLocal |= 1
	}
	if hasEndpoints && !hasExternal && svc.ExternallyAccessible() {
		ps.noLocal |= 2
	}
	affinity := svc.SessionAffinityType() == v1.ServiceAffinityClientIP
	proto := protocolName(svc.Protocol())
	port := strconv.Itoa(svc.Port())

	// Endpoint chains and their affinity sets.
	epNames := make([]string, len(all))
	for i, ep := range all {
		base := endpointBase(ps.name, ep.IP(), ep.Port())
		epNames[i] = base
		chain := endpointChainPrefix + base
		setName := affinitySetPrefix + base
		if affinity {
			w.affinitySet(ps, setName, svc.StickyMaxAgeSeconds(), prevSets, full, listed)
		}
		if !full && slices.Contains(prevChains, chain) {
			k := slices.IndexFunc(prevSets, func(s affinitySet) bool { return s.name == setName })
			if affinity && k >= 0 && prevSets[k].seconds == svc.StickyMaxAgeSeconds() || !affinity && k < 0 {
				ps.chains = append(ps.chains, chain)
				continue
			}
		}
		w.newChain(ps, chain)
		w.rule(chain, w.ipX, "saddr", ep.IP().String(), "jump", markMasqChain)
		if affinity {
			w.rule(chain, "update", "@", affinitySetPrefix+base, "{", w.ipX, "saddr }")
		}
		w.rule(chain, "meta l4proto", proto, "dnat to", endpointText(ep))
	}
	nameOf := func(ep changetracker.Endpoint) string {
		for i, e := range all {
			if e.IP() == ep.IP() && e.Port() == ep.Port() {
				return epNames[i]
			}
		}
		return endpointBase(ps.name, ep.IP(), ep.Port())
	}

	for _, pc := range []struct {
		chain string
		used  bool
		eps   []changetracker.Endpoint
	}{{clusterChain, usesCluster, cluster}, {localChain, usesLocal, local}} {
		if !pc.used {
			continue
		}
		w.newChain(ps, pc.chain)
		if pc.chain == internalChain && hasInternal {
			w.masqueradeRule(pc.chain, svc, proto, port)
		}
		names := make([]string, len(pc.eps))
		for i, ep := range pc.eps {
			names[i] = nameOf(ep)
		}
		w.writeEndpointSelection(pc.chain, names, affinity)
	}

	if usesExt {
		w.newChain(ps, extChain)
		if !svc.ExternalPolicyLocal() {
			// Endpoints may be on other nodes: masquerade, so that
			// replies come back through this node.
			w.rule(extChain, "jump", markMasqChain)
		} else if usesCluster {
			// Pods reaching an external address of the service are not
			// subject to the Local policy: they go to all endpoints, as
			// if they had gone out to the load balancer and come back.
			if w.cfg.ClusterCIDR.IsValid() {
				w.commentedRule(extChain, "short-circuit pod traffic", w.ipX, "saddr", w.cfg.ClusterCIDR.String(), "goto", clusterChain)
			}
			// The node itself sends with a local source address, which
			// endpoints elsewhere could not answer.
			w.commentedRule(extChain, "masquerade local traffic", "fib saddr type local jump", markMasqChain)
			w.commentedRule(extChain, "short-circuit local traffic", "fib saddr type local goto", clusterChain)
		}
		if hasExternal {
			w.rule(extChain, "goto", externalChain)
		}
	}
	if usesFW {
		w.newChain(ps, fwChain)
		var sources []string
		allowFromNode := false
		for _, p := range svc.LoadBalancerSourceRanges() {
			if !w.ownRange(p) {
				continue
			}
			sources = appendListItem(sources, p.Masked().String())
			for _, ip := range w.cfg.NodeIPs {
				allowFromNode = allowFromNode || p.Contains(ip)
			}
		}
		// A node that has the VIP as a local address reaches it with the
		// VIP as source.
		if allowFromNode {
			for _, ip := range vips {
				sources = appendListItem(sources, ip.String())
			}
		}
		w.rule(fwChain, w.ipX, "saddr != {", sources, "} drop")
	}

	// Elements.
	noEPVerdict := "drop"
	if !hasEndpoints {
		noEPVerdict = "goto " + rejectChain
	}
	w.claim(ps, tClusterIPs, []string{svc.ClusterIP().String()}, "", nil)
	svcKey := func(ip netip.Addr) []string { return []string{ip.String(), proto, port} }
	if hasInternal {
		w.claim(ps, tServiceIPs, svcKey(svc.ClusterIP()), "goto "+internalChain, nil)
	} else {
		w.claim(ps, tNoEndpointServices, svcKey(svc.ClusterIP()), noEPVerdict, ps.comment)
	}
	external := func(ip netip.Addr) {
		if hasEndpoints {
			w.claim(ps, tServiceIPs, svcKey(ip), "goto "+extChain, nil)
		}
		if !hasExternal {
			w.claim(ps, tNoEndpointServices, svcKey(ip), noEPVerdict, ps.comment)
		}
	}
	for _, ip := range svc.ExternalIPs() {
		if w.ownAddr(ip) {
			external(ip)
		}
	}
	for _, ip := range vips {
		external(ip)
		if usesFW {
			w.claim(ps, tFirewallIPs, svcKey(ip), "goto "+fwChain, nil)
		}
	}
	if np := svc.NodePort(); np != 0 {
		key := []string{proto, strconv.Itoa(np)}
		if hasEndpoints {
			w.claim(ps, tServiceNodePorts, key, "goto "+extChain, nil)
		}
		if !hasExternal {
			w.claim(ps, tNoEndpointNodePorts, key, noEPVerdict, ps.comment)
		}
	}
	releaseStale(ps, w.gen)
}

// writeEndpointSelection writes the rules of a policy chain (service- or
// local-) that send a new connection to one of the endpoint chains
// endpoint-<name> for names: with ClientIP affinity, first to the
// endpoint the client's address is recorded for, then at random with
// kube-proxy's "numgen random mod N vmap { ... }".
//
// This is the only place that decides how a service chain picks an
// endpoint. kube-proxy's anonymous vmap costs one kernel set per service,
// which the kernel loads in time quadratic in the number of sets
// (BENCHMARKS.md, "nftables: exec vs netlink"); a layout that loads 10,000
// services faster (internal/nftmeasure) replaces this function alone, and
// the packet tracer in nftables/testing with it.
func (w *Writer) writeEndpointSelection(chain string, names []string, affinity bool) {
	if affinity {
		for _, n := range names {
			w.rule(chain, w.ipX, "saddr", "@", affinitySetPrefix+n, "goto", endpointChainPrefix+n)
		}
	}
	elems := make([]string, 0, 5*len(names))
	for i, n := range names {
		if i > 0 {
			elems = append(elems, ",")
		}
		elems = append(elems, strconv.Itoa(i), ":", "goto", endpointChainPrefix+n)
	}
	w.rule(chain, "numgen random mod", strconv.Itoa(len(names)), "vmap {", elems, "}")
}

// masqueradeRule marks cluster-IP traffic from outside the cluster (or
// all of it, with MasqueradeAll) for masquerading.
func (w *Writer) masqueradeRule(chain string, svc changetracker.ServicePort, proto, port string) {
	match := []any{w.ipX, "daddr", svc.ClusterIP().String(), proto, "dport", port}
	switch {
	case w.cfg.MasqueradeAll:
	case w.cfg.ClusterCIDR.IsValid():
		match = append(match, w.ipX, "saddr !=", w.cfg.ClusterCIDR.String())
	default:
		return
	}
	w.rule(chain, append(match, "jump", markMasqChain)...)
}

func appendListItem(list []string, item string) []string {
	if len(list) > 0 {
		list = append(list, ",")
	}
	return append(list, item)
}

// newChain queues a chain of ps: added, and flushed in case it exists.
func (w *Writer) newChain(ps *portState, name string) {
	c := &knftables.Chain{Family: w.family, Table: w.table, Name: name}
	w.chainOps = append(w.chainOps, op{opAdd, c}, op{opFlush, c})
	ps.chains = append(ps.chains, name)
}

// affinitySet queues an affinity set of ps. "add" does not change the
// timeout of an existing set, so a set that exists with another timeout
// (or an unknown one: found by listing) is deleted and added again; its
// rules were flushed with its chains before this. A full sync adds the
// sets it believes exist too, which is a no-op in the kernel unless
// someone deleted one.
func (w *Writer) affinitySet(ps *portState, name string, seconds int, prevSets []affinitySet, full bool, listed map[string]bool) {
	set := &knftables.Set{Family: w.family, Table: w.table, Name: name, Type: w.addrType,
		Flags:   []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: ptr.To(time.Duration(seconds) * time.Second)}
	i := slices.IndexFunc(prevSets, func(s affinitySet) bool { return s.name == name })
	recreate, add := false, false
	if listed != nil {
		_, recreate = listed[name]
		add = true
	} else {
		recreate = i >= 0 && prevSets[i].seconds != seconds
		add = i < 0 || recreate || full
	}
	if recreate {
		w.setOps = append(w.setOps, op{opDelete, &knftables.Set{Family: w.family, Table: w.table, Name: name}})
	}
	if add {
		w.setOps = append(w.setOps, op{opAdd, set})
	}
	ps.sets = append(ps.sets, affinitySet{name: name, seconds: seconds})
}

func (w *Writer) rule(chain string, parts ...any) {
	w.rules = append(w.rules, op{opAdd, &knftables.Rule{Family: w.family, Table: w.table, Chain: chain, Rule: knftables.Concat(parts...)}})
}

func (w *Writer) commentedRule(chain, comment string, parts ...any) {
	w.rules = append(w.rules, op{opAdd, &knftables.Rule{Family: w.family, Table: w.table, Chain: chain, Rule: knftables.Concat(parts...), Comment: &comment}})
}

func (w *Writer) claim(ps *portState, t tableID, key []string, value string, comment *string) {
	w.tables[t].claim(ps, w.gen, key, value, comment)
}

// endpointText is "ip:port", with brackets around an IPv6 address, as
// nft's "dnat to" takes it.
func endpointText(ep changetracker.Endpoint) string {
	return netip.AddrPortFrom(ep.IP(), uint16(ep.Port())).String()
}

func protocolName(p v1.Protocol) string {
	switch p {
	case v1.ProtocolUDP:
		return "udp"
	case v1.ProtocolSCTP:
		return "sctp"
	}
	return "tcp"
}
