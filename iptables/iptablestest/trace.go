package iptablestest

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
)

// Packet is the first packet of a new connection (or, with CTState, a later
// one), to follow through the Fake's rules with [Fake.Trace].
type Packet struct {
	// Protocol is "tcp", "udp", "sctp", "icmp" (or any name or number
	// "-p" takes).
	Protocol string
	// Source and Destination are the packet's addresses, of the Fake's
	// IP family.
	Source, Destination netip.Addr
	// SourcePort and DestinationPort are the ports, for TCP, UDP and SCTP.
	SourcePort, DestinationPort uint16
	// FromNode says the packet is sent by a process on the node (it starts
	// in the OUTPUT chains) rather than arriving from the network on
	// InInterface (it starts in PREROUTING).
	FromNode bool
	// InInterface is the interface an arriving packet came in on, matched
	// by -i (ignored with FromNode); OutInterface is the one it leaves by, matched by -o in the
	// FORWARD, OUTPUT and POSTROUTING chains. Empty means unknown: "-i X"
	// does not match and "! -i X" does. A packet from the node that is
	// delivered to the node itself comes in on "lo".
	InInterface, OutInterface string
	// NodeAddrs are the node's own addresses. An address is local (for
	// "-m addrtype --src-type/--dst-type LOCAL", and for routing: a local
	// destination goes to INPUT, any other is forwarded or sent out) if it
	// is one of these or a loopback address.
	NodeAddrs []netip.Addr
	// Mark is the packet's firewall mark before the first rule.
	Mark uint32
	// CTState is the connection's conntrack state: "NEW" (the default,
	// for ""), "ESTABLISHED", "RELATED", "INVALID" or "UNTRACKED". The nat
	// table only sees NEW connections, as in the kernel.
	CTState string
	// Recent says, for each recent list ("-m recent --name NAME"), whether
	// it holds the packet's address (and recently enough for --seconds,
	// often enough for --hitcount). With a nil map the trace follows both
	// possibilities and records which one each outcome assumed; with a
	// non-nil map, lists missing from it hold nothing.
	Recent map[string]bool
	// Sets says, for each ipset, whether the packet matches it in the
	// directions the rule names. With a nil map, a Fake made with
	// WithIPSetFake asks its ipsets at each match, and any other Fake
	// works as for Recent.
	Sets map[string]bool
}

// Verdict is how a traced packet's journey ended.
type Verdict string

const (
	// Accept: the packet got through every chain: it is delivered to the
	// node (Outcome.Local) or forwarded or sent out.
	Accept Verdict = "ACCEPT"
	// Drop: a DROP rule or a DROP policy discarded it.
	Drop Verdict = "DROP"
	// Reject: a REJECT rule discarded it and answered the sender.
	Reject Verdict = "REJECT"
)

// Outcome is one way a traced packet can end.
type Outcome struct {
	// Verdict is how it ended.
	Verdict Verdict
	// Local says an accepted packet is delivered to the node itself
	// (it went through INPUT).
	Local bool
	// Destination is where the packet is going when it ends: after DNAT,
	// the endpoint.
	Destination netip.Addr
	// DestinationPort is its destination port when it ends.
	DestinationPort uint16
	// DNAT says a DNAT rule rewrote the destination.
	DNAT bool
	// Source is the packet's source address when it ends, after any SNAT
	// rule.
	Source netip.Addr
	// SourcePort is its source port when it ends.
	SourcePort uint16
	// SNAT says an SNAT rule rewrote the source.
	SNAT bool
	// Masquerade says a MASQUERADE rule applies: the source becomes an
	// address of the outgoing interface, which the Fake does not know, so
	// Source is left as it was.
	Masquerade bool
	// Mark is the packet's mark when it ends.
	Mark uint32
	// RejectWith is the REJECT rule's --reject-with, for Reject.
	RejectWith string
	// Probability is how likely this outcome is, from the statistic
	// rules on its path, given the Assumed facts. The probabilities of
	// the outcomes that share the same Assumed facts add up to 1.
	Probability float64
	// Assumed lists the facts about the packet that the trace did not know
	// and assumed to reach this outcome: "recent:NAME" (the recent list
	// NAME holds the packet's address) and "set:NAME" (the packet matches
	// ipset NAME), each true or false. It is nil when nothing was assumed.
	Assumed map[string]bool
	// RecentSet lists the recent lists the packet's address was added to
	// (--set, --update), in order.
	RecentSet []string
	// Path lists the rules that matched and acted, in order, each as
	// "-t TABLE -A CHAIN RULE", and a DROP policy that ended the packet as
	// "-t TABLE -P CHAIN DROP".
	Path []string
}

