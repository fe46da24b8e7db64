package nftablestest

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// parser walks the words of one rule.
type parser struct {
	toks []string
	i    int
}

func (p *parser) done() bool   { return p.i >= len(p.toks) }
func (p *parser) peek() string { return p.at(p.i) }
func (p *parser) at(i int) string {
	if i < len(p.toks) {
		return p.toks[i]
	}
	return ""
}

func (p *parser) next() (string, error) {
	if p.done() {
		return "", fmt.Errorf("rule ends early")
	}
	p.i++
	return p.toks[p.i-1], nil
}

func (p *parser) expect(words ...string) error {
	for _, w := range words {
		got, err := p.next()
		if err != nil {
			return fmt.Errorf("expected %q: %w", w, err)
		}
		if got != w {
			return fmt.Errorf("expected %q, found %q", w, got)
		}
	}
	return nil
}

// ref reads a set or map reference, "@name" or "@ name".
func (p *parser) ref() (string, error) {
	tok, err := p.next()
	if err != nil {
		return "", err
	}
	if tok == "@" {
		return p.next()
	}
	if name, ok := strings.CutPrefix(tok, "@"); ok && name != "" {
		return name, nil
	}
	return "", fmt.Errorf("expected a set reference, found %q", tok)
}

// list reads "{ a , b , ... }" and returns the items; an item may be
// several words ("0 : goto chain").
func (p *parser) list() ([][]string, error) {
	if err := p.expect("{"); err != nil {
		return nil, err
	}
	var items [][]string
	var cur []string
	for {
		tok, err := p.next()
		if err != nil {
			return nil, fmt.Errorf("unterminated { }: %w", err)
		}
		switch tok {
		case "}":
			if len(cur) > 0 {
				items = append(items, cur)
			}
			return items, nil
		case ",":
			items = append(items, cur)
			cur = nil
		default:
			for _, part := range strings.Split(tok, ",") {
				if part == "" {
					items = append(items, cur)
					cur = nil
					continue
				}
				cur = append(cur, part)
			}
		}
	}
}

