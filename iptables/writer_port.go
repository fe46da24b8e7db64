package iptables

import (
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/changetracker"
)

// writePort appends to b the chains of one service port and queues its
// top-level rules and its stale chains, then records in ps what it wrote.
// In a partial sync (full false) the top-level rules are written as a diff
// against ps.top, and endpoint chains whose content is unchanged are left
// alone.
func (w *Writer) writePort(b []byte, ps *portState, svc changetracker.ServicePort, eps []changetracker.Endpoint, full bool) []byte {
	cluster, local, all, hasEndpoints := changetracker.CategorizeEndpoints(eps, svc, w.cfg.Node.Name, w.nodeLabels)

	var chains uint8
	if len(cluster) > 0 && svc.UsesClusterEndpoints() {
		chains |= 1 << kindSVC
	}
	if len(local) > 0 && svc.UsesLocalEndpoints() {
		chains |= 1 << kindSVL
	}
	internal, hasInternal := kindSVC, hasEndpoints
	if svc.InternalPolicyLocal() {
		internal = kindSVL
	}
	external, hasExternal := kindSVC, hasEndpoints
	if svc.ExternalPolicyLocal() {
		external = kindSVL
	}
	// A policy whose chain is not written has no endpoints for its
	// traffic (for Local: none on this node).
	hasInternal = hasInternal && chains&(1<<internal) != 0
	hasExternal = hasExternal && chains&(1<<external) != 0
	var hasLB bool
	for _, ip := range svc.LoadBalancerVIPs() {
		hasLB = hasLB || w.ownAddr(ip)
	}
	if hasEndpoints && svc.ExternallyAccessible() {
		chains |= 1 << kindEXT
	}
	usesFW := hasEndpoints && hasLB && w.restrictsSources(svc)
	if usesFW {
		chains |= 1 << kindFW
	}
	var noLocal uint8
	if hasEndpoints && !hasInternal {
		noLocal |= 1
	}
	if hasEndpoints && !hasExternal && svc.ExternallyAccessible() {
		noLocal |= 2
	}

	affinity := svc.SessionAffinityType() == v1.ServiceAffinityClientIP
	comments := !w.largeCluster()
	var flags uint8
	if affinity {
		flags |= sepAffinity
	}
	if comments {
		flags |= sepComments
	}
	reuse := w.matchSEPs(ps, all)
	rewriteSEPs := full || ps.sepFlags != flags

	// Chains first: iptables-restore wants a chain declared before a rule
	// jumps to it. Declaring a chain that exists flushes it.
	for k := kindSVC; k < kindSEP; k++ {
		if chains&(1<<k) != 0 {
			b = w.declare(b, chainRef{kind: k, hash: ps.hash})
		}
	}
	for i := range w.newSEPs {
		if rewriteSEPs || !reuse[i] {
			b = w.declare(b, chainRef{kind: kindSEP, hash: w.newSEPs[i].hash})
		}
	}

	proto := protocolName(svc.Protocol())
	if chains&(1<<kindEXT) != 0 {
		b = w.writeExternalChain(b, ps, svc, chains, external, hasExternal)
	}
	if usesFW {
		b = w.writeFirewallChain(b, ps, svc)
	}
	for _, k := range [...]chainKind{kindSVC, kindSVL} {
		if chains&(1<<k) == 0 {
			continue
		}
		if k == internal && hasInternal {
			b = w.writeMasqueradeRule(b, ps, svc, k, proto)
		}
		list := cluster
		if k == kindSVL {
			list = local
		}
		b = w.writeBalancing(b, ps, svc, k, list, affinity, comments)
	}
	for i := range w.newSEPs {
		if rewriteSEPs || !reuse[i] {
			b = w.writeEndpointChain(b, ps, w.newSEPs[i], proto, affinity, comments)
		}
	}

	w.writeTopRules(ps, svc, proto, hasEndpoints, hasInternal, hasExternal, internal, usesFW, full)

	// Chains the port no longer needs.
	for k := kindSVC; k < kindSEP; k++ {
		if ps.chains&(1<<k) != 0 && chains&(1<<k) == 0 {
			w.deleteChain(chainRef{kind: k, hash: ps.hash})
		}
	}
	for _, r := range w.staleSEPs {
		w.deleteChain(r)
	}
	if len(w.maybeStale) > 0 {
		for k := kindSVC; k < kindSEP; k++ {
			if chains&(1<<k) != 0 {
				delete(w.maybeStale, chainRef{kind: k, hash: ps.hash})
			}
		}
		for i := range w.newSEPs {
			delete(w.maybeStale, chainRef{kind: kindSEP, hash: w.newSEPs[i].hash})
		}
	}

	ps.chains = chains
	ps.seps = append(ps.seps[:0], w.newSEPs...)
	ps.sepFlags = flags
	ps.endpoints = len(eps)
	ps.noLocal = noLocal
	return b
}