// String summarises the outcome on one line, such as
// "ACCEPT to 10.0.0.1:8080 (DNAT) masquerade p=0.5 assuming recent:KUBE-SEP-X=false".
func (o Outcome) String() string {
	var b strings.Builder
	b.WriteString(string(o.Verdict))
	if o.Local {
		b.WriteString(" local")
	}
	fmt.Fprintf(&b, " to %s", netip.AddrPortFrom(o.Destination, o.DestinationPort))
	if o.DNAT {
		b.WriteString(" (DNAT)")
	}
	if o.SNAT {
		fmt.Fprintf(&b, " from %s (SNAT)", netip.AddrPortFrom(o.Source, o.SourcePort))
	}
	if o.Masquerade {
		b.WriteString(" masquerade")
	}
	if o.RejectWith != "" {
		fmt.Fprintf(&b, " with %s", o.RejectWith)
	}
	if o.Mark != 0 {
		fmt.Fprintf(&b, " mark=%#x", o.Mark)
	}
	fmt.Fprintf(&b, " p=%s", strconv.FormatFloat(o.Probability, 'g', 6, 64))
	if len(o.Assumed) > 0 {
		keys := make([]string, 0, len(o.Assumed))
		for k := range o.Assumed {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteString(" assuming")
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%t", k, o.Assumed[k])
		}
	}
	return b.String()
}

// maxBranches bounds a trace, whose branches multiply with every
// undecided match.
const maxBranches = 100000

// maxDepth bounds nested jumps.
const maxDepth = 128

// Trace follows p through the rules the Fake holds and returns every way
// its journey can end. It models the netfilter path of the first packet of
// a connection:
//
//   - a packet from the network goes through raw, mangle and nat
//     PREROUTING; then, if its destination (after DNAT) is local, through
//     mangle, filter and nat INPUT, else through mangle and filter FORWARD
//     and mangle and nat POSTROUTING;
//   - a packet from the node goes through raw, mangle, nat and filter
//     OUTPUT and mangle and nat POSTROUTING, then, if its destination is
//     local, through mangle and filter INPUT (on "lo");
//   - tables the Fake does not hold are skipped; nat chains are skipped
//     unless CTState is NEW;
//   - ACCEPT and the NAT targets end a table's chain for that hook; DROP,
//     REJECT and a DROP policy end the packet; RETURN, -j, -g, MARK and LOG
//     work as in the kernel.
//
// Matches are decided from p: addresses (-s, -d), interfaces (-i, -o, with
// "+" wildcards), protocol (-p), tcp/udp/sctp ports and TCP flags (the
// packet is a SYN when NEW, an ACK otherwise), multiport, addrtype (LOCAL
// from NodeAddrs and loopback; MULTICAST, BROADCAST for 255.255.255.255,
// UNSPEC; every other address is UNICAST), mark, conntrack and state (from
// CTState, plus DNAT and SNAT once the trace applied them), comment, and
// physdev (the packet is never bridged). A statistic --mode random rule
// splits the trace in two, weighted by its probability. recent matches are
// decided from p.Recent and set matches from p.Sets, or, when p.Sets is
// nil, from the Fake's ipsets (WithIPSetFake); the trace splits in two
// when nothing decides them. --set and --update add the address to the
// list for the rest of the path and --remove takes it out.
//
// It does not model: routing beyond "local or not" (no routes, no
// reverse-path filter), conntrack beyond the state given (no reply
// direction, no existing NAT bindings), the security table, SNAT/DNAT
// address or port ranges (an error), statistic --mode nth (an error),
// MASQUERADE's choice of address, counters, or timing (recent --seconds
// and --hitcount are taken as satisfied when the list holds the address).
// An error means the trace met something it cannot decide; it never
// changes the Fake.
func (f *Fake) Trace(p Packet) ([]Outcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tr := &tracer{f: f, p: &p, maxBranches: f.maxBranches}
	if err := tr.init(); err != nil {
		return nil, err
	}
	return tr.run()
}

// trace state of one branch.
type traceState struct {
	src, dst         netip.Addr
	sport, dport     uint16
	in, out          string
	mark             uint32
	dnat, snat, masq bool
	rejectWith       string
	prob             float64
	// lists is what the branch knows about recent lists (assumed or set
	// on the way); assumed is the part it assumed.
	lists, assumed map[string]bool
	recentSet      []string
	path           *pathStep
}

