package explain

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
)

// Drift is how two Rulesets of a node differ: the live one and the one
// wanted (such as what proxykit would program for the same objects).
type Drift struct {
	Mode   string      `json:"mode"`
	Family v1.IPFamily `json:"family"`
	// Traced is how many packets were traced through both.
	Traced int `json:"traced"`
	// Packets are the packets whose outcomes differ, in the order given.
	Packets []PacketDrift `json:"packets"`
	// Missing lists what the wanted rules have and the live ones lack,
	// Extra what the live ones have and the wanted ones lack: chains
	// ("chain NAME", with "-t TABLE" in iptables mode), rules
	// ("-t TABLE -A CHAIN RULE"; "rule CHAIN: RULE" in nftables mode) and
	// set and map elements ("element NAME { KEY : VALUE }"), sorted.
	Missing []string `json:"missing"`
	Extra   []string `json:"extra"`
}

// PacketDrift is a packet whose outcomes differ.
type PacketDrift struct {
	Packet Packet    `json:"packet"`
	Live   []Outcome `json:"live"`
	Want   []Outcome `json:"want"`
}

// Empty reports whether nothing differs.
func (d *Drift) Empty() bool { return len(d.Packets) == 0 && len(d.Missing) == 0 && len(d.Extra) == 0 }

// Compare traces every packet through live and want and lists those whose
// outcomes differ (verdict, endpoint, masquerade and probability, not the
// path), then lists the chains, rules and elements one has and the other
// lacks: in iptables mode those of the nat and filter chains whose names
// start with want's chain prefix and the rules of the built-in chains
// that jump to them; in nftables mode everything in the table but the
// elements of dynamic sets. Rules are compared as the writers write them
// (see NFTablesRuleset); iptables rules without their nfacct counting
// match, and without the copies of node-port rules for 127.0.0.0/8 that
// exist only to count (a dry run renders neither, and neither changes a
// packet's way). It fails when the two are not of the same mode
// and family, or when a trace fails, naming the packet and the rule.
func Compare(live, want *Ruleset, packets []Packet, node Node) (*Drift, error) {
	if live.mode != want.mode || live.family != want.family {
		return nil, fmt.Errorf("cannot compare %s %s rules with %s %s rules", live.mode, live.family, want.mode, want.family)
	}
	d := &Drift{Mode: live.mode, Family: live.family, Packets: []PacketDrift{}}
	for _, p := range packets {
		l, err := live.Trace(p, node)
		if err != nil {
			return nil, fmt.Errorf("live rules: %w", err)
		}
		w, err := want.Trace(p, node)
		if err != nil {
			return nil, fmt.Errorf("wanted rules: %w", err)
		}
		d.Traced++
		if !slices.Equal(outcomeKeys(l.Outcomes), outcomeKeys(w.Outcomes)) {
			d.Packets = append(d.Packets, PacketDrift{Packet: l.Packet, Live: l.Outcomes, Want: w.Outcomes})
		}
	}
	liveItems, wantItems := live.items(want.prefix), want.items(want.prefix)
	d.Missing, d.Extra = difference(wantItems, liveItems), difference(liveItems, wantItems)
	return d, nil
}

// outcomeKeys sums the probabilities of the outcomes that end alike, and
// returns them sorted, one string each.
func outcomeKeys(outs []Outcome) []string {
	sum := map[string]float64{}
	for _, o := range outs {
		key := fmt.Sprintf("%s %s masq=%t local=%t %s", o.Verdict, o.Endpoint, o.Masquerade, o.Local, o.RejectWith)
		sum[key] += o.Probability
	}
	keys := make([]string, 0, len(sum))
	for k, p := range sum {
		keys = append(keys, k+" p="+strconv.FormatFloat(math.Round(p*1e6)/1e6, 'g', -1, 64))
	}
	slices.Sort(keys)
	return keys
}

// difference returns the items of a not in b (counting repeats), sorted.
func difference(a, b []string) []string {
	count := map[string]int{}
	for _, x := range b {
		count[x]++
	}
	out := []string{}
	for _, x := range a {
		if count[x] > 0 {
			count[x]--
			continue
		}
		out = append(out, x)
	}
	slices.Sort(out)
	return out
}

var (
	// nfacctMatch counts packets in an nfacct counter: it changes no
	// packet's way, and a dry run does not render it.
	nfacctMatch = regexp.MustCompile(`-m nfacct --nfacct-name\s+\S+ `)
	// localhostDest starts the copy of a node-port rule for 127.0.0.0/8
	// that iptables mode adds to count localhost node-port packets.
	localhostDest = "-d 127.0.0.0/8 "
)

// hexNumber is a hexadecimal number in a rule, which nft prints padded.
var hexNumber = regexp.MustCompile(`\b0x[0-9a-fA-F]+\b`)

// canonical writes numbers in one way, for comparing rules.
func canonical(rule string) string {
	return hexNumber.ReplaceAllStringFunc(rule, func(h string) string {
		v, err := strconv.ParseUint(h[2:], 16, 64)
		if err != nil {
			return h
		}
		return strconv.FormatUint(v, 10)
	})
}

