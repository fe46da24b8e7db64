package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	utiliptables "k8s.io/kubernetes/pkg/util/iptables"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
)

// The kernel sides. Both proxies hand their work to the same stand-ins for
// the kernel tools, which run nothing: they count what the tool would be
// given, and answer the few questions the proxies ask of the kernel as the
// kernel would after the transactions so far.

// nftRecorder stands for knftables' nft -f: Run serialises the transaction
// with knftables (Transaction.String, the text knftables writes to nft's
// stdin) and counts its bytes; RunBatch stands for the netlink socket of
// nftables mode's element batches. List and ListElements answer from the
// chains, sets, maps and elements the transactions so far left, as the
// kernel would: kube-proxy lists the chains and sets on every sync and the
// elements of its maps on every full sync (and writes only the elements
// that differ), proxykit's writer lists the chains and sets on its first.
// The model is kept off the Go heap, and the thread CPU its bookkeeping
// takes is counted apart (overhead) so that it can be taken out of the
// proxy's figure; the listings' own cost stays the proxy's, far below what
// reading them from the kernel costs.
type nftRecorder struct {
	// Fake gives transactions their family and table (NewTransaction).
	// Its table is never made, so its List methods answer not found,
	// as nft does for a missing table.
	*knftables.Fake
	bytes    int64
	overhead time.Duration
	// failed counts transactions that carried an error (an object
	// knftables refused), which nft would not have been given.
	failed int
	// gen counts the transactions run, as the nf_tables generation does.
	gen    uint32
	table  bool
	chains *offHeapMap
	sets   *offHeapMap
	// elems holds the elements of each set and map, key to value, their
	// parts joined by " . " as nft writes them.
	elems map[string]*offHeapMap
	// scratch is noteElements' buffer.
	scratch []byte
}

var (
	_ knftables.Interface  = (*nftRecorder)(nil)
	_ nftables.KernelState = (*nftRecorder)(nil)
)

func newNFTRecorder() *nftRecorder {
	return &nftRecorder{
		Fake:   knftables.NewFake(knftables.IPv4Family, "kube-proxy"),
		chains: newOffHeapMap(),
		sets:   newOffHeapMap(),
		elems:  map[string]*offHeapMap{},
	}
}

// Run is part of knftables.Interface.
func (r *nftRecorder) Run(_ context.Context, tx *knftables.Transaction) error {
	text := tx.String()
	// String ends with "# ERROR: …" when the transaction holds an error;
	// the real Run returns that error without running nft.
	if i := strings.LastIndexByte(text, '\n'); strings.HasPrefix(text[i+1:], "# ERROR: ") {
		r.failed++
		return fmt.Errorf("transaction refused: %s", text[i+1:])
	}
	r.bytes += int64(len(text))
	r.overhead += threadCPU(func() { r.note(text) })
	if tx.NumOperations() > 0 {
		r.gen++
	}
	return nil
}

// RunBatch stands for nftables.ApplyElementBatch, the netlink path of
// nftables mode: it is handed the batch's messages as that sends them
// (ElementBatch.MarshalBinary, the same encoding), counts their bytes and
// applies the elements to the model. A batch is one commit, as a
// transaction is.
func (r *nftRecorder) RunBatch(b nftables.ElementBatch) error {
	msgs, err := b.MarshalBinary()
	if err != nil {
		r.failed++
		return fmt.Errorf("batch refused: %w", err)
	}
	r.bytes += int64(len(msgs))
	r.overhead += threadCPU(func() {
		r.noteElements(b.Delete, false)
		r.noteElements(b.Add, true)
	})
	if b.Len() > 0 {
		r.gen++
	}
	return nil
}

// noteElements adds (or deletes) els in the model. The key and value are
// joined in a buffer the recorder reuses, which the model copies: like
// note's, this bookkeeping leaves no garbage for the proxy's collector.
func (r *nftRecorder) noteElements(els []*knftables.Element, add bool) {
	join := func(b []byte, parts []string) []byte {
		for i, p := range parts {
			if i > 0 {
				b = append(b, " . "...)
			}
			b = append(b, p...)
		}
		return b
	}
	view := func(b []byte) string {
		if len(b) == 0 {
			return ""
		}
		return unsafe.String(&b[0], len(b))
	}
	for _, el := range els {
		m := r.elems[el.Set+el.Map]
		if m == nil {
			continue
		}
		r.scratch = join(r.scratch[:0], el.Key)
		k := len(r.scratch)
		if !add {
			m.remove(view(r.scratch))
			continue
		}
		r.scratch = join(r.scratch, el.Value)
		m.set(view(r.scratch[:k]), view(r.scratch[k:]))
	}
}

// Generation is part of nftables.KernelState: the kernel's count of
// committed batches, one per transaction run. proxykit's Mode gives its
// writer the netlink KernelState, whose generation read is one small
// request; with it a forced full resync of a table no one else committed
// to trusts the writer's memory instead of listing the elements.
func (r *nftRecorder) Generation() (uint32, error) { return r.gen, nil }

// errNotModelled is the answer of the KernelState methods that only a
// periodic resync or a drift check calls, which the steps do not make.
var errNotModelled = errors.New("kpbench: not modelled by the stand-in kernel")

// RuleCounts is part of nftables.KernelState; not modelled.
func (r *nftRecorder) RuleCounts(knftables.Family, string) (map[string]int, error) {
	return nil, errNotModelled
}

// CheckElements is part of nftables.KernelState; not modelled.
func (r *nftRecorder) CheckElements([]*knftables.Element) ([]nftables.ElementState, error) {
	return nil, errNotModelled
}