type pathStep struct {
	text string
	prev *pathStep
}

func (s *traceState) step(text string) {
	s.path = &pathStep{text: text, prev: s.path}
}

// know returns a copy of s whose list knowledge includes key=v; assume
// also records it as an assumption.
func (s traceState) know(key string, v, assume bool) traceState {
	s.lists = withKey(s.lists, key, v)
	if assume {
		s.assumed = withKey(s.assumed, key, v)
	}
	return s
}

func withKey(m map[string]bool, key string, v bool) map[string]bool {
	n := make(map[string]bool, len(m)+1)
	for k, x := range m {
		n[k] = x
	}
	n[key] = v
	return n
}

type endKind int

const (
	endReturn endKind = iota
	endAccept
	endDrop
	endReject
)

type end struct {
	s   traceState
	how endKind
}

type tracer struct {
	f      *Fake
	p      *Packet
	proto  int
	states uint8
	// count counts branches, up to maxBranches.
	count, maxBranches int
}

func (tr *tracer) init() error {
	p := tr.p
	want4 := tr.f.family == v1.IPv4Protocol
	if !p.Source.IsValid() || !p.Destination.IsValid() || p.Source.Is4() != want4 || p.Destination.Is4() != want4 {
		return fmt.Errorf("trace: source %s and destination %s must be %s addresses", p.Source, p.Destination, tr.f.family)
	}
	n, err := parseProto(p.Protocol)
	if err != nil || n == 0 {
		return fmt.Errorf("trace: unknown protocol %q", p.Protocol)
	}
	tr.proto = n
	state := p.CTState
	if state == "" {
		state = "NEW"
	}
	// The states a connection can be in; SNAT and DNAT are added by the
	// trace.
	i := slices.IndexFunc(ctStates[:5], func(s string) bool { return strings.EqualFold(s, state) })
	if i < 0 {
		return fmt.Errorf("trace: unknown conntrack state %q", p.CTState)
	}
	tr.states = 1 << i
	return nil
}

type hook struct {
	table iptables.Table
	chain iptables.Chain
}

var (
	preroutingHooks = []hook{{iptables.TableRaw, iptables.ChainPrerouting}, {iptables.TableMangle, iptables.ChainPrerouting}, {iptables.TableNAT, iptables.ChainPrerouting}}
	inputHooks      = []hook{{iptables.TableMangle, iptables.ChainInput}, {iptables.TableFilter, iptables.ChainInput}, {iptables.TableNAT, iptables.ChainInput}}
	loopbackHooks   = []hook{{iptables.TableMangle, iptables.ChainInput}, {iptables.TableFilter, iptables.ChainInput}}
	forwardHooks    = []hook{{iptables.TableMangle, iptables.ChainForward}, {iptables.TableFilter, iptables.ChainForward}}
	outputHooks     = []hook{{iptables.TableRaw, iptables.ChainOutput}, {iptables.TableMangle, iptables.ChainOutput}, {iptables.TableNAT, iptables.ChainOutput}, {iptables.TableFilter, iptables.ChainOutput}}
	postHooks       = []hook{{iptables.TableMangle, iptables.ChainPostrouting}, {iptables.TableNAT, iptables.ChainPostrouting}}
)

// item is a branch of the trace between hooks: still travelling (verdict
// "") or ended.
type item struct {
	s       traceState
	verdict Verdict
	local   bool
}

func (tr *tracer) run() ([]Outcome, error) {
	p := tr.p
	start := traceState{src: p.Source, dst: p.Destination, sport: p.SourcePort, dport: p.DestinationPort,
		in: p.InInterface, out: p.OutInterface, mark: p.Mark, prob: 1}
	if p.FromNode {
		// A packet made on the node has no input interface until it
		// loops back.
		start.in = ""
	}
	items := []item{{s: start}}
	var err error
	// stage runs the hooks on the travelling items whose locality is
	// local, keeping the order of the branches.
	stage := func(hooks []hook, local bool) {
		for _, h := range hooks {
			if err != nil {
				return
			}
			var next []item
			for _, it := range items {
				if it.verdict != "" || it.local != local {
					next = append(next, it)
					continue
				}
				var ends []end
				if ends, err = tr.hook(h, it.s); err != nil {
					return
				}
				for _, e := range ends {
					switch e.how {
					case endAccept:
						next = append(next, item{s: e.s, local: local})
					case endDrop:
						next = append(next, item{s: e.s, verdict: Drop, local: local})
					case endReject:
						next = append(next, item{s: e.s, verdict: Reject, local: local})
					}
				}
			}
			items = next
		}
	}
	// route sends the travelling items to a local destination to INPUT.
	route := func(fromNode bool) {
		for i := range items {
			if items[i].verdict == "" && tr.isLocal(items[i].s.dst) {
				items[i].local = true
				if fromNode {
					items[i].s.in = "lo"
				}
			}
		}
	}
	if !p.FromNode {
		stage(preroutingHooks, false)
		route(false)
		stage(inputHooks, true)
		stage(forwardHooks, false)
		stage(postHooks, false)
	} else {
		stage(outputHooks, false)
		stage(postHooks, false)
		route(true)
		stage(loopbackHooks, true)
	}
	if err != nil {
		return nil, err
	}
	outcomes := make([]Outcome, 0, len(items))
	for _, it := range items {
		v := it.verdict
		if v == "" {
			v = Accept
		}
		outcomes = append(outcomes, tr.outcome(it.s, v, it.local))
	}
	return outcomes, nil
}

