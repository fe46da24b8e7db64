package ipvsmode

import (
	"context"

	"github.com/proxykit/proxykit/iptables"
)

// tableChain is a chain of a table.
type tableChain struct {
	table iptables.Table
	chain iptables.Chain
}

// JumpRules returns the rules that send traffic from the built-in chains
// into IPVS mode's chains. The restore payload cannot hold them, since
// declaring a built-in chain would flush other programs' rules; add them
// with iptables.EnsureJumps, as [Names.EnsureJumpRules] does. Those that IPVS
// mode shares with the iptables rule writer of the same prefix
// (iptables.Writer.JumpRules) are identical, so that switching modes
// leaves no duplicate; with another prefix than kube-proxy's, comments
// end with the prefix as there. The slice is new on every call.
func (n *Names) JumpRules() []iptables.JumpRule {
	jump := iptables.Jump
	c, cm := n.chains, n.chains.JumpComment
	return []iptables.JumpRule{
		jump(iptables.TableNAT, iptables.ChainPrerouting, c.Services(), cm("kubernetes service portals"), false),
		jump(iptables.TableNAT, iptables.ChainOutput, c.Services(), cm("kubernetes service portals"), false),
		jump(iptables.TableNAT, iptables.ChainPostrouting, c.Postrouting(), cm("kubernetes postrouting rules"), false),
		jump(iptables.TableFilter, iptables.ChainForward, c.Forward(), cm("kubernetes forwarding rules"), false),
		jump(iptables.TableFilter, iptables.ChainInput, n.nodePort, cm("kubernetes health check rules"), false),
		jump(iptables.TableFilter, iptables.ChainInput, c.ProxyFirewall(), cm("kubernetes load balancer firewall"), true),
		jump(iptables.TableFilter, iptables.ChainForward, c.ProxyFirewall(), cm("kubernetes load balancer firewall"), true),
		jump(iptables.TableFilter, iptables.ChainInput, n.ipvsFilter, cm("kubernetes ipvs access filter"), false),
	}
}

// EnsureJumpRules is iptables.EnsureJumps of IPVS mode's [Names.JumpRules]. Call
// it before applying a payload: it costs a few iptables commands, whereas
// the payload cannot recreate a jump that another program deleted.
func (n *Names) EnsureJumpRules(ctx context.Context, ipt iptables.Interface) error {
	return iptables.EnsureJumps(ctx, ipt, n.JumpRules())
}