// note applies one transaction's text ("add chain ip kube-proxy NAME …",
// "add element ip kube-proxy NAME { KEY : VALUE }") to the model.
func (r *nftRecorder) note(text string) {
	for len(text) > 0 {
		line := text
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = ""
		}
		verb, rest, _ := strings.Cut(line, " ")
		kind, rest, _ := strings.Cut(rest, " ")
		if kind == "table" {
			switch verb {
			case "add", "create":
				r.table = true
			case "delete", "destroy":
				r.table = false
				r.chains.clear()
				r.sets.clear()
				clear(r.elems)
			case "flush":
				for _, m := range r.elems {
					m.clear()
				}
			}
			continue
		}
		// family, table, the name, and what follows.
		f := strings.SplitN(rest, " ", 4)
		if len(f) < 3 {
			continue
		}
		name := f[2]
		switch kind {
		case "chain":
			switch verb {
			case "add", "create":
				r.chains.set(name, "")
			case "delete", "destroy":
				r.chains.remove(name)
			}
		case "set", "map":
			switch verb {
			case "add", "create":
				if kind == "set" {
					r.sets.set(name, "")
				}
				if r.elems[name] == nil {
					r.elems[name] = newOffHeapMap()
				}
			case "delete", "destroy":
				r.sets.remove(name)
				delete(r.elems, name)
			case "flush":
				if m := r.elems[name]; m != nil {
					m.clear()
				}
			}
		case "element":
			m := r.elems[name]
			if m == nil || len(f) < 4 {
				continue
			}
			body := strings.TrimSuffix(strings.TrimPrefix(f[3], "{ "), " }")
			key, value := body, ""
			if i := strings.LastIndex(body, " : "); i >= 0 {
				key, value = body[:i], body[i+3:]
			}
			if i := strings.Index(key, ` comment "`); i >= 0 {
				key = key[:i]
			}
			switch verb {
			case "add", "create":
				m.set(key, value)
			case "delete", "destroy":
				m.remove(key)
			}
		}
	}
}

// List is part of knftables.Interface: the chains or sets the table holds,
// or knftables' not-found error when it does not exist, as nft answers.
func (r *nftRecorder) List(ctx context.Context, objectType string) ([]string, error) {
	if !r.table {
		return r.Fake.List(ctx, objectType)
	}
	switch objectType {
	case "chain", "chains":
		return r.chains.keys(), nil
	case "set", "sets":
		return r.sets.keys(), nil
	}
	return nil, nil
}

// ListElements is part of knftables.Interface: the elements of a set or
// map, or not found.
func (r *nftRecorder) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	m := r.elems[name]
	if !r.table || m == nil {
		return r.Fake.ListElements(ctx, objectType, name)
	}
	out := make([]*knftables.Element, 0, m.n)
	m.each(func(k, v string) {
		// Copies: the model's strings point into memory it reuses.
		e := &knftables.Element{Key: strings.Split(strings.Clone(k), " . ")}
		if v != "" {
			e.Value = strings.Split(strings.Clone(v), " . ")
		}
		if objectType == "set" {
			e.Set = name
		} else {
			e.Map = name
		}
		out = append(out, e)
	})
	return out, nil
}

// iptRecorder stands for kube-proxy's iptables Interface: RestoreAll counts
// the iptables-restore input. The kernel's nat table is reported empty by
// SaveInto: kube-proxy reads it on its first sync, when it is, and then, with
// more than 1,000 endpoints, once a sync period to find stale chains, which
// this leaves out (kube-proxy's cost of parsing iptables-save is not
// counted). The jump rules' Ensure calls succeed without work.
type iptRecorder struct {
	bytes int64
}

var _ utiliptables.Interface = (*iptRecorder)(nil)

func (r *iptRecorder) EnsureChain(utiliptables.Table, utiliptables.Chain) (bool, error) {
	return true, nil
}
func (r *iptRecorder) FlushChain(utiliptables.Table, utiliptables.Chain) error  { return nil }
func (r *iptRecorder) DeleteChain(utiliptables.Table, utiliptables.Chain) error { return nil }
func (r *iptRecorder) ChainExists(utiliptables.Table, utiliptables.Chain) (bool, error) {
	return true, nil
}
func (r *iptRecorder) EnsureRule(utiliptables.RulePosition, utiliptables.Table, utiliptables.Chain, ...string) (bool, error) {
	return true, nil
}
func (r *iptRecorder) DeleteRule(utiliptables.Table, utiliptables.Chain, ...string) error {
	return nil
}
func (r *iptRecorder) IsIPv6() bool                    { return false }
func (r *iptRecorder) Protocol() utiliptables.Protocol { return utiliptables.ProtocolIPv4 }
func (r *iptRecorder) SaveInto(table utiliptables.Table, buf *bytes.Buffer) error {
	buf.WriteString("*" + string(table) + "\nCOMMIT\n")
	return nil
}
func (r *iptRecorder) Restore(_ utiliptables.Table, data []byte, _ utiliptables.FlushFlag, _ utiliptables.RestoreCountersFlag) error {
	r.bytes += int64(len(data))
	return nil
}
func (r *iptRecorder) RestoreAll(data []byte, _ utiliptables.FlushFlag, _ utiliptables.RestoreCountersFlag) error {
	r.bytes += int64(len(data))
	return nil
}
func (r *iptRecorder) Monitor(utiliptables.Chain, []utiliptables.Table, func(), time.Duration, <-chan struct{}) {
}
func (r *iptRecorder) Present() error { return nil }

// threadCPU runs f on a locked thread and returns the CPU time the thread
// spent in it.
func threadCPU(f func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var a, b unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &a)
	f()
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &b)
	return time.Duration(b.Nano() - a.Nano())
}