// rule evaluates one rule for st.
func (r *run) rule(rule *knftables.Rule, st state) ([]end, error) {
	p := &parser{toks: strings.Fields(rule.Rule)}
	noMatch := []end{{state: st, verdict: vContinue}}
	for !p.done() {
		tok, _ := p.next()
		switch tok {
		case "ct":
			what, err := p.next()
			if err != nil {
				return nil, err
			}
			switch what {
			case "state":
				// Every traced packet is the first of its connection.
				if err := p.expect("new"); err != nil {
					return nil, err
				}
			case "status":
				// The only status the tracer knows: whether a NAT rule
				// rewrote the destination.
				if err := p.expect("dnat"); err != nil {
					return nil, err
				}
				if !st.dnat.IsValid() {
					return noMatch, nil
				}
			default:
				return nil, fmt.Errorf("unknown ct expression %q", what)
			}
		case "ip", "ip6":
			if (tok == "ip") != (r.t.family == knftables.IPv4Family) {
				return nil, fmt.Errorf("%q match in a %s table", tok, r.t.family)
			}
			if p.at(p.i+1) == "." {
				p.i--
				return r.concatMatch(p, st)
			}
			field, err := p.next()
			if err != nil {
				return nil, err
			}
			var addr netip.Addr
			switch field {
			case "daddr":
				addr = st.dst
			case "saddr":
				addr = r.src
			default:
				return nil, fmt.Errorf("unknown field %s %s", tok, field)
			}
			neg := p.peek() == "!="
			if neg {
				p.i++
			}
			var ok bool
			switch {
			case strings.HasPrefix(p.peek(), "@"):
				name, err := p.ref()
				if err != nil {
					return nil, err
				}
				if ok, err = r.inSet(name, addr); err != nil {
					return nil, err
				}
			case p.peek() == "{":
				items, err := p.list()
				if err != nil {
					return nil, err
				}
				for _, it := range items {
					m, err := matchAddr(strings.Join(it, " "), addr)
					if err != nil {
						return nil, err
					}
					ok = ok || m
				}
			default:
				v, err := p.next()
				if err != nil {
					return nil, err
				}
				if ok, err = matchAddr(v, addr); err != nil {
					return nil, err
				}
			}
			if ok == neg {
				return noMatch, nil
			}
		case "meta":
			if err := p.expect("l4proto"); err != nil {
				return nil, err
			}
			if p.peek() == "." {
				p.i -= 2
				return r.concatMatch(p, st)
			}
			v, err := p.next()
			if err != nil {
				return nil, err
			}
			if v != r.proto {
				return noMatch, nil
			}
		case "tcp", "udp", "sctp":
			if err := p.expect("dport"); err != nil {
				return nil, err
			}
			v, err := p.next()
			if err != nil {
				return nil, err
			}
			if tok != r.proto || v != strconv.Itoa(st.dport) {
				return noMatch, nil
			}
		case "iifname":
			// The kernel compares the name with "" when the packet came
			// in through no interface, so "!=" matches a node's packet.
			neg := p.peek() == "!="
			if neg {
				p.i++
			}
			v, err := p.next()
			if err != nil {
				return nil, err
			}
			iif := r.iif
			if st.looped {
				iif = "lo"
			}
			name := strings.Trim(v, `"`)
			ok := iif == name
			if prefix, wild := strings.CutSuffix(name, "*"); wild {
				ok = strings.HasPrefix(iif, prefix)
			}
			if ok == neg {
				return noMatch, nil
			}
		case "fib":
			field, err := p.next()
			if err != nil {
				return nil, err
			}
			if err := p.expect("type", "local"); err != nil {
				return nil, err
			}
			addr := st.dst
			switch field {
			case "daddr":
			case "saddr":
				addr = r.src
			default:
				return nil, fmt.Errorf("unknown fib field %q", field)
			}
			if !r.isLocal(addr) {
				return noMatch, nil
			}
		case "mark":
			next, err := p.next()
			if err != nil {
				return nil, err
			}
			switch next {
			case "and":
				mask, err := p.number()
				if err != nil {
					return nil, err
				}
				// kube-proxy's masquerading chain tests "!= 0" since
				// v1.33; proxykit's, "== 0" then returns.
				op, err := p.next()
				if err != nil {
					return nil, err
				}
				if op != "==" && op != "!=" {
					return nil, fmt.Errorf("unknown mark comparison %q", op)
				}
				want, err := p.number()
				if err != nil {
					return nil, err
				}
				if (st.mark&mask == want) != (op == "==") {
					return noMatch, nil
				}
			case "set":
				if err := p.expect("mark"); err != nil {
					return nil, err
				}
				opr, err := p.next()
				if err != nil {
					return nil, err
				}
				v, err := p.number()
				if err != nil {
					return nil, err
				}
				switch opr {
				case "or":
					st.mark |= v
				case "xor":
					st.mark ^= v
				default:
					return nil, fmt.Errorf("unknown mark operation %q", opr)
				}
			default:
				return nil, fmt.Errorf("unknown mark expression %q", next)
			}
		case "update":
			name, err := p.ref()
			if err != nil {
				return nil, err
			}
			if r.tbl.Sets[name] == nil {
				return nil, fmt.Errorf("no set %q", name)
			}
			ipX := "ip"
			if r.t.family == knftables.IPv6Family {
				ipX = "ip6"
			}
			// The tracer does not record affinity: every packet is a
			// client's first.
			if err := p.expect("{", ipX, "saddr", "}"); err != nil {
				return nil, err
			}
		case "masquerade":
			if p.peek() == "fully-random" {
				p.i++
			}
			st.masq = true
			return r.terminal(p, end{state: st, verdict: vAccept})
		case "dnat":
			if p.peek() == "ip" || p.peek() == "ip6" {
				return r.dnatMap(p, st)
			}
			if err := p.expect("to"); err != nil {
				return nil, err
			}
			v, err := p.next()
			if err != nil {
				return nil, err
			}
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				return nil, fmt.Errorf("dnat destination %q: %w", v, err)
			}
			st.dst, st.dport, st.dnat = ap.Addr(), int(ap.Port()), ap
			return r.terminal(p, end{state: st, verdict: vAccept})
		case "numgen":
			if err := p.expect("random", "mod"); err != nil {
				return nil, err
			}
			n, err := p.number()
			if err != nil {
				return nil, err
			}
			if err := p.expect("vmap"); err != nil {
				return nil, err
			}
			items, err := p.list()
			if err != nil {
				return nil, err
			}
			if !p.done() {
				return nil, fmt.Errorf("words after the verdict map: %q", p.toks[p.i:])
			}
			verdicts := make([]string, n)
			for _, it := range items {
				if len(it) < 3 || it[1] != ":" {
					return nil, fmt.Errorf("numgen map element %q is not \"N : verdict\"", it)
				}
				k, err := strconv.Atoi(it[0])
				if err != nil || k < 0 || k >= int(n) {
					return nil, fmt.Errorf("numgen map key %q is not in 0..%d", it[0], n-1)
				}
				verdicts[k] = strings.Join(it[2:], " ")
			}
			var ends []end
			branch := st
			branch.prob /= float64(n)
			for k, v := range verdicts {
				if v == "" {
					return nil, fmt.Errorf("numgen value %d has no verdict", k)
				}
				e, err := r.verdict(v, branch)
				if err != nil {
					return nil, err
				}
				ends = append(ends, e...)
			}
			return ends, nil
		case "jump", "goto", "return", "accept", "drop", "reject":
			v := tok
			if tok == "jump" || tok == "goto" {
				target, err := p.next()
				if err != nil {
					return nil, err
				}
				v += " " + target
			}
			if !p.done() {
				return nil, fmt.Errorf("words after the verdict: %q", p.toks[p.i:])
			}
			return r.verdict(v, st)
		default:
			return nil, fmt.Errorf("cannot interpret %q", tok)
		}
	}
	// Every match held; st carries what the statements changed.
	return []end{{state: st, verdict: vContinue}}, nil
}

