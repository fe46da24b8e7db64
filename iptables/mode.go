package iptables

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/proxy"
)

// Mode is iptables mode for one IP family: the service rule writer
// renders full or partial iptables-restore input, and the Interface
// applies it. Its Sync takes that family's input alone: give each family
// a Mode, and a BackendGroup, of its own.
type Mode struct {
	family v1.IPFamily
	w      *Writer
	// ipt applies the payloads; nil in a dry run, which prints them to
	// out instead.
	ipt Interface
	out io.Writer
	// reg is where NewMode registers metrics.
	reg     *proxy.Metrics
	metrics modeMetrics
	// rules counts the rules of the applied payloads, for the gauges.
	rules ruleTally
	// canaryInterval is how often run checks the canary.
	canaryInterval time.Duration
	// driftCheckPeriod is how often run compares the rules with what the
	// writer applied (Writer.CheckDrift); zero turns the check off.
	driftCheckPeriod time.Duration
	// acct is where the rules count packets (WithNFAcct); nil for none.
	acct NFAcct
	// ensureAcct is set until the counters were made, and again after a
	// failed restore, which a counter deleted by hand would cause.
	ensureAcct bool
	// mu is held by sync and by the drift check: the writer is not safe
	// for concurrent use, and a check during a sync would compare the
	// kernel with rules not applied yet.
	mu sync.Mutex
}

var _ proxy.Backend = (*Mode)(nil)

// ModeOption configures a Mode; see NewMode.
type ModeOption func(*Mode)

// WithDryRun makes a Mode made without an Interface print each sync's
// iptables-restore input to out, after a comment line naming the family
// and the command, instead of discarding it.
func WithDryRun(out io.Writer) ModeOption {
	return func(b *Mode) {
		if out != nil {
			b.out = out
		}
	}
}

// WithMetrics makes NewMode register iptables mode's metrics on m, under
// kube-proxy's names: kubeproxy_sync_proxy_rules_iptables_restore_failures_total
// and ..._partial_restore_failures_total, and proxykit's
// ..._iptables_drift_repairs_total (the drift checks that called lost),
// each by ip_family; and kube-proxy's rule gauges
// kubeproxy_sync_proxy_rules_iptables_total (the rules in the proxy's
// chains) and ..._iptables_last (the rules the last sync added), by table
// (filter, nat) and ip_family, set after each applied sync. The jumps
// from the built-in chains are not counted, as in kube-proxy; unlike
// kube-proxy's, ..._last is 0 after a partial sync that changed nothing,
// which writes no payload. Without it they are counted nowhere.
func WithMetrics(m *proxy.Metrics) ModeOption {
	return func(b *Mode) { b.reg = m }
}

// WithNFAcct makes the Mode count packets in kube-proxy's nfacct counters
// of a: it makes NFAcctInvalidDropped and NFAcctLocalhostNodePorts before
// its first sync (and again after a failed restore), and its rules count
// in those it could make (Writer.SetAccounting), as kube-proxy's iptables
// mode does; a counter it cannot make is logged and its rules count
// nothing. With WithMetrics it also exports their packets, read at each
// scrape, as kube-proxy's kubeproxy_iptables_ct_state_invalid_dropped_packets_total
// and kubeproxy_iptables_localhost_nodeports_accepted_packets_total
// (no labels: the counters are the namespace's, shared by the families;
// the Modes of both families register them once). A dry run ignores it.
func WithNFAcct(a NFAcct) ModeOption {
	return func(b *Mode) { b.acct = a }
}

// WithCheckPeriod sets how often Run checks the canary chain (the
// default is proxy.DefaultSyncPeriod, as kube-proxy checks it at its
// sync period). A period that is not positive keeps the default.
func WithCheckPeriod(d time.Duration) ModeOption {
	return func(b *Mode) {
		if d > 0 {
			b.canaryInterval = d
		}
	}
}

// WithDriftCheckPeriod makes Run compare the rules in the kernel with
// what the writer applied every d (Writer.CheckDrift, whose doc
// says which drift each check sees), and call lost when they differ: a
// service's jump, or a rule of a KUBE-SVC or KUBE-SEP chain, deleted by
// hand takes no canary with it. Zero, the default, turns the check off.
func WithDriftCheckPeriod(d time.Duration) ModeOption {
	return func(b *Mode) { b.driftCheckPeriod = d }
}

