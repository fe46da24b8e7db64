package iptablestest

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/proxykit/proxykit/iptables"
	v1 "k8s.io/api/core/v1"
)

// targetKinds maps the targets the fake models to their kind.
var targetKinds = map[string]targetKind{
	"ACCEPT": targetAccept, "DROP": targetDrop, "RETURN": targetReturn,
	"REJECT": targetReject, "DNAT": targetDNAT, "SNAT": targetSNAT,
	"MASQUERADE": targetMasquerade, "MARK": targetMark, "LOG": targetLog,
}

// otherTargets are iptables extension targets the fake does not model. A
// chain cannot take their names either.
var otherTargets = map[string]bool{
	"QUEUE": true, "NFQUEUE": true, "NFLOG": true, "ULOG": true, "CT": true, "NOTRACK": true,
	"TRACE": true, "CONNMARK": true, "CONNSECMARK": true, "SECMARK": true, "CLASSIFY": true,
	"REDIRECT": true, "NETMAP": true, "TPROXY": true, "TCPMSS": true, "TCPOPTSTRIP": true,
	"TOS": true, "TTL": true, "HL": true, "DSCP": true, "ECN": true, "SET": true, "TEE": true,
	"AUDIT": true, "CHECKSUM": true, "IDLETIMER": true, "LED": true, "RATEEST": true,
	"SYNPROXY": true, "HMARK": true, "CLUSTERIP": true, "SAME": true, "MIRROR": true,
}

// setTarget handles "-j NAME" and "-g CHAIN".
func (p *ruleParser) setTarget(name string, isGoto bool) error {
	t := &p.r.target
	t.name = name
	kind, isTarget := targetKinds[name]
	if isTarget && !isGoto {
		t.kind = kind
		return nil
	}
	if otherTargets[name] {
		return unsupportedf("target %s", name)
	}
	exists, builtin := p.env.chainState(iptables.Chain(name))
	switch {
	case isTarget:
		return usagef("Couldn't load target `%s' as a chain for --goto", name)
	case builtin:
		return failf("Can't jump to built-in chain %s.", name)
	case !exists:
		return &cmdError{status: 2, msg: fmt.Sprintf("Couldn't load target `%s':No such file or directory", name), missingChain: true}
	}
	t.kind, t.chain = targetJump, iptables.Chain(name)
	if isGoto {
		t.kind = targetGoto
	}
	return nil
}

