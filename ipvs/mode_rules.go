package ipvs

import (
	"context"

	"github.com/proxykit/proxykit/iptables"
)

// The chains of IPVS mode that package iptables does not name, as
// kube-proxy names them.
const (
	// nodePortChain (nat) marks node-port traffic for masquerading unless
	// its policy is Local; (filter) accepts health-check node ports.
	nodePortChain iptables.Chain = "KUBE-NODE-PORT"
	// loadBalancerChain (nat) marks load-balancer traffic for
	// masquerading unless its policy is Local.
	loadBalancerChain iptables.Chain = "KUBE-LOAD-BALANCER"
	// sourceRangesChain (filter) drops load-balancer traffic from outside
	// the service's loadBalancerSourceRanges.
	sourceRangesChain iptables.Chain = "KUBE-SOURCE-RANGES-FIREWALL"
	// ipvsFilterChain (filter) refuses new connections to a service
	// address on a port no service has there (kubernetes#72236): the
	// address is the node's own, on the dummy interface, and would
	// otherwise reach whatever listens on the node.
	ipvsFilterChain iptables.Chain = "KUBE-IPVS-FILTER"
)

// tableChain is a chain of a table.
type tableChain struct {
	table iptables.Table
	chain iptables.Chain
}

// modeChains are the chains the payload declares, in the order it
// declares them.
var modeChains = []tableChain{
	{iptables.TableNAT, iptables.KubeServicesChain},
	{iptables.TableNAT, iptables.KubePostroutingChain},
	{iptables.TableNAT, nodePortChain},
	{iptables.TableNAT, loadBalancerChain},
	{iptables.TableNAT, iptables.KubeMarkMasqChain},
	{iptables.TableFilter, iptables.KubeForwardChain},
	{iptables.TableFilter, nodePortChain},
	{iptables.TableFilter, iptables.KubeProxyFirewallChain},
	{iptables.TableFilter, sourceRangesChain},
	{iptables.TableFilter, ipvsFilterChain},
}

// JumpRules returns the rules that send traffic from the built-in chains
// into IPVS mode's chains. The restore payload cannot hold them, since
// declaring a built-in chain would flush other programs' rules; add them
// with [EnsureJumpRules]. Those that IPVS mode shares with the iptables
// rule writer (iptables.JumpRules) are identical, so that switching modes
// leaves no duplicate. The slice is new on every call.
func JumpRules() []iptables.JumpRule {
	jump := iptables.Jump
	return []iptables.JumpRule{
		jump(iptables.TableNAT, iptables.ChainPrerouting, iptables.KubeServicesChain, "kubernetes service portals", false),
		jump(iptables.TableNAT, iptables.ChainOutput, iptables.KubeServicesChain, "kubernetes service portals", false),
		jump(iptables.TableNAT, iptables.ChainPostrouting, iptables.KubePostroutingChain, "kubernetes postrouting rules", false),
		jump(iptables.TableFilter, iptables.ChainForward, iptables.KubeForwardChain, "kubernetes forwarding rules", false),
		jump(iptables.TableFilter, iptables.ChainInput, nodePortChain, "kubernetes health check rules", false),
		jump(iptables.TableFilter, iptables.ChainInput, iptables.KubeProxyFirewallChain, "kubernetes load balancer firewall", true),
		jump(iptables.TableFilter, iptables.ChainForward, iptables.KubeProxyFirewallChain, "kubernetes load balancer firewall", true),
		jump(iptables.TableFilter, iptables.ChainInput, ipvsFilterChain, "kubernetes ipvs access filter", false),
	}
}

// EnsureJumpRules is iptables.EnsureJumps of IPVS mode's [JumpRules]. Call
// it before applying a payload: it costs a few iptables commands, whereas
// the payload cannot recreate a jump that another program deleted.
func EnsureJumpRules(ctx context.Context, ipt iptables.Interface) error {
	return iptables.EnsureJumps(ctx, ipt, JumpRules())
}

