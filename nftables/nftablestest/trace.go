package nftablestest

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// Packet is the first packet of a new connection.
type Packet struct {
	Src, Dst netip.Addr
	Protocol v1.Protocol // TCP, UDP or SCTP
	DstPort  int
	// Output is true for a packet a process on the node sends (it starts
	// at the output hook), false for one that arrives from outside the
	// node's network namespace, such as from a pod (prerouting).
	Output bool
	// InInterface is the name of the interface a packet from outside came
	// in through, for "iifname" matches; "" for none. A node's packet has
	// none until it comes back over loopback ("lo").
	InInterface string
}

// Verdict is the fate of a packet.
type Verdict string

const (
	// Accept: the packet goes on, to a local process or out of the node.
	Accept Verdict = "accept"
	// Drop: the packet is discarded silently.
	Drop Verdict = "drop"
	// Reject: the packet is discarded and the sender told so.
	Reject Verdict = "reject"
)

// Outcome is one way a packet can go: one per branch of every "numgen"
// the packet meets, in the order of the branches.
type Outcome struct {
	Verdict Verdict
	// DNAT is the destination the packet was rewritten to; the zero value
	// if it was not.
	DNAT netip.AddrPort
	// Masquerade is true when the packet leaves masqueraded (it reached
	// the postrouting hook with the masquerade mark and was masqueraded).
	Masquerade bool
	// Chains are the chains the packet went through, in order.
	Chains []string
	// Probability is how likely this outcome is: each "numgen random mod
	// N" the packet meets splits it evenly among its N values, as in the
	// kernel. The probabilities of all outcomes add up to 1.
	Probability float64
}

// Tracer follows packets through one table of a knftables.Fake.
type Tracer struct {
	fake   *knftables.Fake
	family knftables.Family
	table  string
	local  []netip.Addr
}

// NewTracer returns a tracer of table in fake. localAddrs are the node's
// own addresses, which "fib daddr type local" and "fib saddr type local"
// match (loopback addresses always do). The tracer reads fake's state at
// every Trace.
func NewTracer(fake *knftables.Fake, family knftables.Family, table string, localAddrs ...netip.Addr) *Tracer {
	return &Tracer{fake: fake, family: family, table: table, local: localAddrs}
}

// Trace follows p and returns its outcomes. Connection tracking is taken
// to say every packet is new, and every affinity set to be empty (the
// first packet of a client). It fails if the table does not exist, or on
// a rule, verdict or element it cannot interpret.
func (t *Tracer) Trace(p Packet) ([]Outcome, error) {
	t.fake.RLock()
	defer t.fake.RUnlock()
	tbl := t.fake.Tables[t.family][t.table]
	if tbl == nil {
		return nil, fmt.Errorf("no table %s %s", t.family, t.table)
	}
	proto := strings.ToLower(string(p.Protocol))
	switch proto {
	case "tcp", "udp", "sctp":
	default:
		return nil, fmt.Errorf("unknown protocol %q", p.Protocol)
	}
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.DstPort < 1 || p.DstPort > 65535 {
		return nil, fmt.Errorf("packet needs source and destination addresses and a port in 1..65535: %+v", p)
	}
	r := &run{t: t, tbl: tbl, proto: proto, src: p.Src, iif: p.InInterface}
	if p.Output {
		r.iif = ""
	}
	start := state{dst: p.Dst, dport: p.DstPort, prob: 1}
	// A node's packet starts at output and leaves through postrouting; if
	// its destination (after DNAT) is local, it comes back in over
	// loopback: prerouting, then input, where it ends. A packet from
	// outside starts at prerouting; the routing decision sends it to
	// input (local destination, where it ends) or through forward.
	var hooks []knftables.BaseChainHook
	if p.Output {
		hooks = []knftables.BaseChainHook{knftables.OutputHook, knftables.PostroutingHook, "loopback", knftables.InputHook}
	} else {
		hooks = []knftables.BaseChainHook{knftables.PreroutingHook, "route", knftables.PostroutingHook}
	}
	// ends holds one entry per branch, in the order of the branches: a
	// branch that a verdict stopped, or that left the node, stays in its
	// place while the others go through the next hooks.
	ends := []end{{state: start}}
	for _, hook := range hooks {
		var next []end
		for _, e := range ends {
			if e.verdict != vNone {
				next = append(next, e)
				continue
			}
			h, final, nat := hook, false, !e.looped
			switch hook {
			case "route":
				// The routing decision: to this node (input, where the
				// packet ends), or on (forward, then postrouting).
				h = knftables.ForwardHook
				if r.isLocal(e.dst) {
					h, final = knftables.InputHook, true
				}
			case "loopback":
				if !r.isLocal(e.dst) {
					// Sent to another host: it left the node.
					e.verdict = vAccept
					next = append(next, e)
					continue
				}
				h = knftables.PreroutingHook
			case knftables.InputHook:
				final = true
			}
			// On a node's packet back over loopback (looped) the kernel
			// runs no nat chain: the connection's NAT was set up on the
			// way out (nat-output's DNAT, nat-postrouting's SNAT). The
			// filter chains run, and conntrack still calls the packet
			// new.
			out, err := r.hook(h, e.state, nat)
			if err != nil {
				return nil, err
			}
			for _, x := range out {
				if x.verdict == vNone && final {
					x.verdict = vAccept
				}
				if h == knftables.PostroutingHook && p.Output {
					x.looped = true
				}
				next = append(next, x)
			}
		}
		ends = next
	}
	outs := make([]Outcome, 0, len(ends))
	for _, e := range ends {
		if e.verdict == vNone {
			e.verdict = vAccept
		}
		outs = append(outs, e.outcome())
	}
	return outs, nil
}

