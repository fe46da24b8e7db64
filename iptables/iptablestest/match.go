package iptablestest

import (
	"math"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// newMatch loads match module name ("-m name").
func newMatch(name string, env *ruleEnv) (match, error) {
	switch name {
	case "tcp", "udp", "sctp":
		return &portMatch{proto: name}, nil
	case "multiport":
		return &multiportMatch{}, nil
	case "comment":
		return &commentMatch{}, nil
	case "mark":
		return &markMatch{}, nil
	case "addrtype":
		return &addrtypeMatch{}, nil
	case "conntrack", "state":
		return &stateMatch{module: name}, nil
	case "statistic":
		return &statisticMatch{}, nil
	case "recent":
		return &recentMatch{name: "DEFAULT"}, nil
	case "set":
		return &setMatch{}, nil
	case "physdev":
		return &physdevMatch{}, nil
	case "nfacct":
		return &nfacctMatch{}, nil
	}
	return nil, unsupportedf("match %q (the fake knows tcp, udp, sctp, multiport, comment, mark, addrtype, conntrack, state, statistic, recent, set, physdev, nfacct)", name)
}

func noInvert(opt string, neg bool) error {
	if neg {
		return usagef("option %q cannot be inverted", opt)
	}
	return nil
}

// portMatch is the tcp, udp and sctp match: ports and TCP flags.
type portMatch struct {
	proto        string
	sport, dport portRange
	flags        tcpFlags
}

type tcpFlags struct {
	set, neg   bool
	mask, comp uint8
}

// tcpFlagNames are the TCP flags in the order iptables-save prints them.
var tcpFlagNames = []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG"}

func parseTCPFlags(v string) (uint8, error) {
	switch v {
	case "ALL":
		return 0x3f, nil
	case "NONE":
		return 0, nil
	}
	var f uint8
	for _, name := range strings.Split(v, ",") {
		found := false
		for i, n := range tcpFlagNames {
			if n == name {
				f |= 1 << i
				found = true
			}
		}
		if !found {
			return 0, usagef("Unknown TCP flag `%s'", name)
		}
	}
	return f, nil
}

func appendTCPFlags(b []byte, f uint8) []byte {
	if f == 0 {
		return append(b, "NONE"...)
	}
	first := true
	for i, n := range tcpFlagNames {
		if f&(1<<i) != 0 {
			if !first {
				b = append(b, ',')
			}
			b = append(b, n...)
			first = false
		}
	}
	return b
}

func (m *portMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	var spec *portRange
	switch opt {
	case "--sport", "--source-port":
		spec = &m.sport
	case "--dport", "--destination-port":
		spec = &m.dport
	case "--tcp-flags", "--syn":
		if m.proto != "tcp" {
			return false, nil
		}
		if m.flags.set {
			return true, usagef("Only one of `--syn' or `--tcp-flags' allowed")
		}
		m.flags = tcpFlags{set: true, neg: neg, mask: 0x17, comp: 0x02}
		if opt == "--syn" {
			return true, nil
		}
		mask, err := p.value(opt)
		if err != nil {
			return true, err
		}
		comp, err := p.value(opt)
		if err != nil {
			return true, err
		}
		if m.flags.mask, err = parseTCPFlags(mask); err != nil {
			return true, err
		}
		if m.flags.comp, err = parseTCPFlags(comp); err != nil {
			return true, err
		}
		return true, nil
	default:
		return false, nil
	}
	if spec.set {
		name := "--source-port"
		if spec == &m.dport {
			name = "--destination-port"
		}
		return true, usagef("Only one `%s' allowed", name)
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	r, err := parsePortRange(v, ":")
	if err != nil {
		return true, err
	}
	r.neg = neg
	*spec = r
	return true, nil
}

func (m *portMatch) final(p *ruleParser) error {
	if !p.r.proto.set || p.r.proto.neg || protoName(p.r.proto.num) != m.proto {
		return usagef("%s match requires '-p %s'", strings.ToUpper(m.proto), m.proto)
	}
	return nil
}

func (m *portMatch) save(b []byte) []byte {
	b = append(b, " -m "...)
	b = append(b, m.proto...)
	for _, s := range []struct {
		flag string
		r    portRange
	}{{" --sport ", m.sport}, {" --dport ", m.dport}} {
		if s.r.set {
			b = appendNeg(b, s.r.neg)
			b = append(b, s.flag...)
			b = s.r.appendTo(b, ':')
		}
	}
	if m.flags.set {
		b = appendNeg(b, m.flags.neg)
		b = append(b, " --tcp-flags "...)
		b = appendTCPFlags(b, m.flags.mask)
		b = append(b, ' ')
		b = appendTCPFlags(b, m.flags.comp)
	}
	return b
}

// multiportMatch is "-m multiport --dports 80,443:445".
type multiportMatch struct {
	flag  string
	neg   bool
	ports []portRange
}

func (m *multiportMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	flag := ""
	switch opt {
	case "--dports", "--destination-ports":
		flag = "--dports"
	case "--sports", "--source-ports":
		flag = "--sports"
	case "--ports":
		flag = "--ports"
	default:
		return false, nil
	}
	if m.flag != "" {
		return true, usagef("multiport can only have one option")
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	slots := 0
	for _, part := range strings.Split(v, ",") {
		r, err := parsePortRange(part, ":")
		if err != nil {
			return true, err
		}
		slots++
		if r.lo != r.hi {
			slots++
		}
		m.ports = append(m.ports, r)
	}
	if slots > 15 {
		return true, usagef("too many ports specified")
	}
	m.flag, m.neg = flag, neg
	return true, nil
}

func (m *multiportMatch) final(p *ruleParser) error {
	if m.flag == "" {
		return usagef("multiport expection an option")
	}
	if !p.hasPortProto() {
		return usagef("multiport needs `-p tcp', `-p udp', `-p udplite', `-p sctp' or `-p dccp'")
	}
	return nil
}

func (m *multiportMatch) save(b []byte) []byte {
	b = append(b, " -m multiport"...)
	b = appendNeg(b, m.neg)
	b = append(b, ' ')
	b = append(b, m.flag...)
	for i, r := range m.ports {
		if i == 0 {
			b = append(b, ' ')
		} else {
			b = append(b, ',')
		}
		b = r.appendTo(b, ':')
	}
	return b
}

// nfacctMatch is "-m nfacct --nfacct-name NAME": it always matches, and
// the kernel counts the packet in the accounting object NAME, which must
// exist (the fake, which has no such objects, does not check).
type nfacctMatch struct{ name string }

// maxNFAcctName is the longest accounting object name the kernel takes
// (NFACCT_NAME_MAX, 32 bytes with the terminating NUL).
const maxNFAcctName = 31

func (m *nfacctMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != "--nfacct-name" {
		return false, nil
	}
	if err := noInvert(opt, neg); err != nil {
		return true, err
	}
	if m.name != "" {
		return true, usagef("nfacct: option %q can only be used once", opt)
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	if v == "" || len(v) > maxNFAcctName {
		return true, usagef("nfacct: name %q must be 1 to %d bytes", v, maxNFAcctName)
	}
	m.name = v
	return true, nil
}

func (m *nfacctMatch) final(*ruleParser) error {
	if m.name == "" {
		return usagef("nfacct: option \"--nfacct-name\" must be specified")
	}
	return nil
}

// save prints two spaces after the option, as iptables-save does.
func (m *nfacctMatch) save(b []byte) []byte {
	return append(append(b, " -m nfacct --nfacct-name  "...), m.name...)
}

// commentMatch is "-m comment --comment TEXT".
type commentMatch struct {
	set  bool
	text string
}

// maxCommentLen is the longest comment the kernel keeps; iptables cuts
// longer ones.
const maxCommentLen = 255

func (m *commentMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != "--comment" {
		return false, nil
	}
	if err := noInvert(opt, neg); err != nil {
		return true, err
	}
	if m.set {
		return true, usagef("comment: option %q can only be used once", opt)
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	if len(v) > maxCommentLen {
		v = v[:maxCommentLen]
	}
	m.set, m.text = true, v
	return true, nil
}

func (m *commentMatch) final(*ruleParser) error {
	if !m.set {
		return usagef("comment: option \"--comment\" must be specified")
	}
	return nil
}

func (m *commentMatch) save(b []byte) []byte {
	b = append(b, " -m comment --comment"...)
	return appendQuoted(b, m.text)
}

// markMatch is "-m mark --mark VALUE[/MASK]".
type markMatch struct {
	set, neg    bool
	value, mask uint32
}

func (m *markMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != "--mark" {
		return false, nil
	}
	if m.set {
		return true, usagef("mark: option \"--mark\" can only be used once")
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	value, mask, ok := parseValueMask(v)
	if !ok {
		return true, usagef("mark: bad integer value for option \"--mark\", or out of range.")
	}
	*m = markMatch{set: true, neg: neg, value: value, mask: mask}
	return true, nil
}

func (m *markMatch) final(*ruleParser) error {
	if !m.set {
		return usagef("mark: option \"--mark\" must be specified")
	}
	return nil
}

func (m *markMatch) save(b []byte) []byte {
	b = append(b, " -m mark"...)
	b = appendNeg(b, m.neg)
	b = append(b, " --mark "...)
	return appendValueMask(b, m.value, m.mask)
}

func appendHex(b []byte, v uint32) []byte {
	b = append(b, "0x"...)
	return strconv.AppendUint(b, uint64(v), 16)
}

func appendValueMask(b []byte, value, mask uint32) []byte {
	b = appendHex(b, value)
	if mask != math.MaxUint32 {
		b = append(b, '/')
		b = appendHex(b, mask)
	}
	return b
}

// addrTypes are the address types of the addrtype match, in bit order.
var addrTypes = []string{"UNSPEC", "UNICAST", "LOCAL", "BROADCAST", "ANYCAST", "MULTICAST",
	"BLACKHOLE", "UNREACHABLE", "PROHIBIT", "THROW", "NAT", "XRESOLVE"}

const (
	addrTypeUnicast   = 1 << 1
	addrTypeLocal     = 1 << 2
	addrTypeBroadcast = 1 << 3
	addrTypeMulticast = 1 << 5
)

// addrtypeMatch is "-m addrtype --src-type T --dst-type T".
type addrtypeMatch struct {
	src, dst typeSet
}

type typeSet struct {
	set, neg bool
	mask     uint16
}

func (m *addrtypeMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	var ts *typeSet
	switch opt {
	case "--src-type":
		ts = &m.src
	case "--dst-type":
		ts = &m.dst
	case "--limit-iface-in", "--limit-iface-out":
		return true, unsupportedf("addrtype %s", opt)
	default:
		return false, nil
	}
	if ts.set {
		return true, usagef("addrtype: can't specify %s twice", opt)
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	var mask uint16
	for _, name := range strings.Split(v, ",") {
		found := false
		for i, t := range addrTypes {
			if strings.EqualFold(t, name) {
				mask |= 1 << i
				found = true
			}
		}
		if !found {
			return true, usagef("addrtype: bad type %q", name)
		}
	}
	*ts = typeSet{set: true, neg: neg, mask: mask}
	return true, nil
}

func (m *addrtypeMatch) final(*ruleParser) error {
	if !m.src.set && !m.dst.set {
		return usagef("addrtype: you must specify --src-type or --dst-type")
	}
	return nil
}

func (m *addrtypeMatch) save(b []byte) []byte {
	b = append(b, " -m addrtype"...)
	for _, s := range []struct {
		flag string
		ts   typeSet
	}{{" --src-type ", m.src}, {" --dst-type ", m.dst}} {
		if !s.ts.set {
			continue
		}
		b = appendNeg(b, s.ts.neg)
		b = append(b, s.flag...)
		first := true
		for i, t := range addrTypes {
			if s.ts.mask&(1<<i) != 0 {
				if !first {
					b = append(b, ',')
				}
				b = append(b, t...)
				first = false
			}
		}
	}
	return b
}

// ctStates are the conntrack states, in the order iptables-save prints
// them. The state match knows the first five.
var ctStates = []string{"INVALID", "NEW", "RELATED", "ESTABLISHED", "UNTRACKED", "SNAT", "DNAT"}

const (
	ctInvalid = 1 << iota
	ctNew
	ctRelated
	ctEstablished
	ctUntracked
	ctSNAT
	ctDNAT
)

// stateMatch is "-m conntrack --ctstate S" and "-m state --state S".
type stateMatch struct {
	module   string
	set, neg bool
	states   uint8
}

func (m *stateMatch) flag() string {
	if m.module == "state" {
		return "--state"
	}
	return "--ctstate"
}

func (m *stateMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != m.flag() {
		if m.module == "conntrack" && strings.HasPrefix(opt, "--ct") {
			return true, unsupportedf("conntrack %s (only --ctstate)", opt)
		}
		return false, nil
	}
	if m.set {
		return true, usagef("%s: option %q can only be used once", m.module, opt)
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	known := ctStates
	if m.module == "state" {
		known = ctStates[:5]
	}
	var states uint8
	for _, name := range strings.Split(v, ",") {
		found := false
		for i, s := range known {
			if strings.EqualFold(s, name) {
				states |= 1 << i
				found = true
			}
		}
		if !found {
			if m.module == "state" {
				return true, usagef("Bad state %q", name)
			}
			return true, usagef("Bad ctstate %q", name)
		}
	}
	m.set, m.neg, m.states = true, neg, states
	return true, nil
}

func (m *stateMatch) final(*ruleParser) error {
	if !m.set {
		if m.module == "state" {
			return usagef("state: option \"--state\" must be specified")
		}
		return usagef("conntrack: At least one option is required")
	}
	return nil
}

func (m *stateMatch) save(b []byte) []byte {
	b = append(b, " -m "...)
	b = append(b, m.module...)
	b = appendNeg(b, m.neg)
	b = append(b, ' ')
	b = append(b, m.flag()...)
	first := true
	for i, s := range ctStates {
		if m.states&(1<<i) != 0 {
			if first {
				b = append(b, ' ')
			} else {
				b = append(b, ',')
			}
			b = append(b, s...)
			first = false
		}
	}
	return b
}

// statisticMatch is "-m statistic --mode random --probability P" or
// "--mode nth --every N --packet P".
type statisticMatch struct {
	mode string
	neg  bool
	// probability is the kernel's form: P * 2^31, rounded.
	probability      uint32
	hasProbability   bool
	every, packet    uint32
	hasEvery, hasPkt bool
}

func (m *statisticMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--mode":
		if err := noInvert(opt, neg); err != nil {
			return true, err
		}
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		if v != "random" && v != "nth" {
			return true, usagef("statistic: bad mode %q", v)
		}
		m.mode = v
	case "--probability":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return true, usagef("statistic: bad value for option \"--probability\", or out of range (0-1).")
		}
		m.probability, m.hasProbability = uint32(math.Round(f*0x80000000)), true
		m.neg = m.neg || neg
	case "--every", "--packet":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return true, usagef("statistic: bad value for option %q", opt)
		}
		if opt == "--every" {
			if n == 0 {
				return true, usagef("statistic: --every must be positive")
			}
			m.every, m.hasEvery = uint32(n), true
			m.neg = m.neg || neg
		} else {
			if err := noInvert(opt, neg); err != nil {
				return true, err
			}
			m.packet, m.hasPkt = uint32(n), true
		}
	default:
		return false, nil
	}
	return true, nil
}

func (m *statisticMatch) final(*ruleParser) error {
	switch m.mode {
	case "random":
		if !m.hasProbability {
			return usagef("--probability must be specified when using random mode")
		}
		if m.hasEvery || m.hasPkt {
			return usagef("--every and --packet can only be used in nth mode")
		}
	case "nth":
		if !m.hasEvery {
			return usagef("--every must be specified when using nth mode")
		}
		if m.hasProbability {
			return usagef("--probability can only be used in random mode")
		}
		if m.packet >= m.every {
			return usagef("the --packet p must be 0 <= p <= n-1")
		}
	default:
		return usagef("statistic: option \"--mode\" must be specified")
	}
	return nil
}

func (m *statisticMatch) save(b []byte) []byte {
	b = append(b, " -m statistic --mode "...)
	b = append(b, m.mode...)
	b = appendNeg(b, m.neg)
	if m.mode == "random" {
		b = append(b, " --probability "...)
		return strconv.AppendFloat(b, float64(m.probability)/0x80000000, 'f', 11, 64)
	}
	b = append(b, " --every "...)
	b = strconv.AppendUint(b, uint64(m.every), 10)
	b = append(b, " --packet "...)
	return strconv.AppendUint(b, uint64(m.packet), 10)
}

// recentMatch is the recent match, which kube-proxy uses for ClientIP
// session affinity.
type recentMatch struct {
	cmd      string
	neg      bool
	seconds  uint32
	reap     bool
	hitcount uint32
	rttl     bool
	name     string
	mask     netip.Addr
	rdest    bool
}

// maxRecentNameLen is the kernel's limit on recent list names.
const maxRecentNameLen = 199

func (m *recentMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--set", "--rcheck", "--update", "--remove":
		if m.cmd != "" {
			return true, usagef("recent: option %q cannot be used together with %q.", opt, m.cmd)
		}
		m.cmd, m.neg = opt, neg
		return true, nil
	case "--reap", "--rttl", "--rsource", "--rdest":
		if err := noInvert(opt, neg); err != nil {
			return true, err
		}
		switch opt {
		case "--reap":
			m.reap = true
		case "--rttl":
			m.rttl = true
		case "--rsource":
			m.rdest = false
		case "--rdest":
			m.rdest = true
		}
		return true, nil
	case "--seconds", "--hitcount", "--name", "--mask":
	default:
		return false, nil
	}
	if err := noInvert(opt, neg); err != nil {
		return true, err
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	switch opt {
	case "--seconds", "--hitcount":
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return true, usagef("recent: bad value for option %q", opt)
		}
		if opt == "--seconds" {
			m.seconds = uint32(n)
		} else {
			m.hitcount = uint32(n)
		}
	case "--name":
		if v == "" || len(v) > maxRecentNameLen {
			return true, usagef("recent: bad name %q", v)
		}
		m.name = v
	case "--mask":
		a, err := netip.ParseAddr(v)
		if err != nil || a.Is4() != (p.env.family == v1.IPv4Protocol) {
			return true, usagef("recent: bad mask %q", v)
		}
		m.mask = a
	}
	return true, nil
}

func (m *recentMatch) final(p *ruleParser) error {
	if m.cmd == "" {
		return usagef("recent: you must specify one of `--set', `--rcheck' `--update' or `--remove'")
	}
	if m.reap && m.seconds == 0 {
		return usagef("recent: option \"--reap\" also requires \"--seconds\".")
	}
	if (m.seconds != 0 || m.hitcount != 0) && (m.cmd == "--set" || m.cmd == "--remove") {
		// The kernel refuses these (EINVAL).
		return failf("recent: --seconds and --hitcount need --rcheck or --update")
	}
	if !m.mask.IsValid() {
		if p.env.family == v1.IPv4Protocol {
			m.mask = netip.AddrFrom4([4]byte{255, 255, 255, 255})
		} else {
			m.mask = netip.AddrFrom16([16]byte{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255})
		}
	}
	return nil
}

func (m *recentMatch) save(b []byte) []byte {
	b = append(b, " -m recent"...)
	b = appendNeg(b, m.neg)
	b = append(b, ' ')
	b = append(b, m.cmd...)
	if m.seconds != 0 {
		b = append(b, " --seconds "...)
		b = strconv.AppendUint(b, uint64(m.seconds), 10)
	}
	if m.reap {
		b = append(b, " --reap"...)
	}
	if m.hitcount != 0 {
		b = append(b, " --hitcount "...)
		b = strconv.AppendUint(b, uint64(m.hitcount), 10)
	}
	if m.rttl {
		b = append(b, " --rttl"...)
	}
	b = append(b, " --name "...)
	b = append(b, m.name...)
	b = append(b, " --mask "...)
	if m.mask.Is4() {
		b = m.mask.AppendTo(b)
	} else {
		b = appendExpanded6(b, m.mask)
	}
	if m.rdest {
		return append(b, " --rdest"...)
	}
	return append(b, " --rsource"...)
}

// appendExpanded6 appends an IPv6 address as eight groups of hex digits
// without leading zeros, which is how iptables prints recent's mask.
func appendExpanded6(b []byte, a netip.Addr) []byte {
	s := a.As16()
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b = append(b, ':')
		}
		b = strconv.AppendUint(b, uint64(s[i])<<8|uint64(s[i+1]), 16)
	}
	return b
}

// setMatch is "-m set --match-set NAME src,dst".
type setMatch struct {
	set, neg bool
	name     string
	dirs     string
}

func (m *setMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--match-set":
	case "--return-nomatch", "--update-counters", "--update-subcounters", "--packets-eq", "--packets-lt",
		"--packets-gt", "--bytes-eq", "--bytes-lt", "--bytes-gt":
		return true, unsupportedf("set %s", opt)
	default:
		return false, nil
	}
	if m.set {
		return true, usagef("--match-set can be specified only once")
	}
	name, err := p.value(opt)
	if err != nil {
		return true, err
	}
	dirs, err := p.value(opt)
	if err != nil {
		return true, err
	}
	parts := strings.Split(dirs, ",")
	if len(parts) > 6 {
		return true, usagef("Can't be more src/dst options than 6.")
	}
	for _, d := range parts {
		if d != "src" && d != "dst" {
			return true, usagef("You must specify (the comma separated list of) 'src' or 'dst'.")
		}
	}
	if p.env.setExists == nil || !p.env.setExists(name) {
		return true, usagef("Set %s doesn't exist.", name)
	}
	*m = setMatch{set: true, neg: neg, name: name, dirs: dirs}
	return true, nil
}

func (m *setMatch) final(*ruleParser) error {
	if !m.set {
		return usagef("You must specify `--match-set' with proper arguments")
	}
	return nil
}

func (m *setMatch) save(b []byte) []byte {
	b = append(b, " -m set"...)
	b = appendNeg(b, m.neg)
	b = append(b, " --match-set "...)
	b = append(b, m.name...)
	b = append(b, ' ')
	return append(b, m.dirs...)
}

// physdevMatch is the physdev match, for bridged traffic.
type physdevMatch struct {
	in, out                ifaceSpec
	isIn, isOut, isBridged flagSpec
}

type flagSpec struct{ set, neg bool }

func (m *physdevMatch) option(p *ruleParser, opt string, neg bool) (bool, error) {
	var f *flagSpec
	switch opt {
	case "--physdev-in", "--physdev-out":
		spec := &m.in
		if opt == "--physdev-out" {
			spec = &m.out
		}
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		if err := checkIface(v); err != nil {
			return true, err
		}
		*spec = ifaceSpec{set: true, neg: neg, name: v}
		return true, nil
	case "--physdev-is-in":
		f = &m.isIn
	case "--physdev-is-out":
		f = &m.isOut
	case "--physdev-is-bridged":
		f = &m.isBridged
	default:
		return false, nil
	}
	*f = flagSpec{set: true, neg: neg}
	return true, nil
}

func (m *physdevMatch) final(*ruleParser) error {
	if !m.in.set && !m.out.set && !m.isIn.set && !m.isOut.set && !m.isBridged.set {
		return usagef("PHYSDEV: no physdev option specified")
	}
	return nil
}

func (m *physdevMatch) save(b []byte) []byte {
	b = append(b, " -m physdev"...)
	for _, s := range []struct {
		flag string
		spec ifaceSpec
	}{{" --physdev-in ", m.in}, {" --physdev-out ", m.out}} {
		if s.spec.set {
			b = appendNeg(b, s.spec.neg)
			b = append(b, s.flag...)
			b = append(b, s.spec.name...)
		}
	}
	for _, s := range []struct {
		flag string
		f    flagSpec
	}{{" --physdev-is-in", m.isIn}, {" --physdev-is-out", m.isOut}, {" --physdev-is-bridged", m.isBridged}} {
		if s.f.set {
			b = appendNeg(b, s.f.neg)
			b = append(b, s.flag...)
		}
	}
	return b
}