func (tr *tracer) outcome(s traceState, v Verdict, local bool) Outcome {
	o := Outcome{Verdict: v, Local: local, Destination: s.dst, DestinationPort: s.dport, DNAT: s.dnat,
		Source: s.src, SourcePort: s.sport, SNAT: s.snat, Masquerade: s.masq, Mark: s.mark,
		RejectWith: s.rejectWith, Probability: s.prob, Assumed: s.assumed, RecentSet: s.recentSet}
	for st := s.path; st != nil; st = st.prev {
		o.Path = append(o.Path, st.text)
	}
	slices.Reverse(o.Path)
	return o
}

// hook runs the built-in chain of one hook; a chain that ends without a
// verdict gets its policy.
func (tr *tracer) hook(h hook, s traceState) ([]end, error) {
	t := tr.f.tables[h.table]
	if t == nil || (h.table == iptables.TableNAT && tr.states != ctNew) {
		return []end{{s: s, how: endAccept}}, nil
	}
	c := t.chains[h.chain]
	ends, err := tr.chain(t, c, 0, s, 0)
	if err != nil {
		return nil, err
	}
	for i := range ends {
		if ends[i].how == endReturn {
			ends[i].how = endAccept
			if c.policy == "DROP" {
				ends[i].how = endDrop
				ends[i].s.step(fmt.Sprintf("-t %s -P %s DROP", h.table, h.chain))
			}
		}
	}
	return ends, nil
}

// chain evaluates chain c of table t from rule i on for s, and returns
// every way this call of c can end.
func (tr *tracer) chain(t *table, c *chain, i int, s traceState, depth int) ([]end, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("trace: jumps nested deeper than %d at chain %s", maxDepth, c.name)
	}
	for ; i < len(c.rules); i++ {
		r := c.rules[i]
		alts, err := tr.match(r, s)
		if err != nil {
			return nil, fmt.Errorf("trace: -t %s -A %s %s: %w", t.name, c.name, r.text, err)
		}
		if len(alts) == 1 && !alts[0].matched {
			s = alts[0].s
			continue
		}
		if tr.count += len(alts); tr.count > tr.maxBranches {
			return nil, fmt.Errorf("trace: more than %d branches", tr.maxBranches)
		}
		var ends []end
		for _, a := range alts {
			var e []end
			if a.matched {
				e, err = tr.act(t, c, i, a.s, depth)
			} else {
				e, err = tr.chain(t, c, i+1, a.s, depth)
			}
			if err != nil {
				return nil, err
			}
			ends = append(ends, e...)
		}
		return ends, nil
	}
	return []end{{s: s, how: endReturn}}, nil
}