func (r *run) terminal(p *parser, e end) ([]end, error) {
	if !p.done() {
		return nil, fmt.Errorf("words after a terminal statement: %q", p.toks[p.i:])
	}
	return []end{e}, nil
}

func (p *parser) number() (uint32, error) {
	tok, err := p.next()
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(tok, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", tok)
	}
	return uint32(v), nil
}

// verdict applies a verdict: one of a rule's, or a map element's value.
func (r *run) verdict(v string, st state) ([]end, error) {
	words := strings.Fields(v)
	if len(words) == 0 {
		return nil, fmt.Errorf("empty verdict")
	}
	switch words[0] {
	case "accept", "drop", "reject", "return":
		if len(words) != 1 {
			return nil, fmt.Errorf("verdict %q", v)
		}
		k := map[string]verdictKind{"accept": vAccept, "drop": vDrop, "reject": vReject, "return": vReturn}[words[0]]
		return []end{{state: st, verdict: k}}, nil
	case "jump", "goto":
		if len(words) != 2 {
			return nil, fmt.Errorf("verdict %q", v)
		}
		ends, err := r.chain(words[1], st)
		if err != nil {
			return nil, err
		}
		for i := range ends {
			if ends[i].verdict == vNone {
				// After a jump the calling chain goes on; after a goto it
				// returns.
				if words[0] == "jump" {
					ends[i].verdict = vContinue
				} else {
					ends[i].verdict = vReturn
				}
			}
		}
		return ends, nil
	}
	return nil, fmt.Errorf("cannot interpret verdict %q", v)
}

// vmapLookup applies the element of map name for key, or goes on with
// the next rule if there is none. The lookup must end the rule.
func (r *run) vmapLookup(p *parser, name string, key []string, st state) ([]end, error) {
	if !p.done() {
		return nil, fmt.Errorf("words after the verdict map: %q", p.toks[p.i:])
	}
	m := r.tbl.Maps[name]
	if m == nil {
		return nil, fmt.Errorf("no map %q", name)
	}
	e := m.FindElement(key...)
	if e == nil {
		return []end{{state: st, verdict: vContinue}}, nil
	}
	if len(e.Value) != 1 {
		return nil, fmt.Errorf("map %s element %q has value %q", name, key, e.Value)
	}
	return r.verdict(e.Value[0], st)
}

// concat reads a concatenation, "expr . expr ...", of ip/ip6 daddr or
// saddr, meta l4proto, th dport, tcp/udp/sctp dport and numgen random mod
// N, and returns the keys it can take: one per numgen value. ok is false
// when a "tcp dport" (or udp, sctp) is of another protocol than the
// packet's, which nft makes a mismatch of the whole rule.
func (r *run) concat(p *parser, st state) (keys [][]string, ok bool, err error) {
	keys = [][]string{nil}
	ok = true
	for {
		tok, err := p.next()
		if err != nil {
			return nil, false, err
		}
		var vals []string
		switch tok {
		case "ip", "ip6":
			if (tok == "ip") != (r.t.family == knftables.IPv4Family) {
				return nil, false, fmt.Errorf("%q match in a %s table", tok, r.t.family)
			}
			field, err := p.next()
			if err != nil {
				return nil, false, err
			}
			switch field {
			case "daddr":
				vals = []string{st.dst.String()}
			case "saddr":
				vals = []string{r.src.String()}
			default:
				return nil, false, fmt.Errorf("unknown field %s %s", tok, field)
			}
		case "meta":
			if err := p.expect("l4proto"); err != nil {
				return nil, false, err
			}
			vals = []string{r.proto}
		case "th", "tcp", "udp", "sctp":
			if err := p.expect("dport"); err != nil {
				return nil, false, err
			}
			if tok != "th" && tok != r.proto {
				ok = false
			}
			vals = []string{strconv.Itoa(st.dport)}
		case "numgen":
			if err := p.expect("random", "mod"); err != nil {
				return nil, false, err
			}
			n, err := p.number()
			if err != nil {
				return nil, false, err
			}
			if n == 0 || n > 1<<16 {
				return nil, false, fmt.Errorf("numgen modulus %d", n)
			}
			for k := range n {
				vals = append(vals, strconv.Itoa(int(k)))
			}
		default:
			return nil, false, fmt.Errorf("cannot interpret %q in a concatenation", tok)
		}
		next := make([][]string, 0, len(keys)*len(vals))
		for _, k := range keys {
			for _, v := range vals {
				next = append(next, append(slices.Clip(k), v))
			}
		}
		keys = next
		if p.peek() != "." {
			return keys, ok, nil
		}
		p.i++
	}
}

