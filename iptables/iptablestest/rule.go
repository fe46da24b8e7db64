package iptablestest

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"github.com/proxykit/proxykit/iptables"
	v1 "k8s.io/api/core/v1"
)

// cmdError is a command failing the way an iptables binary would: with an
// exit status (2 for bad arguments, 1 for a refused change) and a message.
type cmdError struct {
	status int
	msg    string
	// missingChain is set when the rule jumps to a chain that does not
	// exist: such a rule cannot be in any chain, which RuleExists and
	// DeleteRule report as "not there" rather than as an error.
	missingChain bool
}

// Error returns the message, as the binary would print it after its
// name.
func (e *cmdError) Error() string { return e.msg }

// usagef is a bad-arguments error (exit status 2).
func usagef(format string, args ...any) error {
	return &cmdError{status: 2, msg: fmt.Sprintf(format, args...)}
}

// failf is a refused-change error (exit status 1).
func failf(format string, args ...any) error {
	return &cmdError{status: 1, msg: fmt.Sprintf(format, args...)}
}

// unsupportedf is input that the real binaries may accept but the fake does
// not model; it fails so that a test never passes on something the fake
// did not understand.
func unsupportedf(format string, args ...any) error {
	return &cmdError{status: 2, msg: "not supported by the iptables fake: " + fmt.Sprintf(format, args...)}
}

// rule is one parsed rule. Everything is parsed once, when the rule is
// added; text is the rule in iptables-save's canonical form (without
// "-A CHAIN"), which is also what rules are compared by.
type rule struct {
	text     string
	src, dst addrSpec
	in, out  ifaceSpec
	proto    protoSpec
	matches  []match
	target   target
	// matchBuf holds the first matches, saving an allocation per rule.
	matchBuf [3]match
}

type addrSpec struct {
	set, neg bool
	prefix   netip.Prefix
}

type ifaceSpec struct {
	set, neg bool
	name     string
}

type protoSpec struct {
	set, neg bool
	num      int
}

// A match is a loaded match module ("-m tcp") with its options.
type match interface {
	// option handles opt if it is one of the module's options, reading
	// option arguments from p. It reports whether opt was its own.
	option(p *ruleParser, opt string, neg bool) (bool, error)
	// final checks the complete match once the whole rule is read.
	final(p *ruleParser) error
	// save appends the match as iptables-save prints it (" -m name ...").
	save(b []byte) []byte
}

type targetKind int

const (
	targetNone targetKind = iota
	targetAccept
	targetDrop
	targetReturn
	targetJump
	targetGoto
	targetReject
	targetDNAT
	targetSNAT
	targetMasquerade
	targetMark
	targetLog
)

// target is what a rule does when it matches.
type target struct {
	kind targetKind
	// name is the target as written after -j: "ACCEPT", "DNAT", a chain.
	name  string
	chain iptables.Chain

	rejectWith string

	nat                             natSpec
	random, randomFully, persistent bool
	toPorts                         portRange

	// markValue and markMask are MARK's kernel form: the new mark is
	// (mark &^ markMask) ^ markValue.
	markSet             bool
	markValue, markMask uint32

	logPrefix string
	logLevel  int
}

// natSpec is a DNAT or SNAT address (range) and optional port range.
type natSpec struct {
	set              bool
	minAddr, maxAddr netip.Addr
	ports            portRange
}

type portRange struct {
	set, neg bool
	lo, hi   uint16
}

// ruleEnv is what parsing a rule needs to know about where it goes.
type ruleEnv struct {
	family      v1.IPFamily
	table       iptables.Table
	chain       iptables.Chain
	randomFully bool
	// chainState says whether a chain exists in the table, and whether
	// it is built in.
	chainState func(iptables.Chain) (exists, builtin bool)
	setExists  func(string) bool
}

// ruleParser reads one rule's arguments.
type ruleParser struct {
	env  *ruleEnv
	args []string
	i    int
	r    *rule
}

// value returns the argument of option opt.
func (p *ruleParser) value(opt string) (string, error) {
	if p.i >= len(p.args) {
		return "", usagef("option %q requires an argument", opt)
	}
	v := p.args[p.i]
	p.i++
	return v, nil
}