// matchSEPs fills w.newSEPs with the endpoint chains of all, reusing the
// hashes of ps.seps where the endpoint is the same, and w.staleSEPs with
// the chains of ps.seps that all no longer has. It returns, per entry of
// w.newSEPs, whether that chain existed before. Both lists are normally
// sorted by "ip:port" string (EndpointsMap keeps them so), which makes this a
// merge; unsorted input costs more hashing but gives the same result.
func (w *Writer) matchSEPs(ps *portState, all []changetracker.Endpoint) []bool {
	w.newSEPs = w.newSEPs[:0]
	w.staleSEPs = w.staleSEPs[:0]
	w.reuse = w.reuse[:0]
	w.oldMatched = slices.Grow(w.oldMatched[:0], len(ps.seps))[:len(ps.seps)]
	clear(w.oldMatched)
	j := 0
	for _, ep := range all {
		ip, port := ep.IP(), ep.Port()
		found := false
		var h chainHash
		for j < len(ps.seps) {
			// The same endpoint as before, the usual case in a resync,
			// needs no ordering, which costs a text key per address.
			c := 0
			if e := ps.seps[j].ep; e.IP() != ip || e.Port() != port {
				c = compareEndpoint(e, ip, port)
			}
			if c > 0 {
				break
			}
			if c == 0 {
				h, found = ps.seps[j].hash, true
				w.oldMatched[j] = true
				j++
				break
			}
			j++
		}
		if !found {
			h = w.endpointHash(ps.name, ip, port)
		}
		w.newSEPs = append(w.newSEPs, sepState{ep: ep, hash: h})
		w.reuse = append(w.reuse, found)
	}
	for i := range ps.seps {
		if w.oldMatched[i] || w.hasNewSEP(ps.seps[i].hash) {
			continue
		}
		w.staleSEPs = append(w.staleSEPs, chainRef{kind: kindSEP, hash: ps.seps[i].hash})
	}
	return w.reuse
}

func (w *Writer) hasNewSEP(h chainHash) bool {
	for i := range w.newSEPs {
		if w.newSEPs[i].hash == h {
			return true
		}
	}
	return false
}

// compareEndpoint orders endpoints as EndpointsMap keeps them, so that
// matchSEPs stays a merge.
func compareEndpoint(ep changetracker.Endpoint, ip netip.Addr, port int) int {
	return changetracker.CompareHostPort(ep.IP(), ep.Port(), ip, port)
}

func (w *Writer) endpointHash(name changetracker.ServicePortName, ip netip.Addr, port int) chainHash {
	w.scratch = appendEndpoint(appendPortKey(w.scratch[:0], name), ip, port)
	return hashInto(w.scratch)
}

// sepChain returns the chain of an endpoint of list, which is a
// subsequence of w.newSEPs in the same order; *k walks w.newSEPs.
func (w *Writer) sepChain(ps *portState, ep changetracker.Endpoint, k *int) chainRef {
	ip, port := ep.IP(), ep.Port()
	for ; *k < len(w.newSEPs); *k++ {
		// Equality is all this walk needs; the order (compareEndpoint)
		// costs a text key per address.
		if e := w.newSEPs[*k].ep; e.IP() == ip && e.Port() == port {
			return chainRef{kind: kindSEP, hash: w.newSEPs[*k].hash}
		}
	}
	*k = 0
	return chainRef{kind: kindSEP, hash: w.endpointHash(ps.name, ip, port)}
}

