package iptables

import (
	"bytes"
	"context"
	"fmt"
	"strings"
)

// NFTServiceChainCheckInterval is how often, in checks, [Writer.CheckDrift]
// reads the per-service and per-endpoint chains on the nft backend: in
// the first check and in every NFTServiceChainCheckInterval-th after it.
// iptables-nft lists one chain without reading the others, but saving the
// nat table reads the whole ruleset and costs much more than listing the
// top-level chains; listing the service chains one by one costs more still
// (a command each, and each reads the table's chains). The legacy backend reads the whole table for any
// listing, so there every check reads them.
const NFTServiceChainCheckInterval = 10

// appliedChains is what the writer's per-service and per-endpoint chains
// hold in the kernel, as far as the applied payloads tell: per chain, the
// number of rules and a sum of the hashes of their targets. Targets are
// what survives the way iptables prints rules back ("-j KUBE-SEP-X",
// "-j DNAT --to-destination 10.0.0.1:8080"); matches are reordered and
// rewritten.
type appliedChains struct {
	// known is false until a full payload has been applied and after a
	// payload failed or was never reported: the next sync is full then,
	// and rebuilds chains from scratch.
	known bool
	// chains holds values, not pointers: at hundreds of thousands of
	// chains a pointer per entry is an allocation each and a map the
	// garbage collector must scan.
	chains map[chainRef]chainSum
	// round counts the checks; a chainSum's seen and compared hold the
	// round in which a check last found the chain declared and compared
	// its rules.
	round uint32
	// pending is the last full payload applied, not yet read into chains,
	// and deltas the partial payloads applied after it, in order. Reading
	// a full payload costs a map entry per chain, hundreds of thousands
	// in a large cluster, and only the drift check needs them: the check
	// reads them (readApplied), so that the first sync, which a proxy's
	// start waits for, does not. pendingChains is how many chains pending
	// declares.
	pending       []byte
	deltas        []byte
	pendingChains int
}

type chainSum struct {
	rules          uint32
	seen, compared uint32
	targets        uint64
}

// noteAppliedChains updates w.applied from the payload just applied, and
// a Mode's rule tally (w.tally) with it. A full payload declares every
// chain the writer keeps: it replaces the record, and is kept as it is
// until a drift check reads it (readApplied); partial payloads after it
// are kept with it, up to a quarter of its size, beyond which they are
// all read at once. Once the record is read, a partial payload is read
// as it is applied, in the same walk as the tally's: at tens of megabytes,
// a second walk would cost as much again.
func (w *Writer) noteAppliedChains() {
	a := &w.applied
	if w.payloadFull {
		if w.tally != nil {
			w.tally.note(w.payload, true)
		}
		// The buffers trade places: the writer renders the next sync in
		// the one an older payload, never read, leaves.
		a.pending, w.payload = w.payload, a.pending[:0]
		a.pendingChains = w.declared
		a.deltas = a.deltas[:0]
		a.known = true
		return
	}
	if a.pending != nil {
		if w.tally != nil {
			w.tally.note(w.payload, false)
		}
		a.deltas = append(a.deltas, w.payload...)
		if len(a.deltas) > len(a.pending)/4 {
			w.readApplied()
		}
		return
	}
	if a.chains == nil {
		a.chains = make(map[chainRef]chainSum)
	}
	w.walkApplied(w.payload, w.tally)
}

// readApplied reads the applied payloads that noteAppliedChains kept into
// w.applied.chains, and gives the full payload's buffer back to the writer
// for its next sync.
func (w *Writer) readApplied() {
	a := &w.applied
	if a.pending == nil {
		return
	}
	// Sized for the chains the full payload declares, the map is not
	// grown (and rehashed) step by step.
	a.chains = make(map[chainRef]chainSum, a.pendingChains)
	w.walkApplied(a.pending, nil)
	w.walkApplied(a.deltas, nil)
	w.reclaimPending()
}

// dropPending forgets the applied payloads not yet read, which a full sync
// replaces or a failure makes stale, keeping the full one's buffer for the
// next sync.
func (w *Writer) dropPending() {
	if w.applied.pending != nil {
		w.reclaimPending()
	}
}

func (w *Writer) reclaimPending() {
	a := &w.applied
	if cap(a.pending) > cap(w.payload) {
		w.payload = a.pending[:0]
	}
	a.pending = nil
	a.deltas = a.deltas[:0]
}

// walkApplied updates w.applied.chains from an applied payload b, and t
// (when not nil) from b: a declared chain is flushed, "-A" adds a rule,
// "-X" deletes the chain. The writer writes a chain's rules together, so
// a rule's chain is looked up only when it is not the previous rule's.
func (w *Writer) walkApplied(b []byte, t *ruleTally) {
	if t != nil {
		t.start(false)
		defer t.end()
	}
	a := &w.applied
	nat := false
	var last []byte // the chain of the previous rule
	var lastRef chainRef
	var sum chainSum // its entry, while inSum
	inSum := false   // whether last is a service chain the map holds
	flush := func() {
		if inSum {
			a.chains[lastRef] = sum
			inSum = false
		}
	}
	defer flush()
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if t != nil {
			t.line(line)
		}
		if len(line) < 3 {
			continue
		}
		switch {
		case line[0] == '*':
			flush()
			nat = string(line) == "*nat"
			last = nil
		case !nat:
		case line[0] == '-' && line[1] == 'A' && line[2] == ' ':
			name, spec, _ := bytes.Cut(line[3:], []byte{' '})
			if last == nil || !bytes.Equal(name, last) {
				flush()
				last = name
				if r, ok := w.cn.parseRef(string(name)); ok {
					sum, inSum = a.chains[r]
					lastRef = r
				}
			}
			if inSum {
				sum.rules++
				sum.targets += targetHash(spec)
			}
		case line[0] == ':':
			flush()
			name, _, _ := bytes.Cut(line[1:], []byte{' '})
			if r, ok := w.cn.parseRef(string(name)); ok {
				// A declared chain is flushed.
				a.chains[r] = chainSum{}
			}
			last = nil
		case line[0] == '-' && line[1] == 'X' && line[2] == ' ':
			flush()
			if r, ok := w.cn.parseRef(string(line[3:])); ok {
				delete(a.chains, r)
			}
			last = nil
		}
	}
}