// parseRule parses the arguments of a rule (everything after "-A CHAIN").
// scratch is reused to build the canonical text.
func parseRule(p *ruleParser, env *ruleEnv, args []string, scratch *[]byte) (*rule, error) {
	r := &rule{target: target{logLevel: -1}}
	r.matches = r.matchBuf[:0]
	*p = ruleParser{env: env, args: args, r: r}
	neg := false
	for p.i < len(args) {
		tok := args[p.i]
		p.i++
		if tok == "!" {
			if neg {
				return nil, usagef("multiple consecutive ! not allowed")
			}
			neg = true
			continue
		}
		if err := p.option(tok, neg); err != nil {
			return nil, err
		}
		neg = false
	}
	if neg {
		return nil, usagef("no command after !")
	}
	for _, m := range r.matches {
		if err := m.final(p); err != nil {
			return nil, err
		}
	}
	if err := p.finalTarget(); err != nil {
		return nil, err
	}
	if err := p.checkChain(); err != nil {
		return nil, err
	}
	b := r.save((*scratch)[:0])
	*scratch = b
	if len(b) > 0 {
		r.text = string(b[1:])
	}
	return r, nil
}

// option handles one option of a rule.
func (p *ruleParser) option(tok string, neg bool) error {
	r := p.r
	switch tok {
	case "-s", "--source", "--src", "-d", "--destination", "--dst":
		spec := &r.src
		flag := "-s"
		if tok[1] == 'd' || strings.HasPrefix(tok, "--d") {
			spec, flag = &r.dst, "-d"
		}
		v, err := p.value(tok)
		if err != nil {
			return err
		}
		if spec.set {
			return usagef("multiple %s flags not allowed", flag)
		}
		pfx, err := parseAddr(v, p.env.family)
		if err != nil {
			return err
		}
		*spec = addrSpec{set: true, neg: neg, prefix: pfx}
	case "-i", "--in-interface", "-o", "--out-interface":
		spec, flag := &r.in, "-i"
		if tok == "-o" || tok == "--out-interface" {
			spec, flag = &r.out, "-o"
		}
		v, err := p.value(tok)
		if err != nil {
			return err
		}
		if spec.set {
			return usagef("multiple %s flags not allowed", flag)
		}
		if err := checkIface(v); err != nil {
			return err
		}
		*spec = ifaceSpec{set: true, neg: neg, name: v}
	case "-p", "--protocol":
		v, err := p.value(tok)
		if err != nil {
			return err
		}
		if r.proto.set {
			return usagef("multiple -p flags not allowed")
		}
		n, err := parseProto(v)
		if err != nil {
			return err
		}
		r.proto = protoSpec{set: true, neg: neg, num: n}
	case "-m", "--match":
		if neg {
			return usagef("unexpected ! flag before --match")
		}
		v, err := p.value(tok)
		if err != nil {
			return err
		}
		m, err := newMatch(v, p.env)
		if err != nil {
			return err
		}
		r.matches = append(r.matches, m)
	case "-j", "--jump", "-g", "--goto":
		if neg {
			return usagef("cannot have ! before %s", tok)
		}
		v, err := p.value(tok)
		if err != nil {
			return err
		}
		if r.target.kind != targetNone {
			return usagef("multiple -j flags not allowed")
		}
		return p.setTarget(v, tok == "-g" || tok == "--goto")
	case "-t", "--table":
		return usagef("The -t option cannot be used in iptables-restore.")
	case "-f", "--fragment", "-c", "--set-counters", "-4", "-6", "--ipv4", "--ipv6":
		return unsupportedf("option %q", tok)
	default:
		if !strings.HasPrefix(tok, "-") {
			return usagef("Bad argument `%s'", tok)
		}
		return p.moduleOption(tok, neg)
	}
	return nil
}

// moduleOption hands an option to the loaded matches (the latest first,
// as iptables does when a module is loaded twice), then to the target,
// then to the protocol's match, which iptables loads implicitly ("-p tcp
// --dport 80" means "-p tcp -m tcp --dport 80").
func (p *ruleParser) moduleOption(opt string, neg bool) error {
	r := p.r
	for i := len(r.matches) - 1; i >= 0; i-- {
		ok, err := r.matches[i].option(p, opt, neg)
		if ok || err != nil {
			return err
		}
	}
	if ok, err := p.targetOption(opt, neg); ok || err != nil {
		return err
	}
	if r.proto.set && !r.proto.neg {
		if name := protoName(r.proto.num); name == "tcp" || name == "udp" || name == "sctp" {
			m := &portMatch{proto: name}
			ok, err := m.option(p, opt, neg)
			if err != nil {
				return err
			}
			if ok {
				r.matches = append(r.matches, m)
				return nil
			}
		}
	}
	return usagef("unknown option %q", opt)
}

