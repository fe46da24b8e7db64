package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/nftables/nftablestest"
)

// SourceKind is where a traced packet comes from.
type SourceKind string

const (
	// SourceNode: a process on the node itself (the packet starts in
	// the output hook), from the node's first address of the family.
	SourceNode SourceKind = "node"
	// SourcePod: a pod on this node, from Node.PodAddr, arriving from
	// the pod network.
	SourcePod SourceKind = "pod"
	// SourceOutside: a client outside the cluster, from
	// Node.OutsideAddr, arriving from the network.
	SourceOutside SourceKind = "outside"
	// SourceAddr: the address in Source.Addr; a packet from one of the
	// node's own addresses is sent by the node.
	SourceAddr SourceKind = "addr"
)

// Source is the sender of a traced packet.
type Source struct {
	Kind SourceKind `json:"kind"`
	// Addr is the source address: set for SourceAddr; Trace fills it in
	// for the others.
	Addr netip.Addr `json:"addr,omitzero"`
}

// FromNode returns the Source of a process on the node.
func FromNode() Source { return Source{Kind: SourceNode} }

// FromPod returns the Source of a pod on the node.
func FromPod() Source { return Source{Kind: SourcePod} }

// FromOutside returns the Source of a client outside the cluster.
func FromOutside() Source { return Source{Kind: SourceOutside} }

// FromAddr returns the Source at address a.
func FromAddr(a netip.Addr) Source { return Source{Kind: SourceAddr, Addr: a} }

// ParseSource reads a source as the command line gives it: "node", "pod",
// "outside" or an IP address.
func ParseSource(s string) (Source, error) {
	switch SourceKind(s) {
	case SourceNode, SourcePod, SourceOutside:
		return Source{Kind: SourceKind(s)}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return Source{}, fmt.Errorf("source %q: want node, pod, outside or an IP address", s)
	}
	return FromAddr(a.Unmap()), nil
}

func (s Source) String() string {
	if s.Kind == SourceAddr || !s.Addr.IsValid() {
		if s.Addr.IsValid() {
			return s.Addr.String()
		}
		return string(s.Kind)
	}
	return fmt.Sprintf("%s (%s)", s.Addr, s.Kind)
}

// Packet is the first packet of a new connection, to trace.
type Packet struct {
	From Source `json:"from"`
	// Dest is the destination address and port.
	Dest netip.AddrPort `json:"dest"`
	// Protocol is TCP, UDP or SCTP.
	Protocol v1.Protocol `json:"protocol"`
}

func (p Packet) String() string {
	return fmt.Sprintf("%s %s -> %s", strings.ToLower(string(p.Protocol)), p.From, p.Dest)
}

