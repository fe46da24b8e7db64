package iptablesbackend

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// Backend is iptables mode for one IP family: the service rule writer
// renders full or partial iptables-restore input, and the Interface
// applies it. Its Sync takes that family's input alone: give each family
// a Backend, and a BackendGroup, of its own.
type Backend struct {
	family v1.IPFamily
	w      *iptables.Writer
	// ipt applies the payloads; nil in a dry run, which prints them to
	// out instead.
	ipt     iptables.Interface
	out     io.Writer
	metrics *proxier.BackendMetrics
	// canaryInterval is how often run checks the canary.
	canaryInterval time.Duration
	// driftCheckPeriod is how often run compares the rules with what the
	// writer applied (Writer.CheckDrift); zero turns the check off.
	driftCheckPeriod time.Duration
	// mu is held by sync and by the drift check: the writer is not safe
	// for concurrent use, and a check during a sync would compare the
	// kernel with rules not applied yet.
	mu sync.Mutex
}

var _ proxy.Backend = (*Backend)(nil)

// Option configures a Backend; see New.
type Option func(*Backend)

// WithDryRun makes a Backend made without an Interface print each sync's
// iptables-restore input to out, after a comment line naming the family
// and the command, instead of discarding it.
func WithDryRun(out io.Writer) Option {
	return func(b *Backend) {
		if out != nil {
			b.out = out
		}
	}
}

// WithMetrics makes the Backend count its failed restores on m (nil: on
// nothing). Drift repairs are counted on m.DriftRepairs.
func WithMetrics(m *proxier.BackendMetrics) Option {
	return func(b *Backend) { b.metrics = m }
}

// WithCanaryInterval sets how often Run checks the canary chain (the
// default is proxy.DefaultSyncPeriod, as kube-proxy checks it at its
// sync period). A period that is not positive keeps the default.
func WithCanaryInterval(d time.Duration) Option {
	return func(b *Backend) {
		if d > 0 {
			b.canaryInterval = d
		}
	}
}

// WithDriftCheckPeriod makes Run compare the rules in the kernel with
// what the writer applied every d (iptables.Writer.CheckDrift, whose doc
// says which drift each check sees), and call lost when they differ: a
// service's jump, or a rule of a KUBE-SVC or KUBE-SEP chain, deleted by
// hand takes no canary with it. Zero, the default, turns the check off.
func WithDriftCheckPeriod(d time.Duration) Option {
	return func(b *Backend) { b.driftCheckPeriod = d }
}

// fullSyncPeriod bounds the time between full syncs, as in kube-proxy: a
// partial sync trusts that the kernel still holds what the last sync
// wrote, and once an hour that trust is renewed.
const fullSyncPeriod = time.Hour

// New makes the Backend of one family. cfg carries the family and the
// node's settings; New sets its FullSyncPeriod (an hour, as kube-proxy's),
// and RandomFully and ChainsPerCommit from ipt. ipt applies the rules; a
// nil ipt makes a dry run, which applies nothing and prints each sync's
// input (WithDryRun) as any iptables from 1.6.2 on would take it. Unless in
// a dry run, New reads the chains that exist in the nat table, so that the
// first full sync deletes the service chains nothing owns any more: those
// of services deleted while no proxier ran, or of a sync killed half-way;
// a failure to read them is logged, and they stay. It fails when the
// writer refuses cfg.
func New(ctx context.Context, cfg iptables.WriterConfig, ipt iptables.Interface, opts ...Option) (*Backend, error) {
	cfg.FullSyncPeriod = fullSyncPeriod
	if ipt != nil {
		cfg.RandomFully = ipt.HasRandomFully()
		if ipt.Backend() == iptables.BackendNFT {
			cfg.ChainsPerCommit = iptables.NFTChainsPerCommit
		}
	} else {
		// A dry run execs nothing, so it cannot ask iptables what it
		// supports. Every iptables from 1.6.2 (2018) has --random-fully,
		// and the nat table is printed in one commit whatever the
		// backend, so the output is the same on every machine.
		cfg.RandomFully = true
	}
	w, err := iptables.NewWriter(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s rule writer: %w", cfg.Family, err)
	}
	if ipt != nil {
		var save bytes.Buffer
		if err := ipt.SaveInto(ctx, iptables.TableNAT, &save); err != nil {
			// Not fatal: the chains are only left behind, as before.
			klog.FromContext(ctx).Error(err, "Reading the existing chains; stale service chains from before this start stay", "ipFamily", cfg.Family)
		} else {
			w.NoteExistingChains(iptables.ChainsFromSave(save.Bytes()))
		}
	}
	b := &Backend{family: cfg.Family, w: w, ipt: ipt, out: io.Discard, canaryInterval: proxy.DefaultSyncPeriod}
	for _, opt := range opts {
		if opt != nil {
			opt(b)
		}
	}
	return b, nil
}

// Sync is part of proxy.Backend. It takes one input, of the Backend's
// family, and fails on any other. A failed restore makes the next sync
// full.
func (b *Backend) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	if len(ins) != 1 || ins[0].Family != b.family {
		return make([]proxy.SyncResult, len(ins)), fmt.Errorf("%s iptables backend: given %d inputs, want one of its family", b.family, len(ins))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	in := ins[0]
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
		return out, err
	}
	var err error
	// A full sync is also how rules another program flushed come back,
	// jumps from the built-in chains included.
	if res.Full {
		err = b.w.EnsureJumpRules(ctx, b.ipt)
	}
	if err == nil && len(res.Payload) > 0 {
		err = b.ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
		if err != nil && b.metrics != nil {
			inc(b.metrics.RestoreFailures, b.family)
			if !res.Full {
				inc(b.metrics.PartialRestoreFailures, b.family)
			}
		}
	}
	// The writer must hear the outcome either way: after a failure its
	// next sync is full.
	b.w.Applied(err)
	if err != nil {
		return out, fmt.Errorf("%s %s sync: %w", b.family, syncKind(res.Full), err)
	}
	return out, nil
}

// RouteLocalnet reports whether the rules serve IPv4 node ports on
// 127.0.0.1, which works only with the sysctl net.ipv4.conf.all.route_localnet
// set to 1: the caller's to set, as kube-proxy does at start-up.
func (b *Backend) RouteLocalnet() bool { return b.w.RouteLocalnet() }

// RequestFullSync is part of proxy.Backend.
func (b *Backend) RequestFullSync() { b.w.RequestFullSync() }

// inc adds one to the series of family in v, if there is a v.
func inc(v *prometheus.CounterVec, family v1.IPFamily) {
	if v != nil {
		v.WithLabelValues(string(family)).Inc()
	}
}

// canaryTables are the tables the canary watches, as kube-proxy's: a
// firewall reload that empties any of them takes the proxy's rules, or the
// kubelet's that they depend on, with it.
var canaryTables = []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter}

// CanaryTables returns the tables in which Run keeps a canary chain, whose
// removal brings a full sync: mangle, nat and filter, as kube-proxy's.
func CanaryTables() []iptables.Table { return slices.Clone(canaryTables) }

// Run is part of proxy.Backend. It watches the canary chain: a flush by
// another program (a firewall reload, iptables -F) takes it too, and lost
// then brings a full sync. It also checks the rules for drift
// (WithDriftCheckPeriod). In a dry run it returns at once.
func (b *Backend) Run(ctx context.Context, lost func()) {
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
func (b *Backend) checkDrift(ctx context.Context, lost func()) {
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
		if b.metrics != nil {
			inc(b.metrics.DriftRepairs, b.family)
		}
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