// act takes the target of rule i of c, which matched s, and goes on from
// there.
func (tr *tracer) act(t *table, c *chain, i int, s traceState, depth int) ([]end, error) {
	r := c.rules[i]
	s.step("-t " + string(t.name) + " -A " + string(c.name) + " " + r.text)
	tg := &r.target
	switch tg.kind {
	case targetNone, targetLog:
		return tr.chain(t, c, i+1, s, depth)
	case targetMark:
		s.mark = tg.applyMark(s.mark)
		return tr.chain(t, c, i+1, s, depth)
	case targetAccept:
		return []end{{s: s, how: endAccept}}, nil
	case targetDrop:
		return []end{{s: s, how: endDrop}}, nil
	case targetReject:
		s.rejectWith = tg.rejectWith
		return []end{{s: s, how: endReject}}, nil
	case targetReturn:
		return []end{{s: s, how: endReturn}}, nil
	case targetDNAT, targetSNAT:
		spec := tg.nat
		if spec.minAddr != spec.maxAddr || spec.ports.lo != spec.ports.hi {
			return nil, fmt.Errorf("trace: -A %s %s: address and port ranges are not modelled", c.name, r.text)
		}
		if tg.kind == targetDNAT {
			s.dst, s.dnat = spec.minAddr, true
			if spec.ports.set {
				s.dport = spec.ports.lo
			}
		} else {
			s.src, s.snat = spec.minAddr, true
			if spec.ports.set {
				s.sport = spec.ports.lo
			}
		}
		return []end{{s: s, how: endAccept}}, nil
	case targetMasquerade:
		s.masq = true
		return []end{{s: s, how: endAccept}}, nil
	case targetJump, targetGoto:
		sub, err := tr.chain(t, t.chains[tg.chain], 0, s, depth+1)
		if err != nil || tg.kind == targetGoto {
			return sub, err
		}
		var ends []end
		for _, e := range sub {
			if e.how != endReturn {
				ends = append(ends, e)
				continue
			}
			more, err := tr.chain(t, c, i+1, e.s, depth)
			if err != nil {
				return nil, err
			}
			ends = append(ends, more...)
		}
		return ends, nil
	}
	return nil, fmt.Errorf("trace: -A %s %s: target not modelled", c.name, r.text)
}

// alt is one way a rule's matches can turn out.
type alt struct {
	s       traceState
	matched bool
}

// match decides whether r matches s. A statistic, recent or set match
// that cannot be decided gives two alternatives.
func (tr *tracer) match(r *rule, s traceState) ([]alt, error) {
	if !tr.matchBasic(r, &s) {
		return []alt{{s: s}}, nil
	}
	alts := []alt{{s: s, matched: true}}
	for _, m := range r.matches {
		var next []alt
		for _, a := range alts {
			if !a.matched {
				next = append(next, a)
				continue
			}
			res, err := tr.matchOne(m, a.s)
			if err != nil {
				return nil, err
			}
			next = append(next, res...)
		}
		alts = next
	}
	return alts, nil
}

func (tr *tracer) matchBasic(r *rule, s *traceState) bool {
	if r.src.set && r.src.prefix.Contains(s.src) == r.src.neg {
		return false
	}
	if r.dst.set && r.dst.prefix.Contains(s.dst) == r.dst.neg {
		return false
	}
	if r.in.set && ifaceMatches(r.in.name, s.in) == r.in.neg {
		return false
	}
	if r.out.set && ifaceMatches(r.out.name, s.out) == r.out.neg {
		return false
	}
	if r.proto.set && r.proto.num != 0 && (r.proto.num == tr.proto) == r.proto.neg {
		return false
	}
	return true
}

func ifaceMatches(pattern, name string) bool {
	if name == "" {
		return false
	}
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(name, p)
	}
	return pattern == name
}

// one returns a single alternative: s matched or not.
func one(s traceState, matched bool) []alt { return []alt{{s: s, matched: matched}} }

