package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
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
// (nil otherwise). For a port in kube-proxy's shape, a partial sync leaves
// alone the endpoint chains whose content cannot have changed: everything
// an endpoint chain holds is in its name (service port, protocol, address
// and port) except whether it records affinity, and for how long.
func (w *Writer) renderPort(logger klog.Logger, ps *portState, svc changetracker.ServicePort, rawEps []changetracker.Endpoint, prevChains []string, prevSets []affinitySet, full bool, listed map[string]bool) {
	eps := w.usableEndpoints(logger, ps.name, rawEps)
	cluster, local, all, hasEndpoints := changetracker.CategorizeEndpoints(eps, svc, w.cfg.Node.Name, w.nodeLabels)
	if cap(ps.claims) == 0 {
		// A claim per endpoint per address (and node port) the port is
		// reached at, and one of each address: grown once, not by
		// doubling.
		addrs := 1 + len(svc.ExternalIPs())
		if svc.NodePort() != 0 {
			addrs++
		}
		ps.claims = make([]claimRef, 0, addrs*(len(eps)+1)+1)
	}

	// Affinity, or a Local external policy that the service is reachable
	// by, keeps kube-proxy's per-service chains (below); only then are
	// their names needed.
	perService := svc.SessionAffinityType() == v1.ServiceAffinityClientIP || (svc.ExternalPolicyLocal() && svc.ExternallyAccessible())
	var clusterChain, localChain, extChain string
	if perService {
		clusterChain = clusterChainPrefix + ps.base
		localChain = localChainPrefix + ps.base
		extChain = externalChainPrefix + ps.base
	}

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

	// Services with ClientIP affinity, or with a Local external policy
	// that the service is reachable by, keep kube-proxy's per-service and
	// per-endpoint chains; all others are elements of the data-map layout.
	internalEps, externalEps := cluster, cluster
	if svc.InternalPolicyLocal() {
		internalEps = local
	}
	if perService {
		ps.epValues = nil
		w.renderPerService(ps, svc, proto, port, affinity, all, cluster, local, prevChains, prevSets, full, listed,
			usesCluster, usesLocal, usesExt, hasInternal, hasExternal, clusterChain, localChain, extChain, internalChain, externalChain)
		ps.order = [2][]netip.AddrPort{}
	} else {
		clear(ps.eps)
		if hasInternal {
			ps.order[0] = w.endpointOrder(ps.order[0], internalEps, full)
		} else {
			ps.order[0] = ps.order[0][:0]
		}
		if hasExternal && svc.ExternallyAccessible() {
			ps.order[1] = w.endpointOrder(ps.order[1], externalEps, full)
		} else {
			ps.order[1] = ps.order[1][:0]
		}
		defer ps.dropEPValues(w.gen)
		// A pod that reaches itself through the service must be
		// masqueraded, or it would answer itself directly; only this
		// node's endpoints can be reached so (nat-postrouting matches
		// "saddr . daddr" of DNATed packets against these).
		if hasEndpoints {
			for _, ep := range all {
				if ep.IsLocal() {
					a := ep.IP().String()
					w.claim(ps, tHairpin, []string{a, a}, "", nil)
				}
			}
		}
	}

	// Elements.
	noEPVerdict := "drop"
	if !hasEndpoints {
		noEPVerdict = "goto " + rejectChain
	}
	w.claim(ps, tClusterIPs, []string{svc.ClusterIP().String()}, "", nil)
	svcKey := func(ip netip.Addr) []string { return []string{ip.String(), proto, port} }
	// The verdicts of the service-ips and service-nodeports elements; in
	// the data-map layout each address also gets its endpoints' elements.
	var internalTo, externalTo, nodePortTo string
	if perService {
		internalTo, externalTo = "goto "+internalChain, "goto "+extChain
		nodePortTo = externalTo
	} else {
		internalTo = w.gotoShared(lbInternal, len(ps.order[0]))
		externalTo = w.gotoShared(lbExternal, len(ps.order[1]))
		nodePortTo = w.gotoShared(lbNodePort, len(ps.order[1]))
	}
	if hasInternal {
		w.claim(ps, tServiceIPs, svcKey(svc.ClusterIP()), internalTo, nil)
		if !perService {
			w.claimEndpoints(ps, tEndpoints, svc.ClusterIP().String(), proto, port, ps.order[0])
		}
	} else {
		w.claim(ps, tNoEndpointServices, svcKey(svc.ClusterIP()), noEPVerdict, ps.comment)
	}
	external := func(ip netip.Addr) {
		switch {
		case perService && hasEndpoints:
			w.claim(ps, tServiceIPs, svcKey(ip), externalTo, nil)
		case !perService && hasExternal:
			w.claim(ps, tServiceIPs, svcKey(ip), externalTo, nil)
			w.claimEndpoints(ps, tEndpoints, ip.String(), proto, port, ps.order[1])
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
	var sources []netip.Prefix
	if usesFW {
		sources = w.allowedSources(svc, vips)
	}
	for _, ip := range vips {
		external(ip)
		if usesFW {
			w.claim(ps, tFirewallIPs, svcKey(ip), "", nil)
			for _, src := range sources {
				w.claim(ps, tFirewallAllow, append(svcKey(ip), src.String()), "", nil)
			}
		}
	}
	if np := svc.NodePort(); np != 0 {
		npPort := strconv.Itoa(np)
		key := []string{proto, npPort}
		switch {
		case perService && hasEndpoints:
			w.claim(ps, tServiceNodePorts, key, nodePortTo, nil)
		case !perService && hasExternal:
			w.claim(ps, tServiceNodePorts, key, nodePortTo, nil)
			w.claimEndpoints(ps, tNodePortEndpoints, "", proto, npPort, ps.order[1])
		}
		if !hasExternal {
			w.claim(ps, tNoEndpointNodePorts, key, noEPVerdict, ps.comment)
		}
	}
	releaseStale(ps, w.gen)
}

// renderPerService queues kube-proxy's chains for one service port: an
// endpoint chain per endpoint (hairpin masquerade, affinity, DNAT), the
// policy chains that pick one, and the external chain.
func (w *Writer) renderPerService(ps *portState, svc changetracker.ServicePort, proto, port string, affinity bool,
	all, cluster, local []changetracker.Endpoint, prevChains []string, prevSets []affinitySet, full bool, listed map[string]bool,
	usesCluster, usesLocal, usesExt, hasInternal, hasExternal bool, clusterChain, localChain, extChain, internalChain, externalChain string) {
	// Endpoint chains and their affinity sets.
	seconds := 0
	if affinity {
		seconds = svc.StickyMaxAgeSeconds()
	}
	if ps.eps == nil {
		ps.eps = make(map[netip.AddrPort]*epObjects, len(all))
	}
	if ps.chains == nil {
		ps.chains = make([]string, 0, len(all)+4)
	}
	for _, ep := range all {
		key := netip.AddrPortFrom(ep.IP(), uint16(ep.Port()))
		o := ps.eps[key]
		if o == nil {
			o = w.newEPObjects(ps, key, proto)
			ps.eps[key] = o
		}
		o.gen = w.gen
		if affinity {
			w.affinitySet(ps, o.setName, seconds, prevSets, full, listed)
		}
		if !full && o.seconds == seconds && o.rules != nil && slices.Contains(prevChains, o.chain) {
			ps.chains = append(ps.chains, o.chain)
			continue
		}
		if o.rules == nil || o.seconds != seconds {
			// A new slice, not the old one changed: a transaction the
			// caller still holds keeps what it had.
			o.rules, o.seconds = w.endpointRules(o, key, proto, seconds), seconds
		}
		w.chainOps = append(w.chainOps, o.chainOps[:]...)
		w.rules = append(w.rules, o.rules...)
		ps.chains = append(ps.chains, o.chain)
	}
	for key, o := range ps.eps {
		if o.gen != w.gen {
			delete(ps.eps, key)
		}
	}
	// The policy lists are subsets of all; an Endpoint implementation
	// that answers differently from call to call gets a name, not a panic.
	nameOf := func(ep changetracker.Endpoint) string {
		if o := ps.eps[netip.AddrPortFrom(ep.IP(), uint16(ep.Port()))]; o != nil {
			return o.base
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
			if w.local.Enabled() {
				w.commentedRule(extChain, "short-circuit pod traffic", append(slices.Clip(w.ifLocal), "goto", clusterChain)...)
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
}

// allowedSources returns the sources a load balancer of svc with
// loadBalancerSourceRanges accepts, as elements of the firewall-allow
// interval set: its ranges of the writer's family and, when a range holds
// one of the node's addresses, the VIPs themselves, since a node that has
// a VIP as a local address reaches it from that address. A prefix inside
// another is left out: the kernel refuses overlapping elements of a
// concatenated interval set, and the larger one allows it anyway.
func (w *Writer) allowedSources(svc changetracker.ServicePort, vips []netip.Addr) []netip.Prefix {
	var srcs []netip.Prefix
	allowFromNode := false
	for _, p := range svc.LoadBalancerSourceRanges() {
		if !w.ownRange(p) {
			continue
		}
		srcs = append(srcs, p.Masked())
		for _, ip := range w.nodeIPs {
			allowFromNode = allowFromNode || p.Contains(ip)
		}
	}
	if allowFromNode {
		for _, ip := range vips {
			srcs = append(srcs, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	// Widest first, so that one pass drops every prefix a kept one holds.
	slices.SortFunc(srcs, func(a, b netip.Prefix) int {
		if a.Bits() != b.Bits() {
			return a.Bits() - b.Bits()
		}
		return a.Addr().Compare(b.Addr())
	})
	kept := srcs[:0]
	for _, p := range srcs {
		if !slices.ContainsFunc(kept, func(k netip.Prefix) bool { return k.Contains(p.Addr()) }) {
			kept = append(kept, p)
		}
	}
	return kept
}

// claimEndpoints claims the elements of the endpoints map t for eps, at
// their indexes: keyed by addr, protocol, port and index, or, for the
// node-port map (addr ""), protocol, port and index.
func (w *Writer) claimEndpoints(ps *portState, t tableID, addr, proto, port string, eps []netip.AddrPort) {
	// Every key of the port shares its first parts: the key is looked up
	// from a buffer, and made a string (its parts carved from one array)
	// only when the table does not hold it yet, as on a first sync.
	buf, n := w.keyBuf[:0], 3
	if addr != "" {
		buf, n = append(append(buf, addr...), " . "...), 4
	}
	buf = append(append(append(append(buf, proto...), " . "...), port...), " . "...)
	prefix := len(buf)
	tab := w.tables[t]
	var keys []string
	// A port's first claims hold no value yet (eps holds each endpoint
	// once): none is looked for.
	fresh := len(ps.epValues) == 0
	for i, ep := range eps {
		buf = strconv.AppendInt(buf[:prefix], int64(i), 10)
		e := tab.entries[string(buf)]
		if e == nil {
			if len(keys) < n {
				keys = make([]string, n*(len(eps)-i))
			}
			key := keys[:n:n]
			keys = keys[n:]
			idx := strconv.Itoa(i)
			if addr == "" {
				key[0], key[1], key[2] = proto, port, idx
			} else {
				key[0], key[1], key[2], key[3] = addr, proto, port, idx
			}
			e = tab.add(string(buf), key)
		}
		var v *epValue
		if !fresh {
			v = ps.findEPValue(i, ep)
		}
		if v == nil {
			if ps.epValues == nil {
				ps.epValues = make([]*epValue, 0, len(eps))
			}
			v = w.newEPValue(ep)
			ps.epValues = append(ps.epValues, v)
		}
		v.gen = w.gen
		tab.claimEntry(e, ps, w.gen, v.text, v.parts[:], nil)
	}
	w.keyBuf = buf[:0]
}

// newEPValue makes ep's element value: its text in one string, whose
// parts are slices of it, and the struct from a slab shared by the
// endpoints of a sync (a slab lives while one of its values does).
func (w *Writer) newEPValue(ep netip.AddrPort) *epValue {
	var buf [64]byte
	b := ep.Addr().AppendTo(buf[:0])
	n := len(b)
	b = append(b, " . "...)
	b = strconv.AppendUint(b, uint64(ep.Port()), 10)
	text := string(b)
	if len(w.epSlab) == 0 {
		w.epSlab = make([]epValue, slabSize)
	}
	v := &w.epSlab[0]
	w.epSlab = w.epSlab[1:]
	*v = epValue{ep: ep, text: text, parts: [2]string{text[:n], text[n+3:]}}
	return v
}

// findEPValue returns the value of ep among ps.epValues, or nil. Values
// are appended in the order of the port's endpoints, which most syncs
// keep (endpointOrder), so ep is first looked for at its index i: a
// slice, not a map per port, which a first sync of many small ports would
// make by the thousand.
func (ps *portState) findEPValue(i int, ep netip.AddrPort) *epValue {
	vals := ps.epValues
	if i < len(vals) && vals[i].ep == ep {
		return vals[i]
	}
	for j, v := range vals {
		if v.ep == ep {
			// Moved to its index, so that the next sync finds it
			// there.
			if i < len(vals) {
				vals[i], vals[j] = v, vals[i]
			}
			return v
		}
	}
	return nil
}

// dropEPValues drops the values no claim of sync gen used, each replaced
// by the last one kept, as endpointOrder fills the index of an endpoint
// that went: the values stay at their endpoints' indexes.
func (ps *portState) dropEPValues(gen uint64) {
	vals := ps.epValues
	for i := 0; i < len(vals); {
		if vals[i].gen == gen {
			i++
			continue
		}
		last := len(vals) - 1
		vals[i] = vals[last]
		vals[last] = nil
		vals = vals[:last]
	}
	ps.epValues = vals
}

// gotoShared returns the verdict "goto" the shared chain of kind for k
// endpoints, made once per kind and count.
func (w *Writer) gotoShared(kind string, k int) string {
	key := sharedKey{kind, k}
	v, ok := w.gotos[key]
	if !ok {
		if w.gotos == nil {
			w.gotos = make(map[sharedKey]string)
		}
		v = "goto " + sharedChain(kind, k)
		w.gotos[key] = v
	}
	return v
}

type sharedKey struct {
	kind string
	k    int
}

// epValue is an endpoint as the value of an endpoints map element, made
// once per endpoint of a port and reused by every sync that claims it
// (elements hold parts; nothing changes them).
type epValue struct {
	ep    netip.AddrPort
	text  string    // "addr . port"
	parts [2]string // addr, port
	gen   uint64    // the last sync that claimed it
}

// endpointOrder returns the endpoints of eps in the order of their
// indexes in the endpoints maps. A full sync takes eps' order, so that its
// outcome depends on its input alone. A partial sync keeps every endpoint
// of prev at its index, puts new endpoints into the indexes of those that
// went, moves the last ones into the holes left and appends the new ones
// left: a one-endpoint change rewrites at most two elements, whatever the
// count. prev's array is reused.
func (w *Writer) endpointOrder(prev []netip.AddrPort, eps []changetracker.Endpoint, full bool) []netip.AddrPort {
	if full {
		// An endpoint listed twice (by a caller's own EndpointsMap) gets
		// one index, as in a partial sync.
		prev = prev[:0]
		var seen map[netip.AddrPort]bool
		if len(eps) > 32 {
			seen = make(map[netip.AddrPort]bool, len(eps))
		}
		for _, ep := range eps {
			ap := netip.AddrPortFrom(ep.IP(), uint16(ep.Port()))
			if seen != nil {
				if seen[ap] {
					continue
				}
				seen[ap] = true
			} else if slices.Contains(prev, ap) {
				continue
			}
			prev = append(prev, ap)
		}
		return prev
	}
	want := make(map[netip.AddrPort]bool, len(eps))
	for _, ep := range eps {
		want[netip.AddrPortFrom(ep.IP(), uint16(ep.Port()))] = true
	}
	var holes []int
	for i, ap := range prev {
		if want[ap] {
			delete(want, ap) // what stays in want is new
		} else {
			holes = append(holes, i)
		}
	}
	for _, ep := range eps {
		ap := netip.AddrPortFrom(ep.IP(), uint16(ep.Port()))
		if !want[ap] {
			continue
		}
		delete(want, ap)
		if len(holes) > 0 {
			prev[holes[0]] = ap
			holes = holes[1:]
		} else {
			prev = append(prev, ap)
		}
	}
	// Fill the holes left, lowest first, with the last endpoints that
	// are not holes themselves.
	for len(holes) > 0 {
		last := len(prev) - 1
		if holes[len(holes)-1] == last {
			holes = holes[:len(holes)-1]
		} else {
			prev[holes[0]] = prev[last]
			holes = holes[1:]
		}
		prev = prev[:last]
	}
	return prev
}

// epObjects are the objects of one endpoint's chain, made once and
// reused by every transaction that writes the chain. They are never
// changed once made, so a transaction the caller still holds stays as it
// was.
type epObjects struct {
	base     string // hashed name after the prefixes
	chain    string
	setName  string
	chainOps [2]op // add, flush
	seconds  int   // the affinity timeout the rules were made for; 0 for none
	rules    []op
	gen      uint64
}

func (w *Writer) newEPObjects(ps *portState, key netip.AddrPort, proto string) *epObjects {
	base := endpointBase(ps.name, key.Addr(), int(key.Port()))
	o := &epObjects{base: base, chain: endpointChainPrefix + base, setName: affinitySetPrefix + base}
	c := &knftables.Chain{Family: w.family, Table: w.table, Name: o.chain}
	o.chainOps = [2]op{{opAdd, c}, {opFlush, c}}
	return o
}

// endpointRules makes the rules of an endpoint chain: masquerade hairpin
// traffic (an endpoint reaching itself through the service), record
// affinity, DNAT.
func (w *Writer) endpointRules(o *epObjects, key netip.AddrPort, proto string, seconds int) []op {
	rules := make([]op, 0, 3)
	add := func(text string) {
		rules = append(rules, op{opAdd, &knftables.Rule{Family: w.family, Table: w.table, Chain: o.chain, Rule: text}})
	}
	add(w.ipX + " saddr " + key.Addr().String() + " jump " + markMasqChain)
	if seconds > 0 {
		add("update @" + o.setName + " { " + w.ipX + " saddr }")
	}
	add("meta l4proto " + proto + " dnat to " + key.String())
	return rules
}

// writeEndpointSelection writes the rules of a policy chain (service- or
// local-) of a per-service port that send a new connection to one of the
// endpoint chains endpoint-<name> for names: with ClientIP affinity, first
// to the endpoint the client's address is recorded for, then at random
// with kube-proxy's "numgen random mod N vmap { ... }". Its anonymous set
// costs the kernel one set per such port, which is why only the ports the
// data map cannot express (see the package doc) have these chains.
func (w *Writer) writeEndpointSelection(chain string, names []string, affinity bool) {
	if affinity {
		for _, n := range names {
			w.rule(chain, w.ipX+" saddr @"+affinitySetPrefix+n+" goto "+endpointChainPrefix+n)
		}
	}
	var b strings.Builder
	b.WriteString("numgen random mod ")
	b.WriteString(strconv.Itoa(len(names)))
	b.WriteString(" vmap {")
	for i, n := range names {
		if i > 0 {
			b.WriteString(" ,")
		}
		b.WriteString(" ")
		b.WriteString(strconv.Itoa(i))
		b.WriteString(" : goto ")
		b.WriteString(endpointChainPrefix)
		b.WriteString(n)
	}
	b.WriteString(" }")
	w.rule(chain, b.String())
}

// masqueradeRule marks cluster-IP traffic from outside the cluster (or
// all of it, with MasqueradeAll) for masquerading.
func (w *Writer) masqueradeRule(chain string, svc changetracker.ServicePort, proto, port string) {
	match := []string{w.ipX, "daddr", svc.ClusterIP().String(), proto, "dport", port}
	switch {
	case w.cfg.Node.MasqueradeAll:
	case w.local.Enabled():
		match = append(match, w.ifNotLocal)
	default:
		return
	}
	w.rule(chain, append(match, "jump", markMasqChain)...)
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
// rules were flushed with its chains before this. One the writer
// remembers with another timeout is added as it was first, so that the
// deletion holds if another program deleted it (see deleteSet). A full
// sync adds the sets it believes exist too, which is a no-op in the
// kernel unless someone deleted one.
func (w *Writer) affinitySet(ps *portState, name string, seconds int, prevSets []affinitySet, full bool, listed map[string]bool) {
	set := w.affinitySetObject(name, seconds)
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
		if listed == nil {
			w.setOps = append(w.setOps, op{opAdd, w.affinitySetObject(name, prevSets[i].seconds)})
		}
		w.setOps = append(w.setOps, op{opDelete, &knftables.Set{Family: w.family, Table: w.table, Name: name}})
	}
	if add {
		w.setOps = append(w.setOps, op{opAdd, set})
	}
	ps.sets = append(ps.sets, affinitySet{name: name, seconds: seconds})
}

// affinitySetObject is the affinity set name, recording clients'
// addresses for seconds.
func (w *Writer) affinitySetObject(name string, seconds int) *knftables.Set {
	return &knftables.Set{Family: w.family, Table: w.table, Name: name, Type: w.addrType,
		Flags:   []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: ptr.To(time.Duration(seconds) * time.Second)}
}

// rule queues a rule of chain: parts joined by spaces. A set or map is
// named "@name", one part.
func (w *Writer) rule(chain string, parts ...string) {
	w.rules = append(w.rules, op{opAdd, &knftables.Rule{Family: w.family, Table: w.table, Chain: chain, Rule: strings.Join(parts, " ")}})
}

func (w *Writer) commentedRule(chain, comment string, parts ...string) {
	w.rules = append(w.rules, op{opAdd, &knftables.Rule{Family: w.family, Table: w.table, Chain: chain, Rule: strings.Join(parts, " "), Comment: &comment}})
}

func (w *Writer) claim(ps *portState, t tableID, key []string, value string, comment *string) {
	w.tables[t].claim(ps, w.gen, key, value, nil, comment)
}

// protocolName is p as nft writes it, or "" for a protocol the writer
// does not know (which usable refuses).
func protocolName(p v1.Protocol) string {
	switch p {
	case v1.ProtocolTCP:
		return "tcp"
	case v1.ProtocolUDP:
		return "udp"
	case v1.ProtocolSCTP:
		return "sctp"
	}
	return ""
}