// items lists what Compare compares: in iptables mode the chains and
// rules of the proxy's chains (those starting with prefix) and the rules
// of built-in chains that jump to them.
func (r *Ruleset) items(prefix string) []string {
	var out []string
	if r.ipt != nil {
		for _, t := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
			for _, c := range r.ipt.Chains(t) {
				ours := strings.HasPrefix(string(c), prefix+"-")
				if ours {
					out = append(out, fmt.Sprintf("chain -t %s %s", t, c))
				}
				rules := r.ipt.Rules(t, c)
				for i := range rules {
					rules[i] = nfacctMatch.ReplaceAllString(rules[i], "")
				}
				for _, rule := range rules {
					if counted, ok := strings.CutPrefix(rule, localhostDest); ok && slices.Contains(rules, counted) {
						continue
					}
					if ours || (c.IsBuiltin(t) && jumpsToPrefix(rule, prefix)) {
						out = append(out, fmt.Sprintf("-t %s -A %s %s", t, c, rule))
					}
				}
			}
		}
		return out
	}
	nf, _ := nftFamily(r.family)
	r.nft.RLock()
	defer r.nft.RUnlock()
	tbl := r.nft.Tables[nf][r.table]
	if tbl == nil {
		return nil
	}
	for name, c := range tbl.Chains {
		out = append(out, "chain "+name)
		for _, rule := range c.Rules {
			out = append(out, fmt.Sprintf("rule %s: %s", name, canonical(rule.Rule)))
		}
	}
	for name, s := range tbl.Sets {
		out = append(out, "set "+name)
		if slices.Contains(s.Flags, "dynamic") {
			continue
		}
		for _, e := range s.Elements {
			out = append(out, fmt.Sprintf("element %s { %s }", name, joinKey(e.Key)))
		}
	}
	for name, m := range tbl.Maps {
		out = append(out, "map "+name)
		for _, e := range m.Elements {
			out = append(out, fmt.Sprintf("element %s { %s : %s }", name, joinKey(e.Key), joinKey(e.Value)))
		}
	}
	return out
}

// joinKey writes an element's key or value as nft does: a prefix of one
// address as the address alone.
func joinKey(parts []string) string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p
		if pfx, err := netip.ParsePrefix(p); err == nil && pfx.IsSingleIP() {
			out[i] = pfx.Addr().String()
		}
	}
	return strings.Join(out, " . ")
}

// jumpsToPrefix reports whether rule jumps or goes to a chain of prefix.
func jumpsToPrefix(rule, prefix string) bool {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && strings.HasPrefix(f[i+1], prefix+"-") {
			return true
		}
	}
	return false
}

// Grid returns the packets a drift check traces for services on a node:
// for every port of every Service, to each of its addresses of family
// (cluster IPs, external IPs, load-balancer ingress IPs) and, for a node
// port, to each of node.Addrs of family, one packet from each of node,
// pod (when node has a pod address of the family) and outside. Headless
// and ExternalName Services have none. The order follows services'.
func Grid(services []*v1.Service, family v1.IPFamily, node Node) []Packet {
	want4 := family == v1.IPv4Protocol
	sources := []Source{FromNode(), FromOutside()}
	for _, a := range node.PodAddr {
		if a.Is4() == want4 {
			sources = []Source{FromPod(), FromNode(), FromOutside()}
			break
		}
	}
	var out []Packet
	seen := map[Packet]bool{}
	add := func(s string, port int32, proto v1.Protocol) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Is4() != want4 || port <= 0 || port > 65535 {
			return
		}
		for _, from := range sources {
			p := Packet{From: from, Dest: netip.AddrPortFrom(a.Unmap(), uint16(port)), Protocol: proto}
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	for _, svc := range services {
		if svc == nil || svc.Spec.Type == v1.ServiceTypeExternalName {
			continue
		}
		for _, port := range svc.Spec.Ports {
			proto := port.Protocol
			if proto == "" {
				proto = v1.ProtocolTCP
			}
			ips := svc.Spec.ClusterIPs
			if len(ips) == 0 && svc.Spec.ClusterIP != "" {
				ips = []string{svc.Spec.ClusterIP}
			}
			for _, ip := range ips {
				add(ip, port.Port, proto)
			}
			for _, ip := range svc.Spec.ExternalIPs {
				add(ip, port.Port, proto)
			}
			for _, ing := range svc.Status.LoadBalancer.Ingress {
				add(ing.IP, port.Port, proto)
			}
			if port.NodePort != 0 {
				for _, a := range node.Addrs {
					add(a.String(), port.NodePort, proto)
				}
			}
		}
	}
	return out
}

// WriteJSON writes d as indented JSON.
func (d *Drift) WriteJSON(w io.Writer) error { return writeJSON(w, d) }

// WriteText writes d for a reader: each packet that goes elsewhere than
// wanted, with both sets of outcomes, then what is missing and extra.
func (d *Drift) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s mode, %s: %d packet(s) traced, %d differ; %d missing, %d extra\n",
		d.Mode, d.Family, d.Traced, len(d.Packets), len(d.Missing), len(d.Extra))
	for _, p := range d.Packets {
		fmt.Fprintf(&b, "packet %s\n", p.Packet)
		for _, side := range []struct {
			name string
			outs []Outcome
		}{{"live", p.Live}, {"want", p.Want}} {
			for _, o := range side.outs {
				fmt.Fprintf(&b, "  %s: %s\n", side.name, o.Summary())
				if o.Rule != "" {
					fmt.Fprintf(&b, "        by: %s\n", o.Rule)
				}
			}
		}
	}
	for _, m := range d.Missing {
		fmt.Fprintf(&b, "missing: %s\n", m)
	}
	for _, x := range d.Extra {
		fmt.Fprintf(&b, "extra: %s\n", x)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