func (tr *tracer) matchOne(m match, s traceState) ([]alt, error) {
	switch m := m.(type) {
	case *portMatch:
		ok := (!m.sport.set || m.sport.contains(s.sport) != m.sport.neg) &&
			(!m.dport.set || m.dport.contains(s.dport) != m.dport.neg)
		if m.flags.set {
			flags := uint8(0x10) // ACK
			if tr.states == ctNew {
				flags = 0x02 // SYN
			}
			ok = ok && ((flags&m.flags.mask == m.flags.comp) != m.flags.neg)
		}
		return one(s, ok), nil
	case *multiportMatch:
		hit := false
		for _, r := range m.ports {
			if (m.flag != "--sports" && r.contains(s.dport)) || (m.flag != "--dports" && r.contains(s.sport)) {
				hit = true
			}
		}
		return one(s, hit != m.neg), nil
	case *commentMatch, *nfacctMatch:
		return one(s, true), nil
	case *markMatch:
		return one(s, (s.mark&m.mask == m.value) != m.neg), nil
	case *addrtypeMatch:
		ok := (!m.src.set || (tr.addrType(s.src)&m.src.mask != 0) != m.src.neg) &&
			(!m.dst.set || (tr.addrType(s.dst)&m.dst.mask != 0) != m.dst.neg)
		return one(s, ok), nil
	case *stateMatch:
		states := tr.states
		if s.dnat {
			states |= ctDNAT
		}
		if s.snat || s.masq {
			states |= ctSNAT
		}
		return one(s, (states&m.states != 0) != m.neg), nil
	case *physdevMatch:
		ok := (!m.in.set || m.in.neg) && (!m.out.set || m.out.neg) &&
			(!m.isIn.set || m.isIn.neg) && (!m.isOut.set || m.isOut.neg) && (!m.isBridged.set || m.isBridged.neg)
		return one(s, ok), nil
	case *statisticMatch:
		if m.mode != "random" {
			return nil, fmt.Errorf("statistic --mode %s is not modelled", m.mode)
		}
		p := float64(m.probability) / 0x80000000
		if m.neg {
			p = 1 - p
		}
		switch {
		case p >= 1:
			return one(s, true), nil
		case p <= 0:
			return one(s, false), nil
		}
		yes, no := s, s
		yes.prob *= p
		no.prob *= 1 - p
		return []alt{{s: yes, matched: true}, {s: no}}, nil
	case *recentMatch:
		return tr.matchRecent(m, s), nil
	case *setMatch:
		key := "set:" + m.name
		if v, ok := s.lists[key]; ok {
			return one(s, v != m.neg), nil
		}
		if tr.p.Sets != nil {
			return one(s, tr.p.Sets[m.name] != m.neg), nil
		}
		if tr.f.sets != nil {
			matched, err := tr.matchSet(m, s)
			return one(s, matched != m.neg), err
		}
		return []alt{{s: s.know(key, true, true), matched: !m.neg}, {s: s.know(key, false, true), matched: m.neg}}, nil
	}
	return nil, fmt.Errorf("match %T is not modelled", m)
}

// matchSet asks the Fake's ipsets whether the packet, as it is in s,
// matches m's set in m's directions. A set that is gone since the rule was
// made is an error, as iptables refuses a rule naming a missing set.
func (tr *tracer) matchSet(m *setMatch, s traceState) (bool, error) {
	var dims []netip.AddrPort
	for d := range strings.SplitSeq(m.dirs, ",") {
		if d == "src" {
			dims = append(dims, netip.AddrPortFrom(s.src, s.sport))
		} else {
			dims = append(dims, netip.AddrPortFrom(s.dst, s.dport))
		}
	}
	var proto v1.Protocol
	switch tr.proto {
	case 6:
		proto = v1.ProtocolTCP
	case 17:
		proto = v1.ProtocolUDP
	case 132:
		proto = v1.ProtocolSCTP
	}
	if !tr.f.sets.HasSet(m.name) {
		return false, fmt.Errorf("trace: rule%s: Set %s doesn't exist", m.save(nil), m.name)
	}
	matched, err := tr.f.sets.MatchPacket(m.name, proto, dims)
	if err != nil {
		return false, fmt.Errorf("trace: rule%s: %w", m.save(nil), err)
	}
	return matched, nil
}

func (tr *tracer) matchRecent(m *recentMatch, s traceState) []alt {
	key := "recent:" + m.name
	// decide continues with the list's content known to be v.
	decide := func(s traceState, v bool) alt {
		switch m.cmd {
		case "--set":
			s = s.know(key, true, false)
			s.recentSet = append(append([]string(nil), s.recentSet...), m.name)
			return alt{s: s, matched: !m.neg}
		case "--remove":
			if v {
				s = s.know(key, false, false)
			}
		case "--update":
			if v {
				s.recentSet = append(append([]string(nil), s.recentSet...), m.name)
			}
		}
		return alt{s: s, matched: v != m.neg}
	}
	if m.cmd == "--set" {
		return []alt{decide(s, true)}
	}
	if v, ok := s.lists[key]; ok {
		return []alt{decide(s, v)}
	}
	if tr.p.Recent != nil {
		return []alt{decide(s, tr.p.Recent[m.name])}
	}
	return []alt{decide(s.know(key, true, true), true), decide(s.know(key, false, true), false)}
}

func (tr *tracer) isLocal(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	for _, n := range tr.p.NodeAddrs {
		if n == a {
			return true
		}
	}
	return false
}

// addrType returns the addrtype bit of a.
func (tr *tracer) addrType(a netip.Addr) uint16 {
	switch {
	case tr.isLocal(a):
		return addrTypeLocal
	case a.IsUnspecified():
		return 1 // UNSPEC
	case a.IsMulticast():
		return addrTypeMulticast
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return addrTypeBroadcast
	}
	return addrTypeUnicast
}
