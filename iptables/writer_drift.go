package iptables

import (
	"bytes"
	"context"
	"fmt"
	"strings"
)

// maxDriftExamples bounds the rules a Drift names, so that a flushed chain
// of 10,000 services makes a log line, not a log page.
const maxDriftExamples = 10

// Drift is what [Writer.CheckDrift] found different between the rules in
// the kernel and what the writer last applied: per-service rules of the
// top-level chains, and the rules of per-service and per-endpoint chains.
type Drift struct {
	// Missing counts the rules the writer applied that the kernel no
	// longer holds; Unexpected the rules the kernel holds that the writer
	// did not apply or has deleted since.
	Missing, Unexpected int
	// Examples describes up to ten of those rules or chains, each as
	// "missing nat KUBE-SERVICES: \"ns/svc:p cluster IP\" -j KUBE-SVC-...",
	// "unexpected ...", "missing nat KUBE-SEP-...: the whole chain" or
	// "changed nat KUBE-SVC-...: 10 rules, want 11, or other targets".
	Examples []string
}

// Found reports whether there is any drift.
func (d Drift) Found() bool { return d.Missing > 0 || d.Unexpected > 0 }

// ruleKey identifies a top-level rule by what survives the way iptables
// prints rules back (-S and iptables-save reorder matches and add prefix
// lengths): its chain, its comment and its target. Every per-service rule
// the writer puts in a top-level chain has a comment naming its service
// port and why the rule exists.
type ruleKey struct {
	chain   topChain
	comment string
	target  string
}

// describeRule names the rule of k for a log, in the writer's chain names.
func (w *Writer) describeRule(k ruleKey) string {
	table := TableFilter
	if k.chain.isNAT() {
		table = TableNAT
	}
	return fmt.Sprintf("%s %s: %q -j %s", table, w.topChainName(k.chain), k.comment, k.target)
}

// CheckDrift compares the rules the writer applied with those in the
// kernel, read with ipt. When they differ it makes the next Sync full,
// which rewrites every chain the writer owns, and returns what it found.
// It compares two things:
//
//   - The per-service rules of the top-level chains (nat KUBE-SERVICES and
//     KUBE-NODEPORTS; filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES,
//     KUBE-NODEPORTS and KUBE-PROXY-FIREWALL), by chain, comment and
//     target: a service's jump deleted, or a jump to a service chain
//     added. Every check reads them.
//   - The per-service and per-endpoint chains (KUBE-SVC-, KUBE-SVL-,
//     KUBE-EXT-, KUBE-FW- and KUBE-SEP-), by their number of rules and the
//     targets of those rules with their arguments ("-j KUBE-SEP-...",
//     "-j DNAT --to-destination 10.0.0.1:8080"): a rule deleted or added,
//     a chain flushed or deleted, an endpoint redirected. On the legacy
//     backend every check reads them; on the nft backend the first check
//     does, and then one in every [NFTServiceChainCheckInterval].
//
// So drift is found by the next check (top-level chains, and on legacy
// everything), or within NFTServiceChainCheckInterval checks (service
// chains on nft), and repaired by the sync after it. Not found: a rule
// changed in place that keeps what is compared (its matches, such as a
// probability or a source range, edited by hand); chains of the writer's
// prefix that no applied payload declared and nothing jumps to; and rules
// without a comment the writer wrote and without a jump to a service chain
// in the top-level chains, which belong to someone else. The periodic full
// sync (WriterConfig.FullSyncPeriod) covers those.
//
// This is the repair a partial sync cannot do: it trusts that the kernel
// holds what it wrote, while kube-proxy rewrites KUBE-SERVICES at every
// sync and so repairs it within a sync period. The check costs one
// "iptables -S CHAIN" per top-level chain (nat's two always, the filter
// chains only when the writer has rules in them), or, on the legacy
// backend, one iptables-save of nat instead of nat's two, from which it
// also reads the service chains; on the nft backend the checks that read
// the service chains add one iptables-save of nat, which reads the whole
// ruleset and costs far more than listing a chain. Memory grows with the
// services and endpoints: the writer keeps a count and a sum per chain.
// The first check after a full sync reads them from the payloads applied
// since (kept until then, so that the sync does not pay for them), which
// costs a walk of the full payload; Applied then updates them from each
// payload. BENCHMARKS.md has the costs at 10,000 services.
//
// Call it between Applied and the next Sync, never concurrently with them.
// It does nothing, and execs nothing, when the next Sync is full anyway
// (the first one, or after a failure). An error reading a top-level chain
// is returned, and the writer's state is left alone; an error reading the
// service chains is returned with what the top-level chains showed, which
// is acted on. A missing chain counts as drift.
func (w *Writer) CheckDrift(ctx context.Context, ipt Interface) (Drift, error) {
	if w.needFull || w.unapplied || w.requestFull.Load() {
		return Drift{}, nil
	}
	want := make(map[ruleKey]int)
	for _, ss := range w.services {
		for _, ps := range ss.ports {
			for _, r := range ps.top {
				if k, ok := parseRuleKey(r.chain, r.spec); ok {
					want[k]++
				}
			}
		}
	}
	have := make(map[ruleKey]int, len(want))
	var d Drift
	var buf bytes.Buffer
	// iptables-legacy reads the whole table from the kernel for any
	// listing, so one iptables-save of nat costs less than listing its
	// two chains; the nft backend reads only the chain listed, far less
	// than iptables-save reads (BENCHMARKS.md).
	var natSave string
	if ipt.Backend() == BackendLegacy {
		if err := ipt.SaveInto(ctx, TableNAT, &buf); err != nil {
			return Drift{}, fmt.Errorf("checking table nat for drift: %w", err)
		}
		natSave = buf.String()
	}
	for c := natServices; c <= filterFirewall; c++ {
		table := TableFilter
		if c.isNAT() {
			table = TableNAT
		} else if !hasRulesIn(want, c) {
			continue
		}
		chain := w.topChainName(c)
		var listing string
		if natSave != "" && c.isNAT() {
			if !strings.Contains(natSave, "\n:"+string(chain)+" ") {
				d.Missing++
				d.Examples = append(d.Examples, fmt.Sprintf("missing %s %s: the whole chain", table, chain))
				continue
			}
			listing = natSave
		} else {
			buf.Reset()
			if err := ipt.ListRules(ctx, table, chain, &buf); err != nil {
				exists, existsErr := ipt.ChainExists(ctx, table, chain)
				if existsErr != nil || exists {
					return Drift{}, fmt.Errorf("checking %s %s for drift: %w", table, chain, err)
				}
				d.Missing++
				d.Examples = append(d.Examples, fmt.Sprintf("missing %s %s: the whole chain", table, chain))
				continue
			}
			listing = buf.String()
		}
		prefix := "-A " + string(chain) + " "
		for line := range strings.Lines(listing) {
			spec, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), prefix)
			if !ok {
				continue
			}
			k, ok := parseRuleKey(c, spec)
			if !ok {
				continue
			}
			if _, mine := want[k]; mine || w.cn.IsServiceChain(Chain(k.target)) {
				have[k]++
			}
		}
	}
	for k, n := range want {
		if m := have[k]; m < n {
			d.Missing += n - m
			d.example("missing " + w.describeRule(k))
		}
	}
	for k, m := range have {
		if n := want[k]; m > n {
			d.Unexpected += m - n
			d.example("unexpected " + w.describeRule(k))
		}
	}
	// A failed read of the service chains does not hide what the
	// top-level chains showed.
	err := w.checkServiceChains(ctx, ipt, natSave, &d)
	if d.Found() {
		w.needFull = true
	}
	return d, err
}

