package main

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	utiliptables "k8s.io/kubernetes/pkg/util/iptables"
	"sigs.k8s.io/knftables"
)

// The kernel sides. Both proxies hand their work to the same stand-ins for
// the kernel tools, which run nothing: they count what the tool would be
// given, and answer the few questions the proxies ask of the kernel as the
// kernel would after the transactions so far.

// nftRecorder stands for knftables' nft -f: Run serialises the transaction
// with knftables (Transaction.String, the text knftables writes to nft's
// stdin) and counts its bytes. List answers from the chains and sets the
// transactions added and deleted, which kube-proxy asks for on every sync
// and proxykit's writer on its first; the bookkeeping for that is kept off
// the Go heap, and the thread CPU it takes is counted apart (overhead) so
// that it can be taken out of the proxy's figure.
type nftRecorder struct {
	// Fake gives transactions their family and table (NewTransaction);
	// its own Run and List are not used.
	*knftables.Fake
	bytes    int64
	overhead time.Duration
	// failed counts transactions that carried an error (an object
	// knftables refused), which nft would not have been given.
	failed int
	table  bool
	chains *nameSet
	sets   *nameSet
}

var _ knftables.Interface = (*nftRecorder)(nil)

func newNFTRecorder() *nftRecorder {
	return &nftRecorder{
		Fake:   knftables.NewFake(knftables.IPv4Family, "kube-proxy"),
		chains: newNameSet(),
		sets:   newNameSet(),
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
	return nil
}

// note applies the table, chain and set additions and deletions of one
// transaction's text ("add chain ip kube-proxy NAME …") to the model.
func (r *nftRecorder) note(text string) {
	for len(text) > 0 {
		line := text
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = ""
		}
		verb, rest, _ := strings.Cut(line, " ")
		var add bool
		switch verb {
		case "add", "create":
			add = true
		case "delete", "destroy":
		default:
			continue
		}
		kind, rest, _ := strings.Cut(rest, " ")
		var set *nameSet
		switch kind {
		case "table":
			r.table = add
			if !add {
				r.chains.clear()
				r.sets.clear()
			}
			continue
		case "chain":
			set = r.chains
		case "set":
			set = r.sets
		default:
			continue
		}
		// family, table, then the name.
		f := strings.SplitN(rest, " ", 4)
		if len(f) < 3 {
			continue
		}
		if add {
			set.add(f[2])
		} else {
			set.remove(f[2])
		}
	}
}

// List is part of knftables.Interface: the chains or sets the table holds,
// or knftables' not-found error when it does not exist, as nft answers.
func (r *nftRecorder) List(ctx context.Context, objectType string) ([]string, error) {
	if !r.table {
		// The Fake's table was never made: its error is nft's for a
		// missing table.
		return r.Fake.List(ctx, objectType)
	}
	switch objectType {
	case "chain", "chains":
		return r.chains.list(), nil
	case "set", "sets":
		return r.sets.list(), nil
	}
	return nil, nil
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
