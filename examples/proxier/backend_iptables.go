package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/iptables"
)

// iptablesBackend is iptables mode for one IP family: the service rule
// writer renders iptables-restore input, and the Interface applies it. Its
// sync takes that family's input alone.
type iptablesBackend struct {
	family v1.IPFamily
	w      *iptables.Writer
	// ipt applies the payloads; nil in a dry run, which prints them to
	// out instead.
	ipt     iptables.Interface
	out     io.Writer
	metrics *metrics
	// canaryInterval is how often run checks the canary.
	canaryInterval time.Duration
	// driftCheckPeriod is how often run compares the top-level chains
	// with what the writer applied (Writer.CheckDrift); zero turns the
	// check off.
	driftCheckPeriod time.Duration
	// mu is held by sync and by the drift check: the writer is not safe
	// for concurrent use, and a check during a sync would compare the
	// kernel with rules not applied yet.
	mu sync.Mutex
}

var _ backend = (*iptablesBackend)(nil)

// fullSyncPeriod bounds the time between full syncs, as in kube-proxy: a
// partial sync trusts that the kernel still holds what the last sync
// wrote, and once an hour that trust is renewed.
const fullSyncPeriod = time.Hour

// newIPTablesBackend makes the backend of one family. cfg carries the
// family and the node's settings; ipt (nil for a dry run) decides the
// backend-dependent parts. Unless in a dry run, it reads the chains that
// exist in the nat table, so that the first full sync deletes the service
// chains nothing owns any more: those of services deleted while no
// proxier ran, or of a sync killed half-way.
func newIPTablesBackend(ctx context.Context, cfg iptables.WriterConfig, ipt iptables.Interface, out io.Writer, m *metrics, canaryInterval, driftCheckPeriod time.Duration) (*iptablesBackend, error) {
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
		return nil, fmt.Errorf("%s rule writer: %w", cfg.IPFamily, err)
	}
	if ipt != nil {
		var save bytes.Buffer
		if err := ipt.SaveInto(ctx, iptables.TableNAT, &save); err != nil {
			// Not fatal: the chains are only left behind, as before.
			klog.FromContext(ctx).Error(err, "Reading the existing chains; stale service chains from before this start stay", "ipFamily", cfg.IPFamily)
		} else {
			w.NoteExistingChains(iptables.ChainsFromSave(save.Bytes()))
		}
	}
	return &iptablesBackend{family: cfg.IPFamily, w: w, ipt: ipt, out: out, metrics: m,
		canaryInterval: canaryInterval, driftCheckPeriod: driftCheckPeriod}, nil
}

func (b *iptablesBackend) sync(ctx context.Context, ins []*syncInput) ([]syncOutcome, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	in := ins[0]
	res := b.w.Sync(ctx, iptables.SyncInput{
		Services:        in.services,
		Endpoints:       in.endpoints,
		ServiceChanges:  in.serviceChanges,
		EndpointChanges: in.endpointChanges,
		NodeLabels:      in.nodeLabels,
	})
	out := []syncOutcome{{
		full:            res.Full,
		servicePorts:    res.ServicePorts,
		endpoints:       res.Endpoints,
		noLocalInternal: res.NoLocalEndpointsInternal,
		noLocalExternal: res.NoLocalEndpointsExternal,
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
		err = iptables.EnsureJumps(ctx, b.ipt, b.w.JumpRules())
	}
	if err == nil && len(res.Payload) > 0 {
		err = b.ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
		if err != nil {
			b.metrics.restoreFailures.WithLabelValues(string(b.family)).Inc()
			if !res.Full {
				b.metrics.partialFailures.WithLabelValues(string(b.family)).Inc()
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

func (b *iptablesBackend) requestFullSync() { b.w.RequestFullSync() }

// canaryTables are the tables the canary watches, as kube-proxy's: a
// firewall reload that empties any of them takes the proxy's rules, or the
// kubelet's that they depend on, with it.
var canaryTables = []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter}

// run watches the canary chain: a flush by another program (a firewall
// reload, iptables -F) takes it too, and lost then brings a full sync. It
// also checks the top-level chains for drift every driftCheckPeriod: a
// service's jump deleted by hand takes no canary with it.
func (b *iptablesBackend) run(ctx context.Context, lost func()) {
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

// checkDrift compares the top-level chains with what the writer applied
// and, when they differ, logs what it found and calls lost, which brings
// a full sync. It waits for a sync in progress, so that it compares with
// applied rules; an error reading the chains is logged, and the next
// period tries again.
func (b *iptablesBackend) checkDrift(ctx context.Context, lost func()) {
	b.mu.Lock()
	d, err := b.w.CheckDrift(ctx, b.ipt)
	b.mu.Unlock()
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Checking the iptables rules for drift; trying again later", "ipFamily", b.family)
		return
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