// checkChain applies the checks that depend on the chain the rule goes
// into.
func (p *ruleParser) checkChain() error {
	r, env := p.r, p.env
	_, builtin := env.chainState(env.chain)
	if builtin {
		if r.in.set && (env.chain == iptables.ChainOutput || env.chain == iptables.ChainPostrouting) {
			return usagef("Can't use -i with %s", env.chain)
		}
		if r.out.set && (env.chain == iptables.ChainPrerouting || env.chain == iptables.ChainInput) {
			return usagef("Can't use -o with %s", env.chain)
		}
	}
	return nil
}

// save appends the rule in iptables-save's canonical order: addresses,
// interfaces, protocol, matches in the order they were loaded, target.
func (r *rule) save(b []byte) []byte {
	b = saveAddr(b, "-s", r.src)
	b = saveAddr(b, "-d", r.dst)
	b = saveIface(b, "-i", r.in)
	b = saveIface(b, "-o", r.out)
	if r.proto.set && (r.proto.num != 0 || r.proto.neg) {
		b = appendNeg(b, r.proto.neg)
		b = append(b, " -p "...)
		b = append(b, protoName(r.proto.num)...)
	}
	for _, m := range r.matches {
		b = m.save(b)
	}
	return r.target.save(b)
}

func appendNeg(b []byte, neg bool) []byte {
	if neg {
		b = append(b, " !"...)
	}
	return b
}

func saveAddr(b []byte, flag string, a addrSpec) []byte {
	// iptables-save leaves out a match-everything address.
	if !a.set || (a.prefix.Bits() == 0 && !a.neg) {
		return b
	}
	b = appendNeg(b, a.neg)
	b = append(b, ' ')
	b = append(b, flag...)
	b = append(b, ' ')
	return a.prefix.AppendTo(b)
}

func saveIface(b []byte, flag string, s ifaceSpec) []byte {
	if !s.set {
		return b
	}
	b = appendNeg(b, s.neg)
	b = append(b, ' ')
	b = append(b, flag...)
	b = append(b, ' ')
	return append(b, s.name...)
}