func (w *Writer) declare(b []byte, r chainRef) []byte {
	if w.splitDue {
		w.splitDue = false
		w.batchChains = 0
		b = w.endLine(append(b, "COMMIT"...))
		b = w.endLine(append(b, "*nat"...))
	}
	w.batchChains++
	w.declared++
	b = append(b, ':')
	b = r.appendTo(b, w.cn)
	return w.endLine(append(b, " - [0:0]"...))
}

func (w *Writer) ruleStart(b []byte, r chainRef) []byte {
	return r.appendTo(append(b, "-A "...), w.cn)
}

// writeExternalChain writes KUBE-EXT-*, where all traffic to the port's
// node port, external IPs and load-balancer VIPs goes.
func (w *Writer) writeExternalChain(b []byte, ps *portState, svc changetracker.ServicePort, chains uint8, policy chainKind, hasExternal bool) []byte {
	ext := chainRef{kind: kindEXT, hash: ps.hash}
	svcChain := chainRef{kind: kindSVC, hash: ps.hash}
	if !svc.ExternalPolicyLocal() {
		// Endpoints may be on other nodes: masquerade so replies come back
		// through this node.
		b = w.ruleStart(b, ext)
		b = appendComment(b, "masquerade traffic for ", &ps.text, " external destinations")
		b = w.endLine(append(b, w.jumpMasq...))
	} else if chains&(1<<kindSVC) != 0 {
		// Pods reaching an external address of the service are not
		// subject to the Local policy: they are sent to all endpoints, as
		// if they had gone out to the load balancer and come back.
		if w.local.Enabled() {
			b = w.ruleStart(b, ext)
			b = appendComment(b, "pod traffic for ", &ps.text, " external destinations")
			b = append(b, w.ifLocal...)
			b = w.endLine(svcChain.appendTo(append(b, " -j "...), w.cn))
		}
		// Traffic from the node itself has a local address as source,
		// which endpoints elsewhere could not answer: masquerade it and
		// send it to all endpoints.
		b = w.ruleStart(b, ext)
		b = appendComment(b, "masquerade LOCAL traffic for ", &ps.text, " external destinations")
		b = w.endLine(append(append(b, " -m addrtype --src-type LOCAL"...), w.jumpMasq...))
		b = w.ruleStart(b, ext)
		b = appendComment(b, "route LOCAL traffic for ", &ps.text, " external destinations")
		b = append(b, " -m addrtype --src-type LOCAL -j "...)
		b = w.endLine(svcChain.appendTo(b, w.cn))
	}
	if hasExternal {
		b = w.ruleStart(b, ext)
		b = append(b, " -j "...)
		b = w.endLine(chainRef{kind: policy, hash: ps.hash}.appendTo(b, w.cn))
	}
	return b
}

// writeFirewallChain writes KUBE-FW-*, which lets load-balancer traffic
// from loadBalancerSourceRanges on to KUBE-EXT-*; the rest falls through
// and is dropped by KUBE-PROXY-FIREWALL in the filter table.
func (w *Writer) writeFirewallChain(b []byte, ps *portState, svc changetracker.ServicePort) []byte {
	fw := chainRef{kind: kindFW, hash: ps.hash}
	ext := chainRef{kind: kindEXT, hash: ps.hash}
	allow := func(b []byte, appendSource func([]byte) []byte) []byte {
		b = w.ruleStart(b, fw)
		b = appendComment(b, "", &ps.text, " loadbalancer IP")
		b = appendSource(append(b, " -s "...))
		return w.endLine(ext.appendTo(append(b, " -j "...), w.cn))
	}
	allowFromNode := false
	for _, cidr := range svc.LoadBalancerSourceRanges() {
		if !w.ownRange(cidr) {
			continue
		}
		b = allow(b, cidr.AppendTo)
		for _, ip := range w.nodeIPs {
			allowFromNode = allowFromNode || cidr.Contains(ip)
		}
	}
	// A node that has the VIP as a local address reaches it with the VIP
	// as source.
	if allowFromNode {
		for _, ip := range svc.LoadBalancerVIPs() {
			if w.ownAddr(ip) {
				b = allow(b, ip.AppendTo)
			}
		}
	}
	b = w.ruleStart(b, fw)
	b = appendComment(b, "other traffic to ", &ps.text, w.droppedByFW)
	return w.endLine(b)
}

