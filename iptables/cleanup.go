package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ProxyCanaryChain is the chain a service proxy passes to
// [Interface.Monitor], named as kube-proxy names it ([ChainNames.Canary]
// for another prefix). [ChainNames.Cleanup] removes it from every table it
// is in.
const ProxyCanaryChain Chain = "KUBE-PROXY-CANARY"

// cleanupTables are the tables Cleanup looks at: the two the Writer
// writes, and mangle, where a proxy's canary lives too.
var cleanupTables = []Table{TableFilter, TableNAT, TableMangle}

// ChainOwner reports whether chain c of table t belongs to the proxy that
// [CleanupChains] cleans up after.
type ChainOwner func(t Table, c Chain) bool

// IsWriterChain is the [ChainOwner] of [ChainNames.Cleanup]: it reports
// whether chain c of table t is made by a Writer with these names or by its
// jump rules, or is the proxy's canary. It accepts only chains with these
// names' prefix, so given to [CleanupChains] it leaves another prefix's
// chains and the jumps to them alone. Chains that other programs make with
// similar names (the kubelet's KUBE-FIREWALL, KUBE-KUBELET-CANARY,
// KUBE-IPTABLES-HINT, KUBE-MARK-DROP) are not the writer's.
func (n *ChainNames) IsWriterChain(t Table, c Chain) bool {
	if c == n.canary {
		return true
	}
	switch t {
	case TableNAT:
		switch c {
		case n.services, n.nodePorts, n.postrouting, n.markMasq:
			return true
		}
		return n.IsServiceChain(c)
	case TableFilter:
		switch c {
		case n.services, n.external, n.forward, n.nodePorts, n.fw:
			return true
		}
	}
	return false
}

// Cleanup removes what a service proxy built on this package, with these
// names, made in ipt's IP family: the Writer's chains (with
// [DefaultChainNames], the top-level KUBE-SERVICES, KUBE-NODEPORTS,
// KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD and
// KUBE-PROXY-FIREWALL, and every per-service and per-endpoint chain in the
// nat table), the canary chain in any table, and every rule in a built-in
// chain that jumps to one of them (the rules of [Writer.JumpRules], and any
// other jump a proxy may have added). Nothing else is touched: chains of
// other programs, including the kubelet's KUBE-* chains, and the chains of
// another prefix, with the built-in chains' jumps to them, keep their rules.
//
// Each table is changed with one iptables-restore, so it is cleaned
// entirely or not at all. A chain of the proxy that a rule of another
// program's chain still jumps to (a CNI plugin jumping to KUBE-MARK-MASQ,
// say) cannot be deleted; it is left as it is, with the chains it jumps to,
// and the error names it and the chain that uses it, while the rest is
// removed. A table with nothing of the proxy's in it is not restored at
// all, so a second Cleanup changes nothing.
//
// It returns how many chains it deleted. Errors name the table; they are
// joined, so that a failure in one table does not stop the others.
func (n *ChainNames) Cleanup(ctx context.Context, ipt Interface) (int, error) {
	return CleanupChains(ctx, ipt, n.IsWriterChain)
}

// CleanupChains is [ChainNames.Cleanup] for the chains that owned says are
// the proxy's, in the filter, nat and mangle tables: a proxy whose chains
// differ from the Writer's (IPVS mode, or a proxier that ran in more than
// one mode, with an owner that joins theirs) removes them the same way,
// one iptables-restore per table, keeping what other programs still jump
// to.
func CleanupChains(ctx context.Context, ipt Interface, owned ChainOwner) (int, error) {
	var errs []error
	deleted := 0
	var save bytes.Buffer
	for _, t := range cleanupTables {
		save.Reset()
		if err := ipt.SaveInto(ctx, t, &save); err != nil {
			errs = append(errs, fmt.Errorf("cleanup of %s table %s: %w", ipt.Family(), t, err))
			continue
		}
		plan := planCleanup(t, save.Bytes(), owned)
		if len(plan.chains) > 0 || len(plan.jumps) > 0 {
			if err := ipt.Restore(ctx, t, plan.payload(t), NoFlushTables, NoRestoreCounters); err != nil {
				errs = append(errs, fmt.Errorf("cleanup of %s table %s: %w", ipt.Family(), t, err))
				continue
			}
			deleted += len(plan.chains)
		}
		if len(plan.kept) > 0 {
			errs = append(errs, fmt.Errorf("cleanup of %s table %s: %w", ipt.Family(), t, plan.keptError()))
		}
	}
	return deleted, errors.Join(errs...)
}