// ParseDest reads a destination as the command line gives it,
// "ADDR:PORT/PROTO" ("[ADDR]:PORT/PROTO" for IPv6); the protocol may be
// left out for TCP, and is case-insensitive.
func ParseDest(s string) (netip.AddrPort, v1.Protocol, error) {
	dest, proto, _ := strings.Cut(s, "/")
	protocol := v1.ProtocolTCP
	switch strings.ToUpper(proto) {
	case "", "TCP":
	case "UDP":
		protocol = v1.ProtocolUDP
	case "SCTP":
		protocol = v1.ProtocolSCTP
	default:
		return netip.AddrPort{}, "", fmt.Errorf("destination %q: protocol %q: want tcp, udp or sctp", s, proto)
	}
	ap, err := netip.ParseAddrPort(dest)
	if err != nil || ap.Port() == 0 {
		return netip.AddrPort{}, "", fmt.Errorf("destination %q: want ADDR:PORT/PROTO, such as 10.96.0.10:53/udp or [fd00::10]:80/tcp", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), protocol, nil
}

// Node is what a trace knows of the node, besides its rules.
type Node struct {
	// Addrs are the node's own addresses, which its rules call local
	// (loopback addresses always are): packets to them are delivered to
	// the node, and SourceNode packets come from the first of the
	// family.
	Addrs []netip.Addr
	// PodAddr is the address of a pod on this node, for SourcePod; one
	// per family may be given.
	PodAddr []netip.Addr
	// OutsideAddr is the address of a client outside the cluster, for
	// SourceOutside, one per family; without one of the family,
	// 203.0.113.1 (IPv4) or 2001:db8::1 (IPv6), documentation addresses.
	OutsideAddr []netip.Addr
}

// defaultOutside are the SourceOutside addresses without Node.OutsideAddr.
var defaultOutside = []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")}

// Verdict is how a traced packet ends.
type Verdict string

const (
	// Accept: delivered, to the node or on to its destination.
	Accept Verdict = "ACCEPT"
	// Drop: discarded silently.
	Drop Verdict = "DROP"
	// Reject: discarded, and the sender told.
	Reject Verdict = "REJECT"
)

// Outcome is one way a traced packet can end.
type Outcome struct {
	Verdict Verdict `json:"verdict"`
	// Probability is how likely this outcome is, from the random choices
	// of endpoints on its path; the outcomes of a trace add up to 1
	// (for each set of Assumed facts, in iptables mode).
	Probability float64 `json:"probability"`
	// Endpoint is where the packet was DNATed to; the zero value when it
	// was not.
	Endpoint netip.AddrPort `json:"endpoint,omitzero"`
	// Masquerade says an accepted packet leaves with the node's address
	// as its source.
	Masquerade bool `json:"masquerade"`
	// Local says an accepted packet is delivered to the node itself
	// (iptables mode; nftables mode does not say).
	Local bool `json:"local,omitempty"`
	// RejectWith is the ICMP error of an iptables REJECT rule that sets
	// one.
	RejectWith string `json:"rejectWith,omitempty"`
	// Rule is the rule that decided the outcome: the one that dropped
	// or rejected the packet, or DNATed it; in nftables mode the rule of
	// the last chain, or the map element that sent the packet there.
	// Empty when no rule acted.
	Rule string `json:"rule,omitempty"`
	// Path is the way the packet went: in iptables mode every rule that
	// matched and acted, as "-t TABLE -A CHAIN RULE"; in nftables mode
	// the chains it went through.
	Path []string `json:"path"`
	// Assumed lists what the trace did not know and assumed to reach this
	// outcome ("set:NAME" for an ipset's content), true or false.
	Assumed map[string]bool `json:"assumed,omitempty"`
}

// Explanation is every way a packet can end on a node.
type Explanation struct {
	Mode   string      `json:"mode"`
	Family v1.IPFamily `json:"family"`
	// Packet is the packet traced, its source address filled in.
	Packet   Packet    `json:"packet"`
	Outcomes []Outcome `json:"outcomes"`
}

// Trace follows p through the rules and returns every way it can end,
// most likely first (in the tracers' order among equals). A SourcePod or
// SourceNode packet takes its address from node; one from an address of
// node.Addrs is the node's. Trace fails when the packet is not of the
// Ruleset's family, when node lacks the address its source needs, or
// when the tracer meets a rule it cannot interpret, which the error
// names. It changes nothing.
func (r *Ruleset) Trace(p Packet, node Node) (*Explanation, error) {
	want4 := r.family == v1.IPv4Protocol
	if !p.Dest.IsValid() || p.Dest.Addr().Is4() != want4 {
		return nil, fmt.Errorf("destination %s is not an %s address", p.Dest, r.family)
	}
	var fromNode bool
	var err error
	if p.From, fromNode, err = resolveSource(p.From, node, want4); err != nil {
		return nil, err
	}
	ex := &Explanation{Mode: r.mode, Family: r.family, Packet: p}
	if r.ipt != nil {
		ex.Outcomes, err = r.traceIPTables(p, node, fromNode)
	} else {
		ex.Outcomes, err = r.traceNFTables(p, node, fromNode)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing %s: %w", p, err)
	}
	slices.SortStableFunc(ex.Outcomes, func(a, b Outcome) int {
		switch {
		case a.Probability > b.Probability:
			return -1
		case a.Probability < b.Probability:
			return 1
		}
		return 0
	})
	return ex, nil
}

// resolveSource fills in the source's address; fromNode says the node
// sends the packet.
func resolveSource(s Source, node Node, want4 bool) (Source, bool, error) {
	family := "IPv4"
	if !want4 {
		family = "IPv6"
	}
	pick := func(addrs []netip.Addr) netip.Addr {
		for _, a := range addrs {
			if a.Is4() == want4 {
				return a
			}
		}
		return netip.Addr{}
	}
	switch s.Kind {
	case SourceNode:
		s.Addr = pick(node.Addrs)
		if !s.Addr.IsValid() {
			return s, false, fmt.Errorf("source node: the node has no %s address", family)
		}
		return s, true, nil
	case SourcePod:
		s.Addr = pick(node.PodAddr)
		if !s.Addr.IsValid() {
			return s, false, fmt.Errorf("source pod: no %s pod address known (give the cluster CIDR, or the pod's address)", family)
		}
	case SourceOutside:
		if s.Addr = pick(node.OutsideAddr); !s.Addr.IsValid() {
			s.Addr = pick(defaultOutside)
		}
	case SourceAddr:
		if !s.Addr.IsValid() || s.Addr.Is4() != want4 {
			return s, false, fmt.Errorf("source %s is not an %s address", s.Addr, family)
		}
		return s, slices.Contains(node.Addrs, s.Addr) || s.Addr.IsLoopback(), nil
	default:
		return s, false, fmt.Errorf("unknown source kind %q", s.Kind)
	}
	return s, false, nil
}

// sourcePort is the traced packet's source port: an ephemeral one.
const sourcePort = 40000

func (r *Ruleset) traceIPTables(p Packet, node Node, fromNode bool) ([]Outcome, error) {
	outs, err := r.ipt.Trace(iptablestest.Packet{
		Protocol:        strings.ToLower(string(p.Protocol)),
		Source:          p.From.Addr,
		Destination:     p.Dest.Addr(),
		SourcePort:      sourcePort,
		DestinationPort: p.Dest.Port(),
		FromNode:        fromNode,
		NodeAddrs:       node.Addrs,
		// No recent list holds the client: its first connection.
		Recent: map[string]bool{},
	})
	if err != nil {
		return nil, err
	}
	res := make([]Outcome, 0, len(outs))
	for _, o := range outs {
		out := Outcome{
			Verdict:     Verdict(o.Verdict),
			Probability: o.Probability,
			Masquerade:  o.Masquerade && o.Verdict == iptablestest.Accept,
			Local:       o.Local,
			RejectWith:  o.RejectWith,
			Path:        o.Path,
			Assumed:     o.Assumed,
		}
		if out.Path == nil {
			out.Path = []string{}
		}
		if o.DNAT {
			out.Endpoint = netip.AddrPortFrom(o.Destination, o.DestinationPort)
		}
		switch {
		case o.Verdict != iptablestest.Accept && len(o.Path) > 0:
			out.Rule = o.Path[len(o.Path)-1]
		case o.DNAT:
			for _, step := range slices.Backward(o.Path) {
				if strings.Contains(step, "-j DNAT") {
					out.Rule = step
					break
				}
			}
		}
		res = append(res, out)
	}
	return res, nil
}

func (r *Ruleset) traceNFTables(p Packet, node Node, fromNode bool) ([]Outcome, error) {
	nf, err := nftFamily(r.family)
	if err != nil {
		return nil, err
	}
	tr := nftablestest.NewTracer(r.nft, nf, r.table, node.Addrs...)
	outs, err := tr.Trace(nftablestest.Packet{Src: p.From.Addr, Dst: p.Dest.Addr(), Protocol: p.Protocol,
		DstPort: int(p.Dest.Port()), Output: fromNode})
	if err != nil {
		return nil, err
	}
	res := make([]Outcome, 0, len(outs))
	for _, o := range outs {
		out := Outcome{
			Verdict:     Verdict(strings.ToUpper(string(o.Verdict))),
			Probability: o.Probability,
			Endpoint:    o.DNAT,
			Masquerade:  o.Masquerade,
			Path:        o.Chains,
		}
		if out.Path == nil {
			out.Path = []string{}
		}
		if o.Verdict != nftablestest.Accept && len(o.Chains) > 0 {
			out.Rule = r.deciding(o.Chains, strings.ToLower(string(o.Verdict)), p)
		}
		res = append(res, out)
	}
	return res, nil
}

// deciding names what sent a dropped or rejected packet to its end in
// nftables mode: the map element whose verdict jumps to the last chain,
// keyed by the packet's destination, if there is one, else the last
// chain's rule with the verdict.
func (r *Ruleset) deciding(chains []string, verdict string, p Packet) string {
	last := chains[len(chains)-1]
	r.nft.RLock()
	defer r.nft.RUnlock()
	nf, _ := nftFamily(r.family)
	tbl := r.nft.Tables[nf][r.table]
	if tbl == nil {
		return ""
	}
	addr, port := p.Dest.Addr().String(), strconv.Itoa(int(p.Dest.Port()))
	proto := strings.ToLower(string(p.Protocol))
	for _, name := range sortedKeys(tbl.Maps) {
		for _, e := range tbl.Maps[name].Elements {
			if len(e.Value) != 1 || !slices.Contains([]string{"goto " + last, "jump " + last}, e.Value[0]) {
				continue
			}
			key := strings.Join(e.Key, " . ")
			if key == addr+" . "+proto+" . "+port || key == proto+" . "+port {
				return fmt.Sprintf("map %s element { %s : %s }", name, key, e.Value[0])
			}
		}
	}
	if c := tbl.Chains[last]; c != nil {
		for _, rule := range c.Rules {
			if f := strings.Fields(rule.Rule); len(f) > 0 && f[len(f)-1] == verdict {
				return fmt.Sprintf("chain %s: %s", last, rule.Rule)
			}
		}
	}
	return "chain " + last
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// WriteJSON writes e as indented JSON.
func (e *Explanation) WriteJSON(w io.Writer) error { return writeJSON(w, e) }

// writeJSON writes v indented, with "<" and ">" as they are (rules and
// comments hold them).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// WriteText writes e for a reader: the packet, then each outcome with its
// probability and what decided it, and the path that led there.
func (e *Explanation) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s mode, %s: %d outcome(s)\n", e.Packet, e.Mode, e.Family, len(e.Outcomes))
	for _, o := range e.Outcomes {
		b.WriteString("  " + o.Summary() + "\n")
		if o.Rule != "" {
			fmt.Fprintf(&b, "      by: %s\n", o.Rule)
		}
		if len(o.Path) > 0 {
			if e.Mode == ModeNFTables {
				fmt.Fprintf(&b, "      chains: %s\n", strings.Join(o.Path, " -> "))
			} else {
				b.WriteString("      path:\n")
				for _, step := range o.Path {
					fmt.Fprintf(&b, "        %s\n", step)
				}
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Summary says the outcome on one line, such as
// "p=0.5 ACCEPT, DNAT to 10.244.1.10:8080, masquerade".
func (o Outcome) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "p=%s %s", formatProbability(o.Probability), o.Verdict)
	switch {
	case o.Endpoint.IsValid():
		fmt.Fprintf(&b, ", DNAT to %s", o.Endpoint)
	case o.Verdict == Accept && o.Local:
		b.WriteString(", to the node itself, no DNAT")
	case o.Verdict == Accept:
		b.WriteString(", no DNAT")
	}
	if o.RejectWith != "" {
		fmt.Fprintf(&b, " with %s", o.RejectWith)
	}
	if o.Verdict == Accept {
		if o.Masquerade {
			b.WriteString(", masquerade")
		} else {
			b.WriteString(", no masquerade")
		}
	}
	if len(o.Assumed) > 0 {
		b.WriteString(", assuming")
		for _, k := range sortedKeys(o.Assumed) {
			fmt.Fprintf(&b, " %s=%t", k, o.Assumed[k])
		}
	}
	return b.String()
}

// formatProbability rounds to 4 decimals, as the random choices of
// iptables rules are given to 10.
func formatProbability(p float64) string {
	return strconv.FormatFloat(math.Round(p*10000)/10000, 'f', -1, 64)
}