// render writes the payload into t.buf from the sets' members: rules
// match whole sets, so the payload has a rule per non-empty set rather
// than per service, and rules for empty sets are left out.
func (t *Translator) render() {
	b := &t.buf
	b.Reset()
	b.Write("*nat")
	t.declare(iptables.TableNAT)
	svc := string(iptables.KubeServicesChain)
	masq := string(iptables.KubeMarkMasqChain)
	// The node's own connections from a loopback address are not
	// service traffic kube-proxy handles in IPVS mode: node ports on
	// localhost are not served.
	b.Write("-A", svc, "-s", t.loopback, "-j", "RETURN")
	if t.has(setClusterIP) {
		name := t.setNames[setClusterIP]
		b.Words("-A", svc, "-m", "comment", "--comment", `"cluster IP traffic to masquerade"`, "-m", "set", "--match-set", name)
		switch {
		case t.cfg.MasqueradeAll:
			b.Write("dst,dst", "-j", masq)
		case t.clusterCIDR != "":
			b.Write("dst,dst", "!", "-s", t.clusterCIDR, "-j", masq)
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
		t.match(svc, setLoadBalancer, "dst,dst", string(loadBalancerChain))
		t.match(svc, setLoadBalancer, "dst,dst", "ACCEPT")
		if t.has(setLoadBalancerLocal) {
			t.match(string(loadBalancerChain), setLoadBalancerLocal, "dst,dst", "RETURN")
		}
		b.Write("-A", string(loadBalancerChain), "-j", masq)
	}
	if t.hasNodePorts() {
		// Last, after every service address has been accepted: the node
		// ports' sets hold ports alone, which would match those too.
		if t.nodePortDst == nil {
			b.Write("-A", svc, "-m", "addrtype", "--dst-type", "LOCAL", "-j", string(nodePortChain))
		}
		for _, dst := range t.nodePortDst {
			b.Write("-A", svc, "-d", dst, "-m", "addrtype", "--dst-type", "LOCAL", "-j", string(nodePortChain))
		}
		np := string(nodePortChain)
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
	post := string(iptables.KubePostroutingChain)
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
	fwd := string(iptables.KubeForwardChain)
	// Marked traffic is service traffic: forward it, and its replies, even
	// under a FORWARD policy of DROP.
	b.Write("-A", fwd, "-m", "comment", "--comment", `"kubernetes forwarding rules"`, "-m", "mark", "--mark", t.markMask, "-j", "ACCEPT")
	b.Write("-A", fwd, "-m", "comment", "--comment", `"kubernetes forwarding conntrack rule"`, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	if t.has(setHealthCheckNodePort) {
		t.match(string(nodePortChain), setHealthCheckNodePort, "dst", "ACCEPT")
	}
	if t.has(setLoadBalancerFW) {
		src := string(sourceRangesChain)
		t.match(string(iptables.KubeProxyFirewallChain), setLoadBalancerFW, "dst,dst", src)
		t.match(src, setLoadBalancerSourceCIDR, "dst,dst,src", "RETURN")
		if t.has(setLoadBalancerSourceIP) {
			t.match(src, setLoadBalancerSourceIP, "dst,dst,src", "RETURN")
		}
		b.Write("-A", src, "-j", "DROP")
	}
	if t.has(setIPVSIPs) {
		filter := string(ipvsFilterChain)
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

// chainDecls are the payload's chain declarations (":CHAIN"), per table.
var chainDecls = func() map[iptables.Table][]string {
	m := map[iptables.Table][]string{}
	for _, tc := range modeChains {
		m[tc.table] = append(m[tc.table], ":"+string(tc.chain))
	}
	return m
}()

func (t *Translator) declare(table iptables.Table) {
	for _, d := range chainDecls[table] {
		t.buf.Write(d, "-", "[0:0]")
	}
}

// match writes "-A CHAIN -m set --match-set SET DIRS -j TARGET", or, with
// chain "", adds the words after "-A CHAIN" to the line already begun.
func (t *Translator) match(chain string, k setKind, dirs, target string) {
	if chain != "" {
		t.buf.Words("-A", chain)
	}
	t.buf.Write("-m", "set", "--match-set", t.setNames[k], dirs, "-j", target)
}

func (t *Translator) has(k setKind) bool { return len(t.entries[k]) > 0 }

func (t *Translator) hasNodePorts() bool {
	for _, k := range []setKind{setNodePortTCP, setNodePortUDP, setNodePortSCTP} {
		if t.has(k) {
			return true
		}
	}
	return false
}