type verdictKind uint8

const (
	vNone     verdictKind = iota // fell off the end, or accepted by one base chain
	vContinue                    // a rule did not stop the chain
	vReturn
	vAccept
	vDrop
	vReject
)

type state struct {
	dst    netip.Addr
	dport  int
	mark   uint32
	dnat   netip.AddrPort
	masq   bool
	looped bool // the node's packet, back over loopback
	chains []string
	// prob is the branch's probability, from the numgens it met.
	prob float64
}

func (s state) with(chain string) state {
	s.chains = append(slices.Clip(s.chains), chain)
	return s
}

type end struct {
	state
	verdict verdictKind
}

func (e end) outcome() Outcome {
	v := Accept
	switch e.verdict {
	case vDrop:
		v = Drop
	case vReject:
		v = Reject
	}
	return Outcome{Verdict: v, DNAT: e.dnat, Masquerade: e.masq && v == Accept, Chains: e.chains, Probability: e.prob}
}

type run struct {
	t     *Tracer
	tbl   *knftables.FakeTable
	proto string
	src   netip.Addr
	iif   string // Packet.InInterface
	depth int
}

func (r *run) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(r.t.local, a)
}

// hook runs the table's base chains at hook in priority order, the nat
// chains among them only if nat is true. An accept ends one base chain,
// not the hook; a drop or reject ends the packet. Ends with vNone go on.
func (r *run) hook(hook knftables.BaseChainHook, st state, nat bool) ([]end, error) {
	type bc struct {
		name string
		prio int
	}
	var chains []bc
	for name, c := range r.tbl.Chains {
		if c.Hook == nil || *c.Hook != hook || (!nat && c.Type != nil && *c.Type == knftables.NATType) {
			continue
		}
		prio, err := priority(*c.Priority)
		if err != nil {
			return nil, fmt.Errorf("base chain %s: %w", name, err)
		}
		if c.Policy != nil && *c.Policy != knftables.AcceptPolicy {
			return nil, fmt.Errorf("base chain %s: policy %s is not interpreted", name, *c.Policy)
		}
		chains = append(chains, bc{name, prio})
	}
	slices.SortFunc(chains, func(a, b bc) int {
		if a.prio != b.prio {
			return a.prio - b.prio
		}
		return strings.Compare(a.name, b.name)
	})
	states := []end{{state: st}}
	for _, c := range chains {
		var next []end
		for _, e := range states {
			if e.verdict != vNone {
				next = append(next, e)
				continue
			}
			ends, err := r.chain(c.name, e.state)
			if err != nil {
				return nil, err
			}
			for _, x := range ends {
				if x.verdict == vAccept || x.verdict == vReturn {
					x.verdict = vNone
				}
				next = append(next, x)
			}
		}
		states = next
	}
	return states, nil
}

// priority evaluates a base chain priority: a number, or a standard name
// with an optional "+N" or "-N".
func priority(p knftables.BaseChainPriority) (int, error) {
	s := string(p)
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	names := map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}
	for name, v := range names {
		if rest, ok := strings.CutPrefix(s, name); ok {
			if rest == "" {
				return v, nil
			}
			if n, err := strconv.Atoi(rest); err == nil {
				return v + n, nil
			}
		}
	}
	return 0, fmt.Errorf("cannot evaluate priority %q", p)
}

// chain runs a chain: each end is vNone when the packet fell off its end
// or hit "return", or the verdict that stopped it.
func (r *run) chain(name string, st state) ([]end, error) {
	c := r.tbl.Chains[name]
	if c == nil {
		return nil, fmt.Errorf("no chain %q", name)
	}
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > 64 {
		return nil, fmt.Errorf("chain %s: jumps nest more than 64 deep", name)
	}
	st = st.with(name)
	live := []state{st}
	var ends []end
	for _, rule := range c.Rules {
		var next []state
		for _, s := range live {
			res, err := r.rule(rule, s)
			if err != nil {
				return nil, fmt.Errorf("chain %s, rule %q: %w", name, rule.Rule, err)
			}
			for _, e := range res {
				switch e.verdict {
				case vContinue:
					next = append(next, e.state)
				case vReturn:
					e.verdict = vNone
					ends = append(ends, e)
				default:
					ends = append(ends, e)
				}
			}
		}
		live = next
	}
	for _, s := range live {
		ends = append(ends, end{state: s, verdict: vNone})
	}
	return ends, nil
}