// NewMode makes the Mode of one family. cfg carries the family and the
// node's settings; NewMode works on a copy. Its FullSyncPeriod zero means
// proxy.DefaultFullSyncPeriod (an hour, as kube-proxy's), and negative turns
// the periodic full sync off. RandomFully is set when ipt has
// --random-fully, and ChainsPerCommit, when zero, is NFTChainsPerCommit on
// the nft backend; a caller's true RandomFully or positive
// ChainsPerCommit is kept. ipt applies the rules; a nil ipt makes a dry
// run, which applies nothing and prints each sync's input (WithDryRun) as
// any iptables from 1.6.2 on would take it. Unless in a dry run, NewMode
// reads the chains that exist in the nat table, so that the first full
// sync deletes the service chains nothing owns any more: those of services
// deleted while no proxier ran, or of a sync killed half-way; a failure to
// read them is logged, and they stay. It fails when the writer refuses
// cfg, or when WithMetrics' registry refuses a metric.
func NewMode(ctx context.Context, cfg WriterConfig, ipt Interface, opts ...ModeOption) (*Mode, error) {
	b := &Mode{family: cfg.Family, ipt: ipt, out: io.Discard, canaryInterval: proxy.DefaultSyncPeriod}
	for _, opt := range opts {
		if opt != nil {
			opt(b)
		}
	}
	switch {
	case cfg.FullSyncPeriod == 0:
		cfg.FullSyncPeriod = proxy.DefaultFullSyncPeriod
	case cfg.FullSyncPeriod < 0:
		cfg.FullSyncPeriod = 0
	}
	if ipt != nil {
		cfg.RandomFully = cfg.RandomFully || ipt.HasRandomFully()
		if cfg.ChainsPerCommit == 0 && ipt.Backend() == BackendNFT {
			cfg.ChainsPerCommit = NFTChainsPerCommit
		}
	} else {
		// A dry run execs nothing, so it cannot ask iptables what it
		// supports. Every iptables from 1.6.2 (2018) has --random-fully,
		// and the nat table is printed in one commit whatever the
		// backend, so the output is the same on every machine.
		cfg.RandomFully = true
	}
	var err error
	if b.metrics, err = newModeMetrics(b.reg); err != nil {
		return nil, fmt.Errorf("%s iptables mode: %w", cfg.Family, err)
	}
	if b.w, err = NewWriter(cfg); err != nil {
		return nil, fmt.Errorf("%s rule writer: %w", cfg.Family, err)
	}
	b.w.tally = &b.rules
	if ipt == nil {
		b.acct = nil
	}
	if b.acct != nil {
		b.ensureAcct = true
		if err := registerNFAcctMetrics(klog.FromContext(ctx), b.reg, b.acct); err != nil {
			return nil, fmt.Errorf("%s iptables mode: %w", cfg.Family, err)
		}
	}
	if ipt != nil {
		var save bytes.Buffer
		if err := ipt.SaveInto(ctx, TableNAT, &save); err != nil {
			// Not fatal: the chains are only left behind, as before.
			klog.FromContext(ctx).Error(err, "Reading the existing chains; stale service chains from before this start stay", "ipFamily", cfg.Family)
		} else {
			b.w.NoteExistingChains(ChainsFromSave(save.Bytes()))
		}
	}
	return b, nil
}