// concatMatch evaluates a rule that starts with a concatenation (or a
// single expression before one): "KEY vmap @map" or "KEY [!=] @set
// REST", REST being the remainder of the rule.
func (r *run) concatMatch(p *parser, st state) ([]end, error) {
	keys, ok, err := r.concat(p, st)
	if err != nil {
		return nil, err
	}
	noMatch := []end{{state: st, verdict: vContinue}}
	if p.peek() == "vmap" {
		p.i++
		name, err := p.ref()
		if err != nil {
			return nil, err
		}
		if !p.done() {
			return nil, fmt.Errorf("words after the verdict map: %q", p.toks[p.i:])
		}
		if !ok {
			return noMatch, nil
		}
		var ends []end
		// One key per numgen value: each as likely.
		branch := st
		branch.prob /= float64(len(keys))
		for _, k := range keys {
			e, err := r.vmapLookup(p, name, k, branch)
			if err != nil {
				return nil, err
			}
			ends = append(ends, e...)
		}
		return ends, nil
	}
	neg := p.peek() == "!="
	if neg {
		p.i++
	}
	if !strings.HasPrefix(p.peek(), "@") {
		return nil, fmt.Errorf("a concatenation is compared only with a set or a verdict map, not %q", p.peek())
	}
	name, err := p.ref()
	if err != nil {
		return nil, err
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("numgen in a set match")
	}
	in, err := r.inSetKey(name, keys[0])
	if err != nil {
		return nil, err
	}
	if !ok || in == neg {
		return noMatch, nil
	}
	// The rest of the rule, as its own rule.
	rest := &knftables.Rule{Rule: strings.Join(p.toks[p.i:], " ")}
	if rest.Rule == "" {
		return []end{{state: st, verdict: vContinue}}, nil
	}
	return r.rule(rest, st)
}

// dnatMap evaluates "dnat ip to KEY map @map": the destination is the
// element of map for KEY, an address and a port; a key without an
// element makes the rule not match, as in the kernel.
func (r *run) dnatMap(p *parser, st state) ([]end, error) {
	ipX, _ := p.next()
	if (ipX == "ip") != (r.t.family == knftables.IPv4Family) {
		return nil, fmt.Errorf("dnat %s in a %s table", ipX, r.t.family)
	}
	if p.peek() == "addr" {
		// kube-proxy writes "addr . port to"; nft lists it as "to".
		if err := p.expect("addr", ".", "port"); err != nil {
			return nil, err
		}
	}
	if err := p.expect("to"); err != nil {
		return nil, err
	}
	if p.peek() == "numgen" {
		return r.dnatNumgen(p, st)
	}
	keys, ok, err := r.concat(p, st)
	if err != nil {
		return nil, err
	}
	if err := p.expect("map"); err != nil {
		return nil, err
	}
	name, err := p.ref()
	if err != nil {
		return nil, err
	}
	if !p.done() {
		return nil, fmt.Errorf("words after the dnat map: %q", p.toks[p.i:])
	}
	m := r.tbl.Maps[name]
	if m == nil {
		return nil, fmt.Errorf("no map %q", name)
	}
	if !ok {
		return []end{{state: st, verdict: vContinue}}, nil
	}
	var ends []end
	// One key per numgen value: each as likely.
	st.prob /= float64(len(keys))
	for _, k := range keys {
		e := m.FindElement(k...)
		if e == nil {
			ends = append(ends, end{state: st, verdict: vContinue})
			continue
		}
		if len(e.Value) != 2 {
			return nil, fmt.Errorf("map %s element %q has value %q, not an address and a port", name, k, e.Value)
		}
		a, err := netip.ParseAddr(e.Value[0])
		if err != nil || a.Is4() != (r.t.family == knftables.IPv4Family) {
			return nil, fmt.Errorf("map %s element %q: %q is not an address of the table's family", name, k, e.Value[0])
		}
		port, err := strconv.ParseUint(e.Value[1], 10, 16)
		if err != nil || port == 0 {
			return nil, fmt.Errorf("map %s element %q: %q is not a port", name, k, e.Value[1])
		}
		s := st
		s.dst, s.dport, s.dnat = a, int(port), netip.AddrPortFrom(a, uint16(port))
		ends = append(ends, end{state: s, verdict: vAccept})
	}
	return ends, nil
}