// targetOption hands an option to the rule's target.
func (p *ruleParser) targetOption(opt string, neg bool) (bool, error) {
	t := &p.r.target
	known := false
	switch t.kind {
	case targetReject:
		known = opt == "--reject-with"
	case targetDNAT:
		known = opt == "--to-destination" || opt == "--random" || opt == "--persistent"
	case targetSNAT:
		known = opt == "--to-source" || opt == "--random" || opt == "--persistent" || opt == "--random-fully"
	case targetMasquerade:
		known = opt == "--to-ports" || opt == "--random" || opt == "--random-fully"
	case targetMark:
		known = opt == "--set-xmark" || opt == "--set-mark" || opt == "--and-mark" || opt == "--or-mark" || opt == "--xor-mark"
	case targetLog:
		known = opt == "--log-prefix" || opt == "--log-level"
	}
	if !known {
		return false, nil
	}
	if opt == "--random-fully" && !p.env.randomFully {
		return false, nil
	}
	if err := noInvert(opt, neg); err != nil {
		return true, err
	}
	switch opt {
	case "--random":
		t.random = true
		return true, nil
	case "--random-fully":
		t.randomFully = true
		return true, nil
	case "--persistent":
		t.persistent = true
		return true, nil
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	switch opt {
	case "--reject-with":
		with, ok := rejectType(v, p.env.family)
		if !ok {
			return true, usagef("unknown reject type %q", v)
		}
		t.rejectWith = with
	case "--to-destination", "--to-source":
		if t.nat.set {
			return true, usagef("%s: Multiple %s not supported", t.name, opt)
		}
		spec, err := parseNATSpec(v, p.env.family)
		if err != nil {
			return true, err
		}
		if spec.ports.set && !p.hasPortProto() {
			return true, usagef("Need TCP, UDP, SCTP or DCCP with port specification")
		}
		t.nat = spec
	case "--to-ports":
		r, err := parsePortRange(v, "-")
		if err != nil {
			return true, err
		}
		if !p.hasPortProto() {
			return true, usagef("Need TCP, UDP, SCTP or DCCP with port specification")
		}
		t.toPorts = r
	case "--set-xmark", "--set-mark", "--and-mark", "--or-mark", "--xor-mark":
		if t.markSet {
			return true, usagef("MARK target: Can't specify --set-mark twice")
		}
		value, mask, ok := parseValueMask(v)
		withMask := strings.Contains(v, "/")
		if !ok || (withMask && opt != "--set-xmark" && opt != "--set-mark") {
			return true, usagef("MARK: bad value for option %q, or out of range (0-4294967295).", opt)
		}
		switch opt {
		case "--set-xmark":
			t.markValue, t.markMask = value, mask
		case "--set-mark":
			t.markValue, t.markMask = value, mask|value
		case "--and-mark":
			t.markValue, t.markMask = 0, ^value
		case "--or-mark":
			t.markValue, t.markMask = value, value
		case "--xor-mark":
			t.markValue, t.markMask = value, 0
		}
		t.markSet = true
	case "--log-prefix":
		if len(v) > 29 {
			return true, usagef("Maximum prefix length 29 for --log-prefix")
		}
		t.logPrefix = v
	case "--log-level":
		n, ok := logLevel(v)
		if !ok {
			return true, usagef("log-level %q unknown", v)
		}
		t.logLevel = n
	}
	return true, nil
}

// finalTarget checks the complete target and the rule around it.
func (p *ruleParser) finalTarget() error {
	t, env := &p.r.target, p.env
	switch t.kind {
	case targetReject:
		if t.rejectWith == "" {
			t.rejectWith = "icmp-port-unreachable"
			if env.family == v1.IPv6Protocol {
				t.rejectWith = "icmp6-port-unreachable"
			}
		}
		// Kernel checks, which the binaries report as a failed line.
		if env.table != iptables.TableFilter {
			return failf("REJECT target is only valid in the filter table, not %s", env.table)
		}
		if t.rejectWith == "tcp-reset" && (!p.r.proto.set || p.r.proto.neg || p.r.proto.num != 6) {
			return failf("REJECT --reject-with tcp-reset is only valid with -p tcp")
		}
	case targetDNAT, targetSNAT:
		if !t.nat.set {
			opt := "--to-destination"
			if t.kind == targetSNAT {
				opt = "--to-source"
			}
			return usagef("%s: option %q must be specified", t.name, opt)
		}
		fallthrough
	case targetMasquerade:
		if env.table != iptables.TableNAT {
			return failf("%s target is only valid in the nat table, not %s", t.name, env.table)
		}
	case targetMark:
		if !t.markSet {
			return usagef("MARK: One of the --set-xmark, --{and,or,xor,set}-mark options is required")
		}
	}
	if mask := allowedHooks(t.kind); mask != 0 {
		if _, builtin := env.chainState(env.chain); builtin && hookOf(env.chain)&mask == 0 {
			return failf("%s target is not valid in chain %s", t.name, env.chain)
		}
	}
	return nil
}

// Hook bits, for checking from which built-in chains a NAT target is
// reached.
const (
	hookPrerouting = 1 << iota
	hookInput
	hookForward
	hookOutput
	hookPostrouting
)

func hookOf(c iptables.Chain) uint8 {
	switch c {
	case iptables.ChainPrerouting:
		return hookPrerouting
	case iptables.ChainInput:
		return hookInput
	case iptables.ChainForward:
		return hookForward
	case iptables.ChainOutput:
		return hookOutput
	case iptables.ChainPostrouting:
		return hookPostrouting
	}
	return 0
}

// allowedHooks returns the hooks a target may be reached from (as the
// kernel checks them), or 0 for targets valid anywhere.
func allowedHooks(k targetKind) uint8 {
	switch k {
	case targetDNAT:
		return hookPrerouting | hookOutput
	case targetSNAT:
		return hookPostrouting | hookInput
	case targetMasquerade:
		return hookPostrouting
	}
	return 0
}

func hookNames(mask uint8) string {
	var names []string
	for _, c := range []iptables.Chain{iptables.ChainPrerouting, iptables.ChainInput, iptables.ChainForward, iptables.ChainOutput, iptables.ChainPostrouting} {
		if hookOf(c)&mask != 0 {
			names = append(names, string(c))
		}
	}
	return strings.Join(names, ",")
}

func (t *target) save(b []byte) []byte {
	switch t.kind {
	case targetNone:
		return b
	case targetGoto:
		b = append(b, " -g "...)
		return append(b, t.chain...)
	}
	b = append(b, " -j "...)
	b = append(b, t.name...)
	switch t.kind {
	case targetReject:
		b = append(b, " --reject-with "...)
		b = append(b, t.rejectWith...)
	case targetDNAT, targetSNAT:
		if t.kind == targetDNAT {
			b = append(b, " --to-destination "...)
		} else {
			b = append(b, " --to-source "...)
		}
		b = t.nat.appendTo(b)
		b = t.appendNATFlags(b)
	case targetMasquerade:
		if t.toPorts.set {
			b = append(b, " --to-ports "...)
			b = t.toPorts.appendTo(b, '-')
		}
		b = t.appendNATFlags(b)
	case targetMark:
		b = append(b, " --set-xmark "...)
		b = appendHex(b, t.markValue)
		b = append(b, '/')
		b = appendHex(b, t.markMask)
	case targetLog:
		if t.logPrefix != "" {
			b = append(b, " --log-prefix"...)
			b = appendQuoted(b, t.logPrefix)
		}
		if t.logLevel >= 0 && t.logLevel != 4 {
			b = append(b, " --log-level "...)
			b = strconv.AppendInt(b, int64(t.logLevel), 10)
		}
	}
	return b
}

func (t *target) appendNATFlags(b []byte) []byte {
	if t.random {
		b = append(b, " --random"...)
	}
	if t.randomFully {
		b = append(b, " --random-fully"...)
	}
	if t.persistent {
		b = append(b, " --persistent"...)
	}
	return b
}

// rejectTypes maps REJECT's --reject-with names, and their aliases, to the
// name iptables-save prints.
var rejectTypes4 = map[string]string{
	"icmp-net-unreachable": "icmp-net-unreachable", "net-unreach": "icmp-net-unreachable",
	"icmp-host-unreachable": "icmp-host-unreachable", "host-unreach": "icmp-host-unreachable",
	"icmp-proto-unreachable": "icmp-proto-unreachable", "proto-unreach": "icmp-proto-unreachable",
	"icmp-port-unreachable": "icmp-port-unreachable", "port-unreach": "icmp-port-unreachable",
	"icmp-net-prohibited": "icmp-net-prohibited", "net-prohib": "icmp-net-prohibited",
	"icmp-host-prohibited": "icmp-host-prohibited", "host-prohib": "icmp-host-prohibited",
	"icmp-admin-prohibited": "icmp-admin-prohibited", "admin-prohib": "icmp-admin-prohibited",
	"tcp-reset": "tcp-reset", "tcp-rst": "tcp-reset",
}

var rejectTypes6 = map[string]string{
	"icmp6-no-route": "icmp6-no-route", "no-route": "icmp6-no-route",
	"icmp6-adm-prohibited": "icmp6-adm-prohibited", "adm-prohibited": "icmp6-adm-prohibited",
	"icmp6-addr-unreachable": "icmp6-addr-unreachable", "addr-unreach": "icmp6-addr-unreachable",
	"icmp6-port-unreachable": "icmp6-port-unreachable", "port-unreach": "icmp6-port-unreachable",
	"icmp6-policy-fail": "icmp6-policy-fail", "policy-fail": "icmp6-policy-fail",
	"icmp6-reject-route": "icmp6-reject-route", "reject-route": "icmp6-reject-route",
	"tcp-reset": "tcp-reset", "tcp-rst": "tcp-reset",
}

func rejectType(v string, family v1.IPFamily) (string, bool) {
	m := rejectTypes4
	if family == v1.IPv6Protocol {
		m = rejectTypes6
	}
	name, ok := m[v]
	return name, ok
}

var logLevels = []string{"emerg", "alert", "crit", "error", "warning", "notice", "info", "debug"}

func logLevel(v string) (int, bool) {
	if n, err := strconv.Atoi(v); err == nil {
		return n, n >= 0 && n <= 7
	}
	for i, name := range logLevels {
		if name == v {
			return i, true
		}
	}
	if v == "panic" {
		return 0, true
	}
	if v == "warn" {
		return 4, true
	}
	return 0, false
}

// parseNATSpec parses DNAT's --to-destination and SNAT's --to-source:
// "ADDR[-ADDR][:PORT[-PORT]]", with IPv6 addresses in brackets when a
// port follows.
func parseNATSpec(v string, family v1.IPFamily) (natSpec, error) {
	bad := usagef("Invalid address format")
	var addrs, ports string
	hasPorts := false
	if family == v1.IPv6Protocol && strings.HasPrefix(v, "[") {
		end := strings.Index(v, "]")
		if end < 0 {
			return natSpec{}, bad
		}
		addrs = v[1:end]
		rest := v[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return natSpec{}, bad
			}
			ports, hasPorts = rest[1:], true
		}
	} else if family == v1.IPv6Protocol {
		addrs = v
	} else {
		addrs, ports, hasPorts = strings.Cut(v, ":")
	}
	var spec natSpec
	if addrs == "" {
		return natSpec{}, unsupportedf("NAT without an address (%q)", v)
	}
	lo, hi, isRange := strings.Cut(addrs, "-")
	a, err := netip.ParseAddr(lo)
	if err != nil || a.Is4() != (family == v1.IPv4Protocol) || a.Zone() != "" {
		return natSpec{}, bad
	}
	spec.minAddr, spec.maxAddr = a, a
	if isRange {
		b, err := netip.ParseAddr(hi)
		if err != nil || b.Is4() != a.Is4() || b.Less(a) {
			return natSpec{}, bad
		}
		spec.maxAddr = b
	}
	if hasPorts {
		r, err := parsePortRange(ports, "-")
		if err != nil {
			return natSpec{}, err
		}
		if r.lo == 0 {
			return natSpec{}, usagef("Port `%s' not valid", ports)
		}
		spec.ports = r
	}
	spec.set = true
	return spec, nil
}

func (s natSpec) appendTo(b []byte) []byte {
	bracket := s.minAddr.Is6() && s.ports.set
	if bracket {
		b = append(b, '[')
	}
	b = s.minAddr.AppendTo(b)
	if s.maxAddr != s.minAddr {
		b = append(b, '-')
		b = s.maxAddr.AppendTo(b)
	}
	if bracket {
		b = append(b, ']')
	}
	if s.ports.set {
		b = append(b, ':')
		b = s.ports.appendTo(b, '-')
	}
	return b
}

// applyMark returns mark after a MARK target.
func (t *target) applyMark(mark uint32) uint32 {
	return (mark &^ t.markMask) ^ t.markValue
}