// Sync is part of proxy.Backend. It takes one input, of the Mode's
// family, and fails on any other. A failed restore makes the next sync
// full.
func (b *Mode) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	if len(ins) != 1 || ins[0].Family != b.family {
		return make([]proxy.SyncResult, len(ins)), fmt.Errorf("%s iptables backend: given %d inputs, want one of its family", b.family, len(ins))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	in := ins[0]
	if b.ensureAcct {
		b.w.SetAccounting(b.ensureCounters(ctx))
	}
	res := b.w.Sync(ctx, in)
	out := []proxy.SyncResult{{
		Full:                     res.Full,
		ServicePorts:             res.ServicePorts,
		Endpoints:                res.Endpoints,
		NoLocalEndpointsInternal: res.NoLocalEndpointsInternal,
		NoLocalEndpointsExternal: res.NoLocalEndpointsExternal,
	}}
	if b.ipt == nil {
		_, err := fmt.Fprintf(b.out, "# %s: %s input\n%s", b.family, restoreCommand(b.family), res.Payload)
		b.w.Applied(err)
		if err == nil {
			b.noteRules()
		}
		return out, err
	}
	var err error
	// A full sync is also how rules another program flushed come back,
	// jumps from the built-in chains included.
	if res.Full {
		err = b.w.EnsureJumpRules(ctx, b.ipt)
	}
	if err == nil && len(res.Payload) > 0 {
		err = b.ipt.RestoreAll(ctx, res.Payload, NoFlushTables, RestoreCounters)
		if err != nil {
			b.metrics.restoreFailures.WithLabelValues(string(b.family)).Inc()
			if !res.Full {
				b.metrics.partialRestoreFailures.WithLabelValues(string(b.family)).Inc()
			}
		}
	}
	// The writer must hear the outcome either way: after a failure its
	// next sync is full.
	b.w.Applied(err)
	if err != nil && b.acct != nil {
		b.ensureAcct = true
	}
	if err == nil {
		b.noteRules()
	}
	if err != nil {
		return out, fmt.Errorf("%s %s sync: %w", b.family, syncKind(res.Full), err)
	}
	return out, nil
}

// noteRules sets the rule gauges from the tally, which the writer's
// Applied brought up to date with the payload just applied. A failed
// restore leaves them at the last applied sync's values: the next sync is
// full and counts afresh.
func (b *Mode) noteRules() {
	b.metrics.setRules(string(b.family), &b.rules, b.rules.written)
}

// RouteLocalnet reports whether the rules serve IPv4 node ports on
// 127.0.0.1, which works only with the sysctl net.ipv4.conf.all.route_localnet
// set to 1: the caller's to set, as kube-proxy does at start-up.
func (b *Mode) RouteLocalnet() bool { return b.w.RouteLocalnet() }

// RequestFullSync is part of proxy.Backend.
func (b *Mode) RequestFullSync() { b.w.RequestFullSync() }

// canaryTables are the tables the canary watches, as kube-proxy's: a
// firewall reload that empties any of them takes the proxy's rules, or the
// kubelet's that they depend on, with it.
var canaryTables = []Table{TableMangle, TableNAT, TableFilter}

// CanaryTables returns the tables in which Run keeps a canary chain, whose
// removal brings a full sync: mangle, nat and filter, as kube-proxy's.
func CanaryTables() []Table { return slices.Clone(canaryTables) }

// Run is part of proxy.Backend. It watches the canary chain: a flush by
// another program (a firewall reload, iptables -F) takes it too, and lost
// then brings a full sync. It also checks the rules for drift
// (WithDriftCheckPeriod). In a dry run it returns at once.
func (b *Mode) Run(ctx context.Context, lost func()) {
	if b.ipt == nil {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if b.driftCheckPeriod > 0 {
		wg.Go(func() {
			t := time.NewTicker(b.driftCheckPeriod)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					b.checkDrift(ctx, lost)
				}
			}
		})
	}
	b.ipt.Monitor(ctx, b.w.ChainNames().Canary(), canaryTables, lost, b.canaryInterval)
}

// checkDrift compares the rules in the kernel with what the writer
// applied and, when they differ, logs what it found and calls lost, which
// brings a full sync. It waits for a sync in progress, so that it compares
// with applied rules; an error reading the chains is logged, and the next
// period tries again, but drift found before the error is still acted on.
func (b *Mode) checkDrift(ctx context.Context, lost func()) {
	b.mu.Lock()
	d, err := b.w.CheckDrift(ctx, b.ipt)
	b.mu.Unlock()
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Checking the iptables rules for drift; trying again later", "ipFamily", b.family)
	}
	if d.Found() {
		logger.Info("iptables rules differ from what was applied; syncing everything", "ipFamily", b.family,
			"missing", d.Missing, "unexpected", d.Unexpected, "examples", d.Examples)
		b.metrics.driftRepairs.WithLabelValues(string(b.family)).Inc()
		lost()
	}
}

func restoreCommand(family v1.IPFamily) string {
	if family == v1.IPv6Protocol {
		return "ip6tables-restore"
	}
	return "iptables-restore"
}

func syncKind(full bool) string {
	if full {
		return "full"
	}
	return "partial"
}