func (d *Drift) example(what string) {
	if len(d.Examples) < maxDriftExamples {
		d.Examples = append(d.Examples, what)
	}
}

func hasRulesIn(want map[ruleKey]int, c topChain) bool {
	for k := range want {
		if k.chain == c {
			return true
		}
	}
	return false
}

// parseRuleKey returns the key of the rule spec (the words after "-A
// CHAIN", as the writer writes them or iptables prints them) in chain c.
// A rule without a target has no key. The key's strings share spec's
// memory unless a word had to be unescaped.
func parseRuleKey(c topChain, spec string) (ruleKey, bool) {
	k := ruleKey{chain: c}
	var prev string
	for i := 0; ; {
		var w string
		var ok bool
		if w, i, ok = nextRuleWord(spec, i); !ok {
			break
		}
		switch prev {
		case "--comment":
			k.comment = w
		case "-j", "--jump", "-g", "--goto":
			k.target = w
		}
		prev = w
	}
	return k, k.target != ""
}

// nextRuleWord returns the word of s that starts at or after i, and where
// the word after it may start, splitting as iptables-restore does: at
// blanks, except inside double quotes, where a backslash keeps the next
// character (iptables prints a comment holding a quote or a backslash
// that way). ok is false when no word is left.
func nextRuleWord(s string, i int) (word string, next int, ok bool) {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	if i == len(s) {
		return "", i, false
	}
	start := i
	plain := true // no quote or escape so far: the word is s[start:i]
	quoted := false
	for ; i < len(s); i++ {
		ch := s[i]
		if !quoted && (ch == ' ' || ch == '\t') {
			break
		}
		if ch == '"' || (quoted && ch == '\\') {
			plain = false
		}
		if ch == '"' {
			quoted = !quoted
		} else if quoted && ch == '\\' {
			i++
		}
	}
	if plain {
		return s[start:i], i, true
	}
	raw := s[start:min(i, len(s))]
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' && !strings.ContainsAny(raw[1:len(raw)-1], "\"\\") {
		return raw[1 : len(raw)-1], i, true
	}
	var b strings.Builder
	q := false
	for j := 0; j < len(raw); j++ {
		switch ch := raw[j]; {
		case ch == '"':
			q = !q
		case q && ch == '\\' && j+1 < len(raw):
			j++
			b.WriteByte(raw[j])
		default:
			b.WriteByte(ch)
		}
	}
	return b.String(), i, true
}