// cleanupPlan is what Cleanup does to one table.
type cleanupPlan struct {
	// chains are the proxy's chains to flush and delete, in save order.
	chains []Chain
	// jumps are the rules of built-in chains to delete, as "CHAIN RULE"
	// (what follows "-A " in the save).
	jumps []string
	// kept maps each of the proxy's chains that must stay to the other
	// program's chain that jumps to it ("" for one kept only because a
	// kept chain jumps to it).
	kept map[Chain]Chain
}

// savedRule is one "-A CHAIN ..." line of a save.
type savedRule struct {
	chain  Chain
	target Chain
	// spec is the line without its leading "-A ".
	spec string
}

// planCleanup reads one table's iptables-save output and decides what to
// delete of the chains owned says are the proxy's.
func planCleanup(t Table, save []byte, owned ChainOwner) cleanupPlan {
	var rules []savedRule
	for line := range bytes.Lines(save) {
		line = bytes.TrimRight(line, "\r\n")
		spec, ok := bytes.CutPrefix(line, []byte("-A "))
		if !ok {
			continue
		}
		chain, _, _ := bytes.Cut(spec, []byte(" "))
		rules = append(rules, savedRule{chain: Chain(chain), target: ruleTarget(spec), spec: string(spec)})
	}
	var ours []Chain
	for _, c := range ChainsFromSave(save) {
		if owned(t, c) {
			ours = append(ours, c)
		}
	}
	p := cleanupPlan{kept: map[Chain]Chain{}}
	// A chain of the proxy that another program's chain jumps to stays,
	// and so does everything it jumps to, or deleting those would fail.
	for _, r := range rules {
		if r.chain.IsBuiltin(t) || owned(t, r.chain) || !owned(t, r.target) {
			continue
		}
		if _, ok := p.kept[r.target]; !ok {
			p.kept[r.target] = r.chain
		}
	}
	for grew := len(p.kept) > 0; grew; {
		grew = false
		for _, r := range rules {
			if _, from := p.kept[r.chain]; !from || !owned(t, r.target) {
				continue
			}
			if _, ok := p.kept[r.target]; !ok {
				p.kept[r.target] = ""
				grew = true
			}
		}
	}
	for _, c := range ours {
		if _, ok := p.kept[c]; !ok {
			p.chains = append(p.chains, c)
		}
	}
	for _, r := range rules {
		if r.chain.IsBuiltin(t) && slices.Contains(p.chains, r.target) {
			p.jumps = append(p.jumps, r.spec)
		}
	}
	return p
}

// payload is the iptables-restore input that carries out the plan:
// declaring a chain flushes it, which also removes the jumps between the
// proxy's chains, so that every one of them can then be deleted.
func (p cleanupPlan) payload(t Table) []byte {
	b := NewLineBuffer()
	b.Write("*" + string(t))
	for _, c := range p.chains {
		b.Write(":"+string(c), "-", "[0:0]")
	}
	for _, j := range p.jumps {
		b.Write("-D", j)
	}
	for _, c := range p.chains {
		b.Write("-X", string(c))
	}
	b.Write("COMMIT")
	return b.Bytes()
}

func (p cleanupPlan) keptError() error {
	var used []string
	for c, by := range p.kept {
		if by != "" {
			used = append(used, fmt.Sprintf("%s (used by %s)", c, by))
		}
	}
	slices.Sort(used)
	return fmt.Errorf("kept %d chains that other programs' rules still jump to, directly or through each other: %s", len(p.kept), strings.Join(used, ", "))
}

// ruleTarget returns the chain or target that a saved rule jumps or goes to
// ("-j X" or "-g X"), or "" if it has none. Quoted words (comments) are
// skipped, so a comment that mentions "-j X" does not count.
func ruleTarget(spec []byte) Chain {
	prev := ""
	for len(spec) > 0 {
		spec = bytes.TrimLeft(spec, " ")
		if len(spec) == 0 {
			break
		}
		if spec[0] == '"' {
			spec = spec[closingQuote(spec):]
			prev = ""
			continue
		}
		var word []byte
		word, spec, _ = bytes.Cut(spec, []byte(" "))
		if prev == "-j" || prev == "-g" {
			return Chain(word)
		}
		prev = string(word)
	}
	return ""
}

// closingQuote returns the index just past the quoted word that s starts
// with, honouring backslash escapes as iptables-save writes them, or len(s)
// if the quote is never closed.
func closingQuote(s []byte) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(s)
}