// render writes the payload into t.buf from the sets' members: rules
// match whole sets, so the payload has a rule per non-empty set rather
// than per service, and rules for empty sets are left out.
func (t *Writer) render() {
	b := &t.buf
	b.Reset()
	b.Write("*nat")
	t.declare(iptables.TableNAT)
	n := t.modeNames
	svc := string(n.chains.Services())
	masq := string(n.chains.MarkMasq())
	// The node's own connections from a loopback address are not
	// service traffic kube-proxy handles in IPVS mode: node ports on
	// localhost are not served.
	b.Write("-A", svc, "-s", t.loopback, "-j", "RETURN")
	if t.has(setClusterIP) {
		name := t.setNames[setClusterIP]
		b.Words("-A", svc, "-m", "comment", "--comment", `"cluster IP traffic to masquerade"`, "-m", "set", "--match-set", name)
		switch {
		case t.cfg.Node.MasqueradeAll:
			b.Write("dst,dst", "-j", masq)
		case t.local.Enabled():
			b.Words("dst,dst").Words(t.local.IfNotLocal()...).Write("-j", masq)
		default:
			// Without the pod network, masquerade what the node sends
			// from a service address: the kernel picks the address of
			// the dummy interface as the source of a connection to
			// another address there.
			b.Write("src,dst", "-j", masq)
		}
		// Accept service traffic here, so that no later rule (another
		// program's DNAT to local ports) takes it from IPVS.
		t.match(svc, setClusterIP, "dst,dst", "ACCEPT")
	}
	if t.has(setExternalIP) {
		t.match(svc, setExternalIP, "dst,dst", masq)
		t.match(svc, setExternalIP, "dst,dst", "ACCEPT")
	}
	if t.has(setExternalIPLocal) {
		t.match(svc, setExternalIPLocal, "dst,dst", "ACCEPT")
	}
	if t.has(setLoadBalancer) {
		t.match(svc, setLoadBalancer, "dst,dst", string(n.loadBalancer))
		t.match(svc, setLoadBalancer, "dst,dst", "ACCEPT")
		if t.has(setLoadBalancerLocal) {
			t.match(string(n.loadBalancer), setLoadBalancerLocal, "dst,dst", "RETURN")
		}
		b.Write("-A", string(n.loadBalancer), "-j", masq)
	}
	if t.hasNodePorts() {
		// Last, after every service address has been accepted: the node
		// ports' sets hold ports alone, which would match those too.
		if t.nodePortDst == nil {
			b.Write("-A", svc, "-m", "addrtype", "--dst-type", "LOCAL", "-j", string(n.nodePort))
		}
		for _, dst := range t.nodePortDst {
			b.Write("-A", svc, "-d", dst, "-m", "addrtype", "--dst-type", "LOCAL", "-j", string(n.nodePort))
		}
		np := string(n.nodePort)
		for _, p := range []struct {
			proto      string
			all, local setKind
			dirs       string
		}{
			{"tcp", setNodePortTCP, setNodePortLocalTCP, "dst"},
			{"udp", setNodePortUDP, setNodePortLocalUDP, "dst"},
			{"sctp", setNodePortSCTP, setNodePortLocalSCTP, "dst,dst"},
		} {
			if t.has(p.local) {
				b.Words("-A", np, "-p", p.proto)
				t.match("", p.local, p.dirs, "RETURN")
			}
			if t.has(p.all) {
				b.Words("-A", np, "-p", p.proto)
				t.match("", p.all, p.dirs, masq)
			}
		}
	}
	b.Write("-A", masq, "-j", "MARK", "--or-mark", t.mark)
	post := string(n.chains.Postrouting())
	if t.has(setLoopBack) {
		b.Words("-A", post, "-m", "comment", "--comment", `"endpoint reaching itself through a service"`)
		t.match("", setLoopBack, "dst,dst,src", "MASQUERADE")
	}
	b.Write("-A", post, "-m", "mark", "!", "--mark", t.markMask, "-j", "RETURN")
	// Clear the mark, so that a packet that goes through the stack again
	// is not masqueraded twice.
	b.Write("-A", post, "-j", "MARK", "--xor-mark", t.mark)
	b.Words("-A", post, "-m", "comment", "--comment", `"kubernetes service traffic requiring SNAT"`, "-j", "MASQUERADE")
	if t.cfg.RandomFully {
		b.Words("--random-fully")
	}
	b.EndLine()
	b.Write("COMMIT")

	b.Write("*filter")
	t.declare(iptables.TableFilter)
	fwd := string(n.chains.Forward())
	// Marked traffic is service traffic: forward it, and its replies, even
	// under a FORWARD policy of DROP.
	b.Write("-A", fwd, "-m", "comment", "--comment", `"kubernetes forwarding rules"`, "-m", "mark", "--mark", t.markMask, "-j", "ACCEPT")
	b.Write("-A", fwd, "-m", "comment", "--comment", `"kubernetes forwarding conntrack rule"`, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	if t.has(setHealthCheckNodePort) {
		t.match(string(n.nodePort), setHealthCheckNodePort, "dst", "ACCEPT")
	}
	if t.has(setLoadBalancerFW) {
		src := string(n.sourceRanges)
		t.match(string(n.chains.ProxyFirewall()), setLoadBalancerFW, "dst,dst", src)
		t.match(src, setLoadBalancerSourceCIDR, "dst,dst,src", "RETURN")
		if t.has(setLoadBalancerSourceIP) {
			t.match(src, setLoadBalancerSourceIP, "dst,dst,src", "RETURN")
		}
		b.Write("-A", src, "-j", "DROP")
	}
	if t.has(setIPVSIPs) {
		filter := string(n.ipvsFilter)
		for _, k := range []setKind{setLoadBalancer, setClusterIP, setExternalIP, setExternalIPLocal} {
			if t.has(k) {
				t.match(filter, k, "dst,dst", "RETURN")
			}
		}
		if t.has(setHealthCheckNodePort) {
			t.match(filter, setHealthCheckNodePort, "dst", "RETURN")
		}
		b.Words("-A", filter, "-m", "conntrack", "--ctstate", "NEW")
		t.match("", setIPVSIPs, "dst", "REJECT")
	}
	b.Write("COMMIT")
}

func (t *Writer) declare(table iptables.Table) {
	for _, d := range t.modeNames.decls[table] {
		t.buf.Write(d, "-", "[0:0]")
	}
}

// match writes "-A CHAIN -m set --match-set SET DIRS -j TARGET", or, with
// chain "", adds the words after "-A CHAIN" to the line already begun.
func (t *Writer) match(chain string, k setKind, dirs, target string) {
	if chain != "" {
		t.buf.Words("-A", chain)
	}
	t.buf.Write("-m", "set", "--match-set", t.setNames[k], dirs, "-j", target)
}

func (t *Writer) has(k setKind) bool { return len(t.entries[k]) > 0 }

func (t *Writer) hasNodePorts() bool {
	for _, k := range []setKind{setNodePortTCP, setNodePortUDP, setNodePortSCTP} {
		if t.has(k) {
			return true
		}
	}
	return false
}