// writeMasqueradeRule marks cluster-IP traffic from outside the cluster
// (or all of it with MasqueradeAll) for masquerading.
func (w *Writer) writeMasqueradeRule(b []byte, ps *portState, svc changetracker.ServicePort, k chainKind, proto string) []byte {
	if !w.cfg.Node.MasqueradeAll && !w.local.Enabled() {
		return b
	}
	b = w.ruleStart(b, chainRef{kind: k, hash: ps.hash})
	b = appendComment(b, "", &ps.text, " cluster IP")
	b = appendDestination(appendProtocol(b, proto), svc.ClusterIP(), svc.Port())
	if !w.cfg.Node.MasqueradeAll {
		b = append(b, w.ifNotLocal...)
	}
	return w.endLine(append(b, w.jumpMasq...))
}

// writeBalancing writes the rules of KUBE-SVC-* or KUBE-SVL-* that pick an
// endpoint: first the session-affinity rules, then one rule per endpoint
// with probability 1/(endpoints left), the last one unconditional.
func (w *Writer) writeBalancing(b []byte, ps *portState, svc changetracker.ServicePort, k chainKind, list []changetracker.Endpoint, affinity, comments bool) []byte {
	self := chainRef{kind: k, hash: ps.hash}
	if affinity {
		seconds := strconv.Itoa(svc.StickyMaxAgeSeconds())
		pos := 0
		for _, ep := range list {
			sep := w.sepChain(ps, ep, &pos)
			b = w.ruleStart(b, self)
			if comments {
				b = appendEndpointComment(b, &ps.text, ep)
			}
			b = append(b, " -m recent --name "...)
			b = sep.appendTo(b, w.cn)
			b = append(b, " --rcheck --seconds "...)
			b = append(b, seconds...)
			b = append(b, " --reap -j "...)
			b = w.endLine(sep.appendTo(b, w.cn))
		}
	}
	pos := 0
	n := len(list)
	for i, ep := range list {
		sep := w.sepChain(ps, ep, &pos)
		b = w.ruleStart(b, self)
		if comments {
			b = appendEndpointComment(b, &ps.text, ep)
		}
		if i < n-1 {
			b = append(b, " -m statistic --mode random --probability "...)
			b = append(b, w.probability(n-i)...)
		}
		b = w.endLine(sep.appendTo(append(b, " -j "...), w.cn))
	}
	return b
}

// writeEndpointChain writes KUBE-SEP-*: masquerade hairpin traffic (an
// endpoint reaching itself through the service), then DNAT.
func (w *Writer) writeEndpointChain(b []byte, ps *portState, sep sepState, proto string, affinity, comments bool) []byte {
	self := chainRef{kind: kindSEP, hash: sep.hash}
	ip := sep.ep.IP()
	b = w.ruleStart(b, self)
	if comments {
		b = appendPlainComment(b, &ps.text)
	}
	b = append(b, " -s "...)
	b = ip.AppendTo(b)
	b = w.endLine(append(b, w.jumpMasq...))
	b = w.ruleStart(b, self)
	if comments {
		b = appendPlainComment(b, &ps.text)
	}
	if affinity {
		b = append(b, " -m recent --name "...)
		b = append(self.appendTo(b, w.cn), " --set"...)
	}
	b = appendProtocol(b, proto)
	b = append(b, " -j DNAT --to-destination "...)
	return w.endLine(appendEndpoint(b, ip, sep.ep.Port()))
}