// targetHash hashes the target of a rule spec with its arguments: the
// text after the first " -j " (or a leading "-j "), as the writer writes
// it and iptables prints it back, while the matches before it are
// reordered and rewritten. The writer's comments name service ports and
// endpoints, which hold no " -j ". A rule without a target hashes to the
// same value as any other.
func targetHash[T string | []byte](spec T) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	i := 0
	for ; i+4 <= len(spec); i++ {
		if spec[i] == ' ' && spec[i+1] == '-' && spec[i+2] == 'j' && spec[i+3] == ' ' {
			break
		}
	}
	if i+4 > len(spec) {
		i = len(spec)
		if len(spec) >= 3 && spec[0] == '-' && spec[1] == 'j' && spec[2] == ' ' {
			i = -1
		}
	}
	h := uint64(offset)
	for j := i + 1; j < len(spec); j++ {
		h = (h ^ uint64(spec[j])) * prime
	}
	return h
}

// checkServiceChains compares the per-service and per-endpoint chains of
// nat with w.applied and adds what differs to d. It reads them from
// natSave, the output of iptables-save of nat, when the caller has it (the
// legacy backend); otherwise it saves nat itself, in one check of every
// NFTServiceChainCheckInterval.
func (w *Writer) checkServiceChains(ctx context.Context, ipt Interface, natSave string, d *Drift) error {
	w.readApplied()
	a := &w.applied
	if !a.known || len(a.chains) == 0 {
		return nil
	}
	a.round++
	if natSave == "" {
		if a.round%NFTServiceChainCheckInterval != 1 {
			return nil
		}
		var buf bytes.Buffer
		if err := ipt.SaveInto(ctx, TableNAT, &buf); err != nil {
			return fmt.Errorf("checking the service chains of table nat for drift: %w", err)
		}
		natSave = buf.String()
	}
	w.readServiceChains(natSave, d)
	for r, s := range a.chains {
		w.compareChain(r, s, d)
	}
	return nil
}

// readServiceChains reads iptables-save's listing of nat: it marks the
// service chains it declares as seen in this round, and compares the rules
// of each with w.applied, marking them compared and adding those that
// differ to d. iptables-save prints a chain's rules together, which lets a
// chain be compared once its last rule is read. Service chains the writer
// did not apply are left alone.
func (w *Writer) readServiceChains(listing string, d *Drift) {
	a := &w.applied
	var curName string
	var cur chainSum // curName's entry, while known
	known := false   // whether curName is one of the writer's chains
	var curRef chainRef
	var rules uint32
	var targets uint64
	finish := func() {
		if !known {
			return
		}
		cur.compared = a.round
		a.chains[curRef] = cur
		if rules != cur.rules || targets != cur.targets {
			w.chainDrift(curRef, cur, rules, d)
		}
	}
	for rest := listing; len(rest) > 0; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		switch {
		case strings.HasPrefix(line, "-A "):
			name, spec, _ := strings.Cut(line[3:], " ")
			if name != curName {
				finish()
				curName, known, rules, targets = name, false, 0, 0
				if r, ok := w.cn.parseRef(name); ok {
					cur, known = a.chains[r]
					curRef = r
				}
			}
			if known {
				rules++
				targets += targetHash(spec)
			}
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if r, ok := w.cn.parseRef(name); ok {
				if s, ok := a.chains[r]; ok {
					s.seen = a.round
					a.chains[r] = s
				}
			}
		}
	}
	finish()
}

// compareChain adds to d what a check found for the chain r after
// readServiceChains: nothing if its rules were compared; the whole chain
// if it was not declared; its rules if it was declared without any.
func (w *Writer) compareChain(r chainRef, s chainSum, d *Drift) {
	switch {
	case s.compared == w.applied.round:
	case s.seen != w.applied.round:
		d.Missing += max(int(s.rules), 1)
		d.example(fmt.Sprintf("missing %s %s: the whole chain", TableNAT, r.chain(w.cn)))
	case s.rules > 0:
		w.chainDrift(r, s, 0, d)
	}
}

// chainDrift adds to d a chain r that holds rules where the writer applied
// s: rules it lacks count as missing, rules beyond as unexpected, and the
// same number of rules with other targets as one of each.
func (w *Writer) chainDrift(r chainRef, s chainSum, rules uint32, d *Drift) {
	want := int(s.rules)
	have := int(rules)
	switch {
	case have < want:
		d.Missing += want - have
	case have > want:
		d.Unexpected += have - want
	default:
		d.Missing++
		d.Unexpected++
	}
	d.example(fmt.Sprintf("changed %s %s: %d rules, want %d, or other targets", TableNAT, r.chain(w.cn), have, want))
}
