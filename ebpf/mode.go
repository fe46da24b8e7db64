package ebpf

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/proxy"
)

// Mode is the socket load balancer as a proxy.Backend for one IP family:
// a Writer over that family's Maps (a Datapath, or an ebpftest.Fake in
// tests). Its Sync takes that family's input alone: give each family a
// Mode, and a BackendGroup, of its own. It serves only the sockets of the
// Datapath's cgroup, so a node also needs a packet-level Backend of the
// same family (nftables mode, say) in a BackendGroup of its own for
// traffic from outside the node; the two never act on one packet, since
// a translated socket never carries a Service address.
type Mode struct {
	family v1.IPFamily
	w      *Writer
	m      Maps
	reg    *proxy.Metrics
	// syncFailures and drifted are the Mode's metrics, by ip_family.
	syncFailures, drifted *prometheus.CounterVec
	// driftCheckPeriod is how often Run compares the maps with what the
	// writer wrote; zero or less: never.
	driftCheckPeriod time.Duration
	// mu keeps a drift check from reading the maps during a sync.
	mu sync.Mutex
	// repairPending is set when a drift check asked for a repair, until
	// a sync has run, so that a check asks once.
	repairPending atomic.Bool
	// out receives a dry run's maps (WithDryRun); dryRun is set for a
	// Mode made without Maps.
	out    io.Writer
	dryRun bool
}

var _ proxy.Backend = (*Mode)(nil)

// ModeOption configures a Mode; see NewMode.
type ModeOption func(*Mode)

// WithMetrics makes NewMode register the Mode's metrics on m:
// kubeproxy_sync_proxy_rules_ebpf_sync_failures_total (syncs whose map
// writes failed) and kubeproxy_sync_proxy_rules_ebpf_drifted_elements_total
// (elements a full sync found changed behind the writer's back and
// rewrote), each by ip_family. Without it they are counted nowhere.
func WithMetrics(m *proxy.Metrics) ModeOption {
	return func(b *Mode) { b.reg = m }
}

// WithDriftCheckPeriod sets how often Run reads the maps and compares
// them with what the writer wrote ([Writer.Drift]); when they differ, it
// calls lost so that the next sync, full, rewrites what differs. The
// default is proxy.DefaultSyncPeriod; zero or less turns the check off,
// leaving the repair to the periodic full sync.
func WithDriftCheckPeriod(d time.Duration) ModeOption {
	return func(b *Mode) { b.driftCheckPeriod = d }
}

// NewMode makes the Mode of cfg.Family over m, which must be of that
// family. A cfg.FullSyncPeriod of zero becomes proxy.DefaultFullSyncPeriod
// (an hour) and one below zero none. The Mode owns m: Close closes it
// when it is an io.Closer (a Datapath, whose programs and pinned maps
// stay in the kernel; Cleanup removes them). A nil m makes a dry run: the
// writer writes to maps in memory, whose elements each sync prints
// (WithDryRun). It fails when the writer refuses cfg or m, or the
// metrics cannot be registered.
func NewMode(ctx context.Context, cfg WriterConfig, m Maps, opts ...ModeOption) (*Mode, error) {
	b := &Mode{family: cfg.Family, m: m, driftCheckPeriod: proxy.DefaultSyncPeriod}
	for _, opt := range opts {
		if opt != nil {
			opt(b)
		}
	}
	if m == nil {
		b.m, b.dryRun = newMemMaps(cfg.Family), true
		if b.out == nil {
			b.out = io.Discard
		}
	}
	switch {
	case cfg.FullSyncPeriod == 0:
		cfg.FullSyncPeriod = proxy.DefaultFullSyncPeriod
	case cfg.FullSyncPeriod < 0:
		cfg.FullSyncPeriod = 0
	}
	var err error
	if b.syncFailures, err = b.reg.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_ebpf_sync_failures_total",
		Help: "eBPF mode syncs whose map writes failed (the next sync is full)."}, []string{"ip_family"}); err != nil {
		return nil, fmt.Errorf("%s ebpf mode: %w", cfg.Family, err)
	}
	if b.drifted, err = b.reg.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_ebpf_drifted_elements_total",
		Help: "Elements of the eBPF maps that a full sync found changed by others, and rewrote."}, []string{"ip_family"}); err != nil {
		return nil, fmt.Errorf("%s ebpf mode: %w", cfg.Family, err)
	}
	if b.w, err = NewWriter(b.m, cfg); err != nil {
		return nil, fmt.Errorf("%s ebpf mode: %w", cfg.Family, err)
	}
	klog.FromContext(ctx).V(2).Info("eBPF mode ready", "ipFamily", cfg.Family)
	return b, nil
}

// Writer returns the Mode's writer, for reading what it wrote.
func (b *Mode) Writer() *Writer { return b.w }

// Sync is part of proxy.Backend. It takes one input, of the Mode's
// family, and fails on any other. A failed write leaves the maps partly
// written and makes the next sync full, which reads the maps and writes
// what differs.
func (b *Mode) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	if len(ins) != 1 || ins[0].Family != b.family {
		return make([]proxy.SyncResult, len(ins)), fmt.Errorf("%s ebpf backend: given %d inputs, want one of its family", b.family, len(ins))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	res, err := b.w.Sync(ctx, ins[0])
	b.repairPending.Store(false)
	if res.Drifted > 0 {
		b.drifted.WithLabelValues(string(b.family)).Add(float64(res.Drifted))
	}
	if err != nil {
		b.syncFailures.WithLabelValues(string(b.family)).Inc()
		return []proxy.SyncResult{res.Proxy()}, fmt.Errorf("%s %s sync of the ebpf maps: %w", b.family, syncKind(res.Full), err)
	}
	if b.dryRun {
		if err := b.printDryRun(); err != nil {
			return []proxy.SyncResult{res.Proxy()}, fmt.Errorf("%s ebpf dry run: %w", b.family, err)
		}
	}
	return []proxy.SyncResult{res.Proxy()}, nil
}

func syncKind(full bool) string {
	if full {
		return "full"
	}
	return "partial"
}

// RequestFullSync makes the next Sync full. It is safe to call from any
// goroutine.
func (b *Mode) RequestFullSync() { b.w.RequestFullSync() }

// Run is part of proxy.Backend. Every drift check period it reads the
// maps and, when they differ from what the writer wrote (another program
// wrote or deleted elements, or a write's outcome was unknown), calls
// lost once until the next sync, which is full and rewrites what
// differs. A check that cannot read the maps is logged, and the next one
// tries again. With the check off, Run returns at once.
func (b *Mode) Run(ctx context.Context, lost func()) {
	if b.driftCheckPeriod <= 0 {
		return
	}
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
}

// checkDrift compares the maps with what the writer wrote and asks for
// a repair when they differ. It waits for a sync in progress.
func (b *Mode) checkDrift(ctx context.Context, lost func()) {
	b.mu.Lock()
	n, err := b.w.Drift()
	b.mu.Unlock()
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Checking the eBPF maps for changes by others; trying again later", "ipFamily", b.family)
		return
	}
	if n == 0 || b.repairPending.Swap(true) {
		return
	}
	logger.Info("The eBPF maps were changed by another program; syncing everything", "ipFamily", b.family, "elements", n)
	lost()
}

// Close closes the Maps when they are an io.Closer (a Datapath: the
// process lets go of its programs and maps, which stay attached and
// pinned). The Mode must not be used after.
func (b *Mode) Close() error {
	if c, ok := b.m.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
