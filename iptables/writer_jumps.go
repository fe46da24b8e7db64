package iptables

import (
	"context"
	"fmt"
)

// JumpRule is a rule in a built-in chain that sends traffic into one of the
// writer's top-level chains. The restore payload cannot hold these rules,
// since declaring a built-in chain in it would touch rules that belong to
// other programs; the caller adds them with [Writer.EnsureJumpRules] before
// applying a full sync.
type JumpRule struct {
	// Table and Chain locate the rule: Chain is a built-in chain.
	Table Table
	Chain Chain
	// Target is the writer's chain the rule jumps to.
	Target Chain
	// Args is the rule as Interface.EnsureRule takes it, ending with
	// "-j", Target.
	Args []string
}

// Jump returns the rule in built-in chain of table that jumps to target,
// with comment; with newOnly it matches only packets of new connections
// ("-m conntrack --ctstate NEW").
func Jump(table Table, chain, target Chain, comment string, newOnly bool) JumpRule {
	var args []string
	if newOnly {
		args = []string{"-m", "conntrack", "--ctstate", "NEW"}
	}
	args = append(args, "-m", "comment", "--comment", comment, "-j", string(target))
	return JumpRule{Table: table, Chain: chain, Target: target, Args: args}
}

// jumpRules returns the rules that connect the built-in chains to the
// chains of these names, as kube-proxy has them, without the jumps to
// KUBE-FIREWALL that only a writer with LocalhostNodePorts needs: callers
// outside the writer get the whole list from [Writer.JumpRules]. With a
// prefix other than [DefaultChainPrefix] each comment ends with the prefix
// in brackets ("kubernetes service portals (PROXYB)"), so that an operator
// reading the built-in chains sees which proxy each jump belongs to.
func (n *ChainNames) jumpRules() []JumpRule {
	c := func(comment string) string { return n.JumpComment(comment) }
	return []JumpRule{
		Jump(TableFilter, ChainInput, n.external, c("kubernetes externally-visible service portals"), true),
		Jump(TableFilter, ChainForward, n.external, c("kubernetes externally-visible service portals"), true),
		Jump(TableFilter, ChainInput, n.nodePorts, c("kubernetes health check service ports"), false),
		Jump(TableFilter, ChainForward, n.services, c("kubernetes service portals"), true),
		Jump(TableFilter, ChainOutput, n.services, c("kubernetes service portals"), true),
		Jump(TableFilter, ChainForward, n.forward, c("kubernetes forwarding rules"), false),
		Jump(TableFilter, ChainInput, n.fw, c("kubernetes load balancer firewall"), true),
		Jump(TableFilter, ChainOutput, n.fw, c("kubernetes load balancer firewall"), true),
		Jump(TableFilter, ChainForward, n.fw, c("kubernetes load balancer firewall"), true),
		Jump(TableNAT, ChainOutput, n.services, c("kubernetes service portals"), false),
		Jump(TableNAT, ChainPrerouting, n.services, c("kubernetes service portals"), false),
		Jump(TableNAT, ChainPostrouting, n.postrouting, c("kubernetes postrouting rules"), false),
	}
}

// JumpComment returns comment as a jump rule from a built-in chain carries
// it for these names: unchanged with [DefaultChainPrefix], as kube-proxy
// writes it, or followed by " (PREFIX)" otherwise.
func (n *ChainNames) JumpComment(comment string) string {
	if n.prefix == DefaultChainPrefix {
		return comment
	}
	return comment + " (" + n.prefix + ")"
}

// kubeFirewallChain is the filter chain that drops traffic from other
// hosts to the loopback range; the kubelet makes it too, so Cleanup
// leaves it. It keeps kube-proxy's name whatever the chain prefix: every
// proxy on the node writes the same rule into it, and the rule guards the
// node, not one proxy's services.
const kubeFirewallChain Chain = "KUBE-FIREWALL"

// localhostJumpRules are the jumps to kubeFirewallChain, as the kubelet
// and kube-proxy write them.
func localhostJumpRules() []JumpRule {
	var rules []JumpRule
	for _, c := range []Chain{ChainInput, ChainOutput} {
		rules = append(rules, JumpRule{Table: TableFilter, Chain: c, Target: kubeFirewallChain, Args: []string{"-j", string(kubeFirewallChain)}})
	}
	return rules
}

// EnsureJumpRules is EnsureJumps of the writer's JumpRules, those to
// KUBE-FIREWALL included: without them KUBE-FIREWALL's drop rule is never
// reached and, with LocalhostNodePorts, the loopback node ports are open
// to other hosts (CVE-2020-8558). It is the one way the package offers to
// add the writer's jumps; the writer is what knows which it needs. Call it
// before applying a full sync: at start-up, and when the rules may have
// been flushed by someone else.
func (w *Writer) EnsureJumpRules(ctx context.Context, ipt Interface) error {
	return EnsureJumps(ctx, ipt, w.JumpRules())
}

// EnsureJumps creates the chains that rules jump to, if missing, and puts
// each rule at the start of its built-in chain unless it is there already.
// It stops at the first error, which names the chain.
func EnsureJumps(ctx context.Context, ipt Interface, rules []JumpRule) error {
	for _, j := range rules {
		if _, err := ipt.EnsureChain(ctx, j.Table, j.Target); err != nil {
			return fmt.Errorf("creating chain %s in table %s: %w", j.Target, j.Table, err)
		}
		if _, err := ipt.EnsureRule(ctx, Prepend, j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("jump from %s to %s in table %s: %w", j.Chain, j.Target, j.Table, err)
		}
	}
	return nil
}