// appendQuoted appends s as iptables-save prints strings: bare if it is
// made only of letters, digits, '_' and '-', otherwise in double quotes
// with '"', '\' and '\” escaped by a backslash.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, ' ')
	bare := s != ""
	for i := 0; i < len(s) && bare; i++ {
		c := s[i]
		bare = c == '_' || c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
	}
	if bare {
		return append(b, s...)
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' || c == '\'' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// parseAddr parses "-s"/"-d" values: an address with an optional prefix
// length or dotted mask. Host bits are cleared, as iptables does.
func parseAddr(v string, family v1.IPFamily) (netip.Prefix, error) {
	if strings.Contains(v, ",") {
		return netip.Prefix{}, unsupportedf("address lists (%q): iptables makes one rule per address", v)
	}
	addrText, maskText, hasMask := strings.Cut(v, "/")
	addr, err := netip.ParseAddr(addrText)
	if err != nil || addr.Zone() != "" || addr.Is4() != (family == v1.IPv4Protocol) || addr.Is4In6() {
		return netip.Prefix{}, usagef("host/network `%s' not found", addrText)
	}
	bits := addr.BitLen()
	if hasMask {
		if n, err := strconv.Atoi(maskText); err == nil {
			if n < 0 || n > addr.BitLen() {
				return netip.Prefix{}, usagef("invalid mask `%s' specified", maskText)
			}
			bits = n
		} else {
			m, err := netip.ParseAddr(maskText)
			if err != nil || m.BitLen() != addr.BitLen() {
				return netip.Prefix{}, usagef("invalid mask `%s' specified", maskText)
			}
			ones, ok := maskOnes(m.AsSlice())
			if !ok {
				return netip.Prefix{}, unsupportedf("non-contiguous mask %s", maskText)
			}
			bits = ones
		}
	}
	return netip.PrefixFrom(addr, bits).Masked(), nil
}

// maskOnes returns the prefix length of a contiguous mask.
func maskOnes(m []byte) (int, bool) {
	n := 0
	done := false
	for _, c := range m {
		for bit := 7; bit >= 0; bit-- {
			set := c&(1<<bit) != 0
			if set && done {
				return 0, false
			}
			if set {
				n++
			} else {
				done = true
			}
		}
	}
	return n, true
}

func checkIface(name string) error {
	if len(name) >= 16 {
		return usagef("interface name `%s' must be shorter than IFNAMSIZ (15)", name)
	}
	if name == "" {
		return usagef("empty interface name")
	}
	return nil
}

// protocols maps the protocol names iptables-save prints to numbers.
var protocols = map[string]int{
	"all": 0, "icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "dccp": 33, "gre": 47,
	"esp": 50, "ah": 51, "ipv6-icmp": 58, "sctp": 132, "udplite": 136,
}

func parseProto(v string) (int, error) {
	v = strings.ToLower(v)
	if n, ok := protocols[v]; ok {
		return n, nil
	}
	switch v {
	case "icmpv6", "icmp6":
		return 58, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= 255 {
		return n, nil
	}
	return 0, usagef("unknown protocol %q specified", v)
}

func protoName(n int) string {
	switch n {
	case 0:
		return "all"
	case 1:
		return "icmp"
	case 2:
		return "igmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 33:
		return "dccp"
	case 47:
		return "gre"
	case 50:
		return "esp"
	case 51:
		return "ah"
	case 58:
		return "ipv6-icmp"
	case 132:
		return "sctp"
	case 136:
		return "udplite"
	}
	return strconv.Itoa(n)
}

// parseUint32 parses a number as C's strtoul with base 0 does: decimal,
// 0x hexadecimal or 0 octal.
func parseUint32(v string) (uint32, bool) {
	n, err := strconv.ParseUint(v, 0, 32)
	if err != nil || strings.HasPrefix(v, "0b") || strings.HasPrefix(v, "0o") || strings.Contains(v, "_") {
		return 0, false
	}
	return uint32(n), true
}

// parseValueMask parses "value[/mask]"; the mask defaults to all ones.
func parseValueMask(v string) (value, mask uint32, ok bool) {
	vt, mt, hasMask := strings.Cut(v, "/")
	value, ok = parseUint32(vt)
	if !ok {
		return 0, 0, false
	}
	mask = math.MaxUint32
	if hasMask {
		if mask, ok = parseUint32(mt); !ok {
			return 0, 0, false
		}
	}
	return value, mask, true
}

func parsePort(v string) (uint16, error) {
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		if _, err := strconv.Atoi(v); err != nil && v != "" && (v[0] < '0' || v[0] > '9') {
			return 0, unsupportedf("service name %q as a port; use a number", v)
		}
		return 0, usagef("invalid port/service `%s' specified", v)
	}
	return uint16(n), nil
}

// parsePortRange parses "80", "80:90", ":90" or "80:".
func parsePortRange(v string, sep string) (portRange, error) {
	lo, hi, isRange := strings.Cut(v, sep)
	if !isRange {
		n, err := parsePort(v)
		if err != nil {
			return portRange{}, err
		}
		return portRange{set: true, lo: n, hi: n}, nil
	}
	r := portRange{set: true, hi: math.MaxUint16}
	var err error
	if lo != "" {
		if r.lo, err = parsePort(lo); err != nil {
			return portRange{}, err
		}
	}
	if hi != "" {
		if r.hi, err = parsePort(hi); err != nil {
			return portRange{}, err
		}
	}
	if r.lo > r.hi {
		return portRange{}, usagef("invalid portrange (min > max) `%s'", v)
	}
	return r, nil
}

func (r portRange) appendTo(b []byte, sep byte) []byte {
	b = strconv.AppendUint(b, uint64(r.lo), 10)
	if r.hi != r.lo {
		b = append(b, sep)
		b = strconv.AppendUint(b, uint64(r.hi), 10)
	}
	return b
}

func (r portRange) contains(port uint16) bool {
	return port >= r.lo && port <= r.hi
}

// hasPortProto reports whether the rule's protocol carries ports, which
// NAT targets need before a port can be given.
func (p *ruleParser) hasPortProto() bool {
	if !p.r.proto.set || p.r.proto.neg {
		return false
	}
	switch protoName(p.r.proto.num) {
	case "tcp", "udp", "sctp", "dccp", "udplite":
		return true
	}
	return false
}