// writeTopRules builds the port's rules in the top-level chains in
// w.scratch, then writes them (full) or the difference from ps.top
// (partial), and records them in ps.top.
func (w *Writer) writeTopRules(ps *portState, svc changetracker.ServicePort, proto string, hasEndpoints, hasInternal, hasExternal bool, internal chainKind, usesFW bool, full bool) {
	w.scratch = w.scratch[:0]
	w.specs = w.specs[:0]
	name := &ps.text
	port := svc.Port()
	ext := chainRef{kind: kindEXT, hash: ps.hash}

	var internalTarget, externalTarget, internalWhy, externalWhy string
	if !hasEndpoints {
		internalTarget, internalWhy = "REJECT", " has no endpoints"
		externalTarget, externalWhy = "REJECT", " has no endpoints"
	} else {
		internalTarget, internalWhy = "DROP", " has no local endpoints"
		externalTarget, externalWhy = "DROP", " has no local endpoints"
	}

	internalChain := chainRef{kind: internal, hash: ps.hash}
	if hasInternal {
		w.addServiceSpec(natServices, name, " cluster IP", proto, svc.ClusterIP(), port, "", internalChain)
	} else {
		w.addServiceSpec(filterServices, name, internalWhy, proto, svc.ClusterIP(), port, internalTarget, chainRef{})
	}
	for _, ip := range svc.ExternalIPs() {
		if !w.ownAddr(ip) {
			continue
		}
		if hasEndpoints {
			w.addServiceSpec(natServices, name, " external IP", proto, ip, port, "", ext)
		}
		if !hasExternal {
			w.addServiceSpec(filterExternal, name, externalWhy, proto, ip, port, externalTarget, chainRef{})
		}
	}
	fw := chainRef{kind: kindFW, hash: ps.hash}
	lbTarget := ext
	if usesFW {
		lbTarget = fw
	}
	var fwWhy []byte
	if usesFW {
		fwWhy = fw.appendTo([]byte(" traffic not accepted by "), w.cn)
	}
	for _, ip := range svc.LoadBalancerVIPs() {
		if !w.ownAddr(ip) {
			continue
		}
		if hasEndpoints {
			w.addServiceSpec(natServices, name, " loadbalancer IP", proto, ip, port, "", lbTarget)
		}
		if usesFW {
			w.addServiceSpec(filterFirewall, name, string(fwWhy), proto, ip, port, "DROP", chainRef{})
		}
		if !hasExternal {
			w.addServiceSpec(filterExternal, name, externalWhy, proto, ip, port, externalTarget, chainRef{})
		}
	}
	if np := svc.NodePort(); np != 0 {
		if hasEndpoints && w.acct.LocalhostNodePorts && w.routeLocalnet {
			// The same jump for loopback destinations first, counted:
			// packets it takes never reach the rule after it.
			w.scratch = appendPlainComment(w.scratch, name)
			w.scratch = appendProtocol(w.scratch, proto)
			w.scratch = append(w.scratch, " -d 127.0.0.0/8 --dport "...)
			w.scratch = strconv.AppendInt(w.scratch, int64(np), 10)
			w.scratch = append(w.scratch, " -m nfacct --nfacct-name "+NFAcctLocalhostNodePorts...)
			w.scratch = ext.appendTo(append(w.scratch, " -j "...), w.cn)
			w.addSpec(natNodePorts)
		}
		if hasEndpoints {
			w.scratch = appendPlainComment(w.scratch, name)
			w.scratch = appendProtocol(w.scratch, proto)
			w.scratch = strconv.AppendInt(append(w.scratch, " --dport "...), int64(np), 10)
			w.scratch = ext.appendTo(append(w.scratch, " -j "...), w.cn)
			w.addSpec(natNodePorts)
		}
		if !hasExternal {
			w.scratch = appendComment(w.scratch, "", name, externalWhy)
			w.scratch = append(w.scratch, " -m addrtype --dst-type LOCAL"...)
			w.scratch = appendProtocol(w.scratch, proto)
			w.scratch = strconv.AppendInt(append(w.scratch, " --dport "...), int64(np), 10)
			w.scratch = append(append(w.scratch, " -j "...), externalTarget...)
			w.addSpec(filterExternal)
		}
	}
	if hc := svc.HealthCheckNodePort(); hc != 0 {
		// Health checks must reach the node whether or not it has
		// endpoints: that is how the load balancer learns it has none.
		w.scratch = appendComment(w.scratch, "", name, " health check node port")
		w.scratch = append(w.scratch, " -m tcp -p tcp --dport "...)
		w.scratch = strconv.AppendInt(w.scratch, int64(hc), 10)
		w.scratch = append(w.scratch, " -j ACCEPT"...)
		w.addSpec(filterNodePorts)
	}

	if full {
		for _, s := range w.specs {
			w.topRuleLine(s.chain, "-A", w.scratch[s.start:s.end])
		}
	} else {
		w.diffTopRules(ps)
	}
	// Record the new rules, keeping the old strings where they did not
	// change so that steady-state syncs allocate nothing here.
	old := ps.top
	if len(old) == len(w.specs) {
		same := true
		for i, s := range w.specs {
			if old[i].chain != s.chain || old[i].spec != string(w.scratch[s.start:s.end]) {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	top := make([]topRule, len(w.specs))
	for i, s := range w.specs {
		spec := w.scratch[s.start:s.end]
		top[i].chain = s.chain
		if r, ok := findTopRule(old, s.chain, spec); ok {
			top[i].spec = r
		} else {
			top[i].spec = string(spec)
		}
	}
	ps.top = top
}

// addSpec records the text added to w.scratch since the previous spec as
// a rule of chain c.
func (w *Writer) addSpec(c topChain) {
	start := 0
	if n := len(w.specs); n > 0 {
		start = w.specs[n-1].end
	}
	w.specs = append(w.specs, specRange{chain: c, start: start, end: len(w.scratch)})
}

// addServiceSpec adds the rule
// ` -m comment --comment "NAMEwhy" -m PROTO -p PROTO -d IP --dport PORT -j TARGET`,
// where TARGET is verdict, or chain when verdict is empty.
func (w *Writer) addServiceSpec(c topChain, name *portText, why, proto string, ip netip.Addr, port int, verdict string, chain chainRef) {
	w.scratch = appendComment(w.scratch, "", name, why)
	w.scratch = appendDestination(appendProtocol(w.scratch, proto), ip, port)
	w.scratch = append(w.scratch, " -j "...)
	if verdict != "" {
		w.scratch = append(w.scratch, verdict...)
	} else {
		w.scratch = chain.appendTo(w.scratch, w.cn)
	}
	w.addSpec(c)
}

func findTopRule(rules []topRule, c topChain, spec []byte) (string, bool) {
	for _, r := range rules {
		if r.chain == c && r.spec == string(spec) {
			return r.spec, true
		}
	}
	return "", false
}

// diffTopRules writes the deletion of the port's old top-level rules that
// are not among the new ones, and the insertion of the new ones that are
// not among the old.
func (w *Writer) diffTopRules(ps *portState) {
	for _, r := range ps.top {
		found := false
		for _, s := range w.specs {
			if s.chain == r.chain && r.spec == string(w.scratch[s.start:s.end]) {
				found = true
				break
			}
		}
		if !found {
			w.topRuleDelete(r)
		}
	}
	for _, s := range w.specs {
		spec := w.scratch[s.start:s.end]
		if _, ok := findTopRule(ps.top, s.chain, spec); ok {
			continue
		}
		op := "-A"
		if s.chain == natServices {
			// Stay ahead of the node-port rule, which must be last.
			op = "-I"
		}
		w.topRuleLine(s.chain, op, spec)
	}
}

// topRuleLine appends "OP CHAIN spec" to the nat or filter top-level
// buffer. "-I" inserts at the top of the chain.
func (w *Writer) topRuleLine(c topChain, op string, spec []byte) {
	w.lines++
	if c.isNAT() {
		w.natTop = appendTopRule(w.natTop, w.topChainName(c), op, spec)
	} else {
		w.filter = appendTopRule(w.filter, w.topChainName(c), op, spec)
	}
}

// topRuleDelete is topRuleLine for a recorded rule.
func (w *Writer) topRuleDelete(r topRule) {
	w.lines++
	if r.chain.isNAT() {
		w.natTop = appendTopRule(w.natTop, w.topChainName(r.chain), "-D", r.spec)
	} else {
		w.filter = appendTopRule(w.filter, w.topChainName(r.chain), "-D", r.spec)
	}
}

// appendTopRule appends the line "OP CHAIN[ 1]spec"; specs start with a
// space.
func appendTopRule[T string | []byte](b []byte, c Chain, op string, spec T) []byte {
	b = append(b, op...)
	b = append(b, ' ')
	b = append(b, c...)
	if op == "-I" {
		b = append(b, " 1"...)
	}
	b = append(b, spec...)
	return append(b, '\n')
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

// portText is a service port's name ("ns/name:port", as
// ServicePortName.String prints it) made into restore text once, when the
// writer first sees the port, so that rules copy it without looking at
// its bytes again.
type portText struct {
	// inQuotes is the name escaped for a double-quoted word.
	inQuotes string
	// word is the name as a word of its own, bare or quoted.
	word string
}

// makePortText makes name's restore text through AppendRestoreText and
// AppendRestoreWord, in buf (returned for reuse), and refuses what they
// refuse. A name that needs no quotes, as every name the API server
// accepts, costs one string for both forms.
func makePortText(buf []byte, name changetracker.ServicePortName) (portText, []byte, error) {
	buf, err := appendPortText(buf[:0], name)
	if err != nil {
		return portText{}, buf, err
	}
	t := portText{inQuotes: string(buf)}
	if name.Port == "" {
		buf, err = AppendRestoreWord(buf[:0], name.Namespace, "/", name.Name)
	} else {
		buf, err = AppendRestoreWord(buf[:0], name.Namespace, "/", name.Name, ":", name.Port)
	}
	if err != nil {
		return portText{}, buf, err
	}
	t.word = t.inQuotes
	if string(buf) != t.inQuotes {
		t.word = string(buf)
	}
	return t, buf, nil
}

// checkPortText is CheckRestoreText of what appendPortText writes.
func checkPortText(name changetracker.ServicePortName) error {
	if name.Port == "" {
		return CheckRestoreText(name.Namespace, "/", name.Name)
	}
	return CheckRestoreText(name.Namespace, "/", name.Name, ":", name.Port)
}

// appendPortText appends name, as ServicePortName.String prints it,
// through AppendRestoreText.
func appendPortText(b []byte, name changetracker.ServicePortName) ([]byte, error) {
	if name.Port == "" {
		return AppendRestoreText(b, name.Namespace, "/", name.Name)
	}
	return AppendRestoreText(b, name.Namespace, "/", name.Name, ":", name.Port)
}

// appendComment appends ` -m comment --comment "PREFIXns/name:portSUFFIX"`;
// prefix and suffix are the writer's own text, which needs no escaping.
func appendComment(b []byte, prefix string, name *portText, suffix string) []byte {
	b = append(b, " -m comment --comment \""...)
	b = append(b, prefix...)
	b = append(b, name.inQuotes...)
	b = append(b, suffix...)
	return append(b, '"')
}

// appendPlainComment appends a comment holding the port's name alone,
// unquoted where the name allows it, as kube-proxy writes it.
func appendPlainComment(b []byte, name *portText) []byte {
	b = append(b, " -m comment --comment "...)
	return append(b, name.word...)
}

func appendEndpointComment(b []byte, name *portText, ep changetracker.Endpoint) []byte {
	b = append(b, " -m comment --comment \""...)
	b = append(b, name.inQuotes...)
	b = append(b, " -> "...)
	b = appendEndpoint(b, ep.IP(), ep.Port())
	return append(b, '"')
}

func appendProtocol(b []byte, proto string) []byte {
	b = append(b, " -m "...)
	b = append(b, proto...)
	b = append(b, " -p "...)
	return append(b, proto...)
}

func appendDestination(b []byte, ip netip.Addr, port int) []byte {
	b = append(b, " -d "...)
	b = ip.AppendTo(b)
	b = append(b, " --dport "...)
	return strconv.AppendInt(b, int64(port), 10)
}

// appendEndpoint appends "ip:port", with brackets around IPv6 addresses,
// as Endpoint.String does.
func appendEndpoint(b []byte, ip netip.Addr, port int) []byte {
	if ip.Is6() {
		b = append(b, '[')
		b = ip.AppendTo(b)
		b = append(b, ']')
	} else {
		b = ip.AppendTo(b)
	}
	b = append(b, ':')
	return strconv.AppendInt(b, int64(port), 10)
}

// appendPortName appends "ns/name:port" as ServicePortName.String does,
// raw: it is what chain names hash, and must never reach a payload (that
// is portText's job).
func appendPortName(b []byte, name changetracker.ServicePortName) []byte {
	b = append(b, name.Namespace...)
	b = append(b, '/')
	b = append(b, name.Name...)
	if name.Port != "" {
		b = append(b, ':')
		b = append(b, name.Port...)
	}
	return b
}
