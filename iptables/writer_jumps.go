package iptables

import (
	"context"
	"fmt"
)

// JumpRule is a rule in a built-in chain that sends traffic into one of the
// writer's top-level chains. The restore payload cannot hold these rules,
// since declaring a built-in chain in it would touch rules that belong to
// other programs; the caller adds them with EnsureJumpRules before applying
// a full sync.
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

// JumpRules returns the rules that connect the built-in chains to the
// writer's chains, as kube-proxy has them. The slice is new on every call.
func JumpRules() []JumpRule {
	newOnly := []string{"-m", "conntrack", "--ctstate", "NEW"}
	jump := func(t Table, c, target Chain, comment string, match []string) JumpRule {
		args := append(append([]string(nil), match...), "-m", "comment", "--comment", comment, "-j", string(target))
		return JumpRule{Table: t, Chain: c, Target: target, Args: args}
	}
	return []JumpRule{
		jump(TableFilter, ChainInput, KubeExternalServicesChain, "kubernetes externally-visible service portals", newOnly),
		jump(TableFilter, ChainForward, KubeExternalServicesChain, "kubernetes externally-visible service portals", newOnly),
		jump(TableFilter, ChainInput, KubeNodePortsChain, "kubernetes health check service ports", nil),
		jump(TableFilter, ChainForward, KubeServicesChain, "kubernetes service portals", newOnly),
		jump(TableFilter, ChainOutput, KubeServicesChain, "kubernetes service portals", newOnly),
		jump(TableFilter, ChainForward, KubeForwardChain, "kubernetes forwarding rules", nil),
		jump(TableFilter, ChainInput, KubeProxyFirewallChain, "kubernetes load balancer firewall", newOnly),
		jump(TableFilter, ChainOutput, KubeProxyFirewallChain, "kubernetes load balancer firewall", newOnly),
		jump(TableFilter, ChainForward, KubeProxyFirewallChain, "kubernetes load balancer firewall", newOnly),
		jump(TableNAT, ChainOutput, KubeServicesChain, "kubernetes service portals", nil),
		jump(TableNAT, ChainPrerouting, KubeServicesChain, "kubernetes service portals", nil),
		jump(TableNAT, ChainPostrouting, KubePostroutingChain, "kubernetes postrouting rules", nil),
	}
}

// EnsureJumpRules creates the writer's top-level chains that the built-in
// chains jump to, if missing, and puts each jump rule of JumpRules at the
// start of its built-in chain unless it is there already. Call it before
// applying a full sync: at start-up, and when the rules may have been
// flushed by someone else. It stops at the first error, which names the
// chain.
func EnsureJumpRules(ctx context.Context, ipt Interface) error {
	for _, j := range JumpRules() {
		if _, err := ipt.EnsureChain(ctx, j.Table, j.Target); err != nil {
			return fmt.Errorf("creating chain %s in table %s: %w", j.Target, j.Table, err)
		}
		if _, err := ipt.EnsureRule(ctx, Prepend, j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("jump from %s to %s in table %s: %w", j.Chain, j.Target, j.Table, err)
		}
	}
	return nil
}