// inSetKey reports whether key is in set name: each part equal to the
// element's, or, for an address, inside the element's prefix.
func (r *run) inSetKey(name string, key []string) (bool, error) {
	s := r.tbl.Sets[name]
	if s == nil {
		return false, fmt.Errorf("no set %q", name)
	}
	for _, e := range s.Elements {
		if len(e.Key) != len(key) {
			return false, fmt.Errorf("set %s element %q does not have %d parts", name, e.Key, len(key))
		}
		match := true
		for i, part := range key {
			if e.Key[i] == part {
				continue
			}
			a, err := netip.ParseAddr(part)
			if err != nil {
				match = false
				break
			}
			if m, err := matchAddr(e.Key[i], a); err != nil || !m {
				match = false
				break
			}
		}
		if match {
			return true, nil
		}
	}
	return false, nil
}

// inSet reports whether addr is in set name, whose elements are addresses
// or prefixes.
func (r *run) inSet(name string, addr netip.Addr) (bool, error) {
	s := r.tbl.Sets[name]
	if s == nil {
		return false, fmt.Errorf("no set %q", name)
	}
	for _, e := range s.Elements {
		if len(e.Key) != 1 {
			return false, fmt.Errorf("set %s element %q is not one address", name, e.Key)
		}
		ok, err := matchAddr(e.Key[0], addr)
		if err != nil {
			return false, fmt.Errorf("set %s: %w", name, err)
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// matchAddr reports whether addr is v, an address or a prefix.
func matchAddr(v string, addr netip.Addr) (bool, error) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return false, fmt.Errorf("not an address or prefix: %q", v)
		}
		return p.Contains(addr), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return false, fmt.Errorf("not an address or prefix: %q", v)
	}
	return a == addr, nil
}

// dnatNumgen evaluates kube-proxy's DNAT of a Service without affinity:
// "dnat ip addr . port to numgen random mod N map { 0 : ADDR . PORT, ... }"
// (nft lists it without "addr . port"), from "numgen" on: one branch per
// endpoint, each as likely.
func (r *run) dnatNumgen(p *parser, st state) ([]end, error) {
	if err := p.expect("numgen", "random", "mod"); err != nil {
		return nil, err
	}
	n, err := p.number()
	if err != nil {
		return nil, err
	}
	if err := p.expect("map"); err != nil {
		return nil, err
	}
	items, err := p.list()
	if err != nil {
		return nil, err
	}
	if !p.done() {
		return nil, fmt.Errorf("words after the dnat map: %q", p.toks[p.i:])
	}
	if n == 0 || len(items) != int(n) {
		return nil, fmt.Errorf("numgen random mod %d with %d elements", n, len(items))
	}
	dests := make([]netip.AddrPort, n)
	for _, it := range items {
		if len(it) != 5 || it[1] != ":" || it[3] != "." {
			return nil, fmt.Errorf("numgen map element %q is not \"N : ADDR . PORT\"", it)
		}
		k, err := strconv.Atoi(it[0])
		if err != nil || k < 0 || k >= int(n) || dests[k].IsValid() {
			return nil, fmt.Errorf("numgen map key %q is not in 0..%d or repeated", it[0], n-1)
		}
		a, err := netip.ParseAddr(it[2])
		if err != nil || a.Is4() != (r.t.family == knftables.IPv4Family) {
			return nil, fmt.Errorf("numgen map element %q: %q is not an address of the table's family", it, it[2])
		}
		port, err := strconv.ParseUint(it[4], 10, 16)
		if err != nil {
			return nil, fmt.Errorf("numgen map element %q: port %q", it, it[4])
		}
		dests[k] = netip.AddrPortFrom(a, uint16(port))
	}
	st.prob /= float64(n)
	ends := make([]end, 0, n)
	for _, d := range dests {
		b := st
		b.dst, b.dport, b.dnat = d.Addr(), int(d.Port()), d
		ends = append(ends, end{state: b, verdict: vAccept})
	}
	return ends, nil
}
