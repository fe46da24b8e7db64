package main

import (
	"context"
	"fmt"
	"io"
	"time"

	v1 "k8s.io/api/core/v1"

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
}

var _ backend = (*iptablesBackend)(nil)

// fullSyncPeriod bounds the time between full syncs, as in kube-proxy: a
// partial sync trusts that the kernel still holds what the last sync
// wrote, and once an hour that trust is renewed.
const fullSyncPeriod = time.Hour

// newIPTablesBackend makes the backend of one family. cfg carries the
// family and the node's settings; ipt (nil for a dry run) decides the
// backend-dependent parts.
func newIPTablesBackend(cfg iptables.WriterConfig, ipt iptables.Interface, out io.Writer, m *metrics, canaryInterval time.Duration) (*iptablesBackend, error) {
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
	return &iptablesBackend{family: cfg.IPFamily, w: w, ipt: ipt, out: out, metrics: m, canaryInterval: canaryInterval}, nil
}

func (b *iptablesBackend) sync(ctx context.Context, ins []*syncInput) ([]syncOutcome, error) {
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
// reload, iptables -F) takes it too, and lost then brings a full sync.
func (b *iptablesBackend) run(ctx context.Context, lost func()) {
	if b.ipt == nil {
		return
	}
	b.ipt.Monitor(ctx, iptables.ProxyCanaryChain, canaryTables, lost, b.canaryInterval)
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
