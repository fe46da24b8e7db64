package nftables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/proxy"
)

// Mode is nftables mode for one IP family: the nftables service rule
// writer renders full or partial transactions for the family's table, and
// a knftables.Interface runs them (nft -f). Its Sync takes that family's
// input alone: give each family a Mode, and a BackendGroup, of its own.
type Mode struct {
	family v1.IPFamily
	w      *Writer
	// nft runs the transactions; nil in a dry run, which prints them to
	// out instead.
	nft knftables.Interface
	out io.Writer
	// reg is where NewMode registers metrics.
	reg     *proxy.Metrics
	metrics modeMetrics
	// fullSyncPeriod, when not zero, replaces the config's
	// FullSyncPeriod (withFullSyncPeriod, for tests whose helpers make
	// the config).
	fullSyncPeriod time.Duration
	// lookup reports whether the table exists; Run calls it every
	// checkInterval. nil in a dry run.
	lookup        TableLookup
	closeLookup   func() error
	checkInterval time.Duration
	// timeout bounds each nft command and netlink request; zero or less
	// means no bound (WithCommandTimeout).
	timeout time.Duration
	// applyElements, when not nil, sends the elements of a split first
	// load (withSplitFirstLoad; the default over a real Interface).
	applyElements func([]*knftables.Element) error
	// applyBatch, when not nil, sends the element changes of a partial
	// sync that changes only elements (withNetlinkElementSyncs; the
	// default over a real Interface).
	applyBatch func(ElementBatch) error
	// watcher follows nf_tables' commits for the periodic resync; nil
	// in a dry run, or when the monitor group could not be joined.
	watcher *KernelWatcher
	// closeState closes the socket of the KernelState NewMode made when
	// there is no watcher (which closes its own).
	closeState func() error
	// mu keeps a check from running during a sync, which may delete and
	// recreate the table.
	mu sync.Mutex
	// tableLost is set when a check found the table gone, until a sync
	// has run: the repair is then pending, and a check does not ask for
	// it again.
	tableLost atomic.Bool
	// driftCheckPeriod is how often Run asks the writer whether others
	// changed the table (WithDriftCheckPeriod); zero: never.
	driftCheckPeriod time.Duration
	// repairPending is set when a drift check asked for a repair, until
	// a sync has run; repairOnly from requestRepair until the sync with
	// Full set that its lost asked for.
	repairPending, repairOnly atomic.Bool
}

var _ proxy.Backend = (*Mode)(nil)

// TableLookup reports whether the table the Mode writes exists in the
// kernel; an error means it could not tell.
type TableLookup func(ctx context.Context) (bool, error)

// ModeOption configures a Mode; see NewMode.
type ModeOption func(*Mode)

// WithDryRun makes a Mode made without an Interface print each sync's
// transaction to out, after a comment line naming the family and the
// table, as `nft -f` takes it, instead of discarding it.
func WithDryRun(out io.Writer) ModeOption {
	return func(b *Mode) {
		if out != nil {
			b.out = out
		}
	}
}

// WithMetrics makes NewMode register nftables mode's metrics on m, under
// kube-proxy's names: kubeproxy_sync_proxy_rules_nftables_sync_failures_total
// and ..._nftables_cleanup_failures_total, each by ip_family. Without it
// they are counted nowhere.
func WithMetrics(m *proxy.Metrics) ModeOption {
	return func(b *Mode) { b.reg = m }
}

// WithCheckPeriod sets how often Run checks that the table still
// exists (the default is proxy.DefaultSyncPeriod, the period at which
// iptables mode checks its canary). A period that is not positive keeps
// the default.
func WithCheckPeriod(d time.Duration) ModeOption {
	return func(b *Mode) {
		if d > 0 {
			b.checkInterval = d
		}
	}
}

// withoutNetlink turns the netlink fast paths off, for tests that run the
// real knftables with an nft of their own in the test's namespace.
func withoutNetlink() ModeOption {
	return func(b *Mode) { b.applyElements, b.applyBatch = nil, nil }
}

// withFullSyncPeriod replaces the config's FullSyncPeriod, for tests whose
// helpers make the config.
func withFullSyncPeriod(d time.Duration) ModeOption {
	return func(b *Mode) { b.fullSyncPeriod = d }
}

// withSplitFirstLoad, the default outside a dry run and a
// knftables.Fake, makes a full sync into a missing table (the first on
// the node, or after the table was deleted) send the bulk of its elements
// with apply after nft has created the rest, instead of through nft's
// parser: WriterConfig.SplitFirstLoad, faster at scale, where nft's
// parsing dominates (BENCHMARKS.md). apply nil means
// ApplyElements, which talks to the network namespace of the
// thread that syncs, bounded by WithCommandTimeout; it must reach the
// kernel nft's Interface runs in, so leave this off over a
// knftables.Fake. Ignored in a dry run, which prints everything as nft -f
// takes it.
func withSplitFirstLoad(apply func([]*knftables.Element) error) ModeOption {
	return func(b *Mode) {
		if apply == nil {
			apply = func(elements []*knftables.Element) error { return b.netlink().ApplyElements(elements) }
		}
		b.applyElements = apply
	}
}

// withNetlinkElementSyncs, the default outside a dry run and a
// knftables.Fake, makes a partial sync whose only changes are
// elements of the writer's big maps and sets (endpoints coming and going,
// services added or removed whose chains exist: the common case) reach the
// kernel as one netlink batch sent by apply, instead of an exec of nft -f:
// WriterConfig.NetlinkElementSyncs, which says which syncs
// qualify (docs/benchmarks-history.md, "nftables mode end to end"). The batch is
// atomic as the transaction is, and its outcome reaches the writer and
// the metrics the same way: a refused batch changes nothing, counts as a
// failed sync, and makes the next sync full. apply nil means
// ApplyElementBatch, which talks to the network namespace of the
// thread that syncs, bounded by WithCommandTimeout; it must reach the
// kernel nft's Interface runs in, so leave this off over a
// knftables.Fake. Ignored in a dry run, which prints every transaction as
// nft -f takes it.
func withNetlinkElementSyncs(apply func(ElementBatch) error) ModeOption {
	return func(b *Mode) {
		if apply == nil {
			apply = func(batch ElementBatch) error { return b.netlink().ApplyElementBatch(batch) }
		}
		b.applyBatch = apply
	}
}

// WithTableLookup replaces how Run finds out whether the table exists
// (by default one netlink request for the table alone, in the network
// namespace NewMode ran in); for tests, and for a caller whose Interface
// does not run nft in this network namespace. It is ignored in a dry run.
func WithTableLookup(f TableLookup) ModeOption {
	return func(b *Mode) {
		if f != nil {
			b.lookup = f
		}
	}
}

// WithCommandTimeout bounds each nft command the Mode runs (through
// BoundedInterface) and each nf_tables netlink request of its
// own (Netlink): the element batches of the first load and of partial
// syncs of elements alone, and the reads of the periodic resync. A command or batch that runs longer is killed or given up on,
// and its sync fails with an error for which IsCommandTimeout is
// true; its transaction may have been committed or not, so the next sync
// is full, as after any failed sync, and the Proxier retries it. Zero or
// less means no bound. The default is DefaultCommandTimeout;
// set it well above the longest full sync the node's table needs (see
// BENCHMARKS.md). The bound is iptables.WithCommandTimeout's twin.
func WithCommandTimeout(d time.Duration) ModeOption {
	return func(b *Mode) { b.timeout = d }
}

// netlink makes the Mode's own netlink requests, bounded as
// WithCommandTimeout says.
func (b *Mode) netlink() Netlink {
	if b.timeout <= 0 {
		return Netlink{Timeout: -1}
	}
	return Netlink{Timeout: b.timeout}
}

// NewMode makes the Mode of one family. cfg carries the family, the table
// and the node's settings; NewMode sets its FullSyncPeriod (an hour, as
// kube-proxy's, or WithFullSyncPeriod's) and, outside a dry run and unless
// cfg has one, its KernelState, so that the periodic resync repairs what
// drifted instead of rewriting the table. nft runs the transactions and
// must be made for cfg's family and table (knftables.New(family, table));
// a nil nft makes a dry run, which runs nothing and prints each sync's
// transaction (WithDryRun).
//
// Unless in a dry run or given WithTableLookup, NewMode opens the netlink
// socket Run checks the table with, in the network namespace of the
// calling thread; Close closes it. NewMode fails when the writer refuses cfg,
// or when that socket cannot be opened (on other systems than Linux, it
// always fails without WithTableLookup).
func NewMode(ctx context.Context, cfg WriterConfig, nft knftables.Interface, opts ...ModeOption) (*Mode, error) {
	b := &Mode{family: cfg.Family, out: io.Discard, checkInterval: proxy.DefaultSyncPeriod,
		timeout: DefaultCommandTimeout, driftCheckPeriod: proxy.DefaultSyncPeriod}
	// A knftables.Fake, or a test's type that embeds one, holds no table
	// in any kernel: netlink must not go near the namespace's own.
	_, fake := nft.(interface{ Dump() string })
	if nft != nil && !fake {
		// The fast paths reach the kernel nft runs in: the calling
		// thread's namespace, as nft's.
		b.applyElements = func(elements []*knftables.Element) error { return b.netlink().ApplyElements(elements) }
		b.applyBatch = func(batch ElementBatch) error { return b.netlink().ApplyElementBatch(batch) }
	}
	for _, opt := range opts {
		if opt != nil {
			opt(b)
		}
	}
	var err error
	if b.metrics, err = newModeMetrics(b.reg); err != nil {
		return nil, fmt.Errorf("%s nftables mode: %w", cfg.Family, err)
	}
	// The writer lists the table through nft too: every nft command of
	// a sync has the bound.
	b.nft = BoundedInterface(nft, b.timeout)
	if b.fullSyncPeriod != 0 {
		cfg.FullSyncPeriod = b.fullSyncPeriod
	}
	switch {
	case cfg.FullSyncPeriod == 0:
		cfg.FullSyncPeriod = proxy.DefaultFullSyncPeriod
	case cfg.FullSyncPeriod < 0:
		cfg.FullSyncPeriod = 0
	}
	if nft == nil {
		b.applyElements, b.applyBatch = nil, nil
	}
	cfg.SplitFirstLoad = b.applyElements != nil
	cfg.NetlinkElementSyncs = b.applyBatch != nil
	if nft != nil && !fake && cfg.KernelState == nil {
		// The periodic resync reads the generation and, when others
		// committed, looks only at what their batches changed in the
		// table (the watcher) or, without one, compares by key, instead
		// of rewriting the table (docs/benchmarks-history.md, "Periodic
		// resync without a rewrite"). "": the namespace of the calling
		// thread, the one nft runs in.
		kw, err := b.netlink().WatchKernel("")
		if err != nil {
			klog.FromContext(ctx).Info("Not following nf_tables' commits; a periodic resync after another program's commit compares the whole table by key", "ipFamily", cfg.Family, "err", err)
			ks := b.netlink().KernelState("")
			cfg.KernelState = ks
			if c, ok := ks.(io.Closer); ok {
				b.closeState = c.Close
			}
		} else {
			cfg.KernelState, b.watcher = kw, kw
		}
	}
	renderer := b.nft
	if renderer == nil {
		// A dry run renders through a Fake, which holds no table: the
		// first full sync finds nothing to delete, and its transaction
		// is what an empty node would be given.
		family := knftables.IPv4Family
		if cfg.Family == v1.IPv6Protocol {
			family = knftables.IPv6Family
		}
		table := cfg.TableName
		if table == "" {
			table = DefaultTableName
		}
		renderer = knftables.NewFake(family, table)
	}
	w, err := NewWriter(renderer, cfg)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("%s nftables rule writer: %w", cfg.Family, err)
	}
	b.w = w
	if nft == nil {
		b.lookup = nil
		return b, nil
	}
	if b.lookup == nil {
		lookup, closeFn, err := netlinkTableLookup(w.Family(), w.Table())
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("%s nftables backend: opening the netlink socket that watches table %s %s: %w", cfg.Family, w.Family(), w.Table(), err)
		}
		b.lookup, b.closeLookup = lookup, closeFn
	}
	return b, nil
}

// Family returns the nft family of the Mode's table, "ip" or "ip6".
func (b *Mode) Family() knftables.Family { return b.w.Family() }

// Table returns the name of the Mode's table.
func (b *Mode) Table() string { return b.w.Table() }

// Sync is part of proxy.Backend. It takes one input, of the Mode's
// family, and fails on any other. A failed transaction changes nothing in
// the kernel (nft applies a transaction whole or not at all) and makes the
// next sync full. One that timed out (WithCommandTimeout) may have been
// committed or not, and makes the next sync full too.
func (b *Mode) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	if len(ins) != 1 || ins[0].Family != b.family {
		return make([]proxy.SyncResult, len(ins)), fmt.Errorf("%s nftables backend: given %d inputs, want one of its family", b.family, len(ins))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	in := ins[0]
	if in.Full && b.repairOnly.Swap(false) {
		// The Full that the lost of a drift check asked for: the writer
		// compares the table and mends what differs (RequestResync)
		// instead of rewriting it.
		withoutFull := *in
		withoutFull.Full = false
		in = &withoutFull
	}
	res := b.w.Sync(ctx, in)
	if b.nft == nil {
		var err error
		if res.Transaction.NumOperations() > 0 {
			_, err = fmt.Fprintf(b.out, "# %s: nft -f input for table %s %s\n%s", b.family, b.w.Family(), b.w.Table(), res.Transaction)
		}
		b.w.Applied(err)
		return result(res), err
	}
	// A full sync asked for after the table's loss needs no second try:
	// the writer's transaction holds whether or not what it remembers
	// went with the table (Writer.RequestFullSync).
	err := b.apply(ctx, res)
	b.tableLost.Store(false)
	b.repairPending.Store(false)
	if err != nil {
		return result(res), fmt.Errorf("%s %s sync of nftables table %s %s: %w", b.family, syncKind(res.Full), b.w.Family(), b.w.Table(), err)
	}
	return result(res), nil
}

// result is the proxier's view of a writer's result.
func result(res SyncResult) []proxy.SyncResult {
	return []proxy.SyncResult{{
		Full:                     res.Full,
		ServicePorts:             res.ServicePorts,
		Endpoints:                res.Endpoints,
		NoLocalEndpointsInternal: res.NoLocalEndpointsInternal,
		NoLocalEndpointsExternal: res.NoLocalEndpointsExternal,
	}}
}

// apply runs res's transaction, tells the writer the outcome, and counts
// a failure.
func (b *Mode) apply(ctx context.Context, res SyncResult) error {
	run := func() error {
		if res.Transaction.NumOperations() > 0 {
			if err := b.nft.Run(ctx, res.Transaction); err != nil {
				return err
			}
		}
		if len(res.Elements) > 0 {
			// A split first load: the table, chains and rules are in;
			// the elements follow in one netlink batch. Should it fail,
			// the table stands without them and the next sync, full,
			// fills it through nft.
			if err := b.applyElements(res.Elements); err != nil {
				return fmt.Errorf("adding %d elements through netlink: %w", len(res.Elements), err)
			}
		}
		if res.Batch != nil {
			// A partial sync of elements alone, in one batch instead of
			// nft's transaction: all of it or nothing, as nft's.
			if err := b.applyBatch(*res.Batch); err != nil {
				return fmt.Errorf("deleting %d and adding %d elements through netlink: %w", len(res.Batch.Delete), len(res.Batch.Add), err)
			}
		}
		return nil
	}
	var err error
	if res.Full && b.watcher != nil {
		// A full sync's batches would make the kernel build a
		// notification per object for the watcher; the next resync
		// compares instead (KernelWatcher.Quiet).
		err = b.watcher.Quiet(run)
	} else {
		err = run()
	}
	// The writer must hear the outcome either way: after a failure its
	// next sync is full, and lists the table first.
	b.w.Applied(err)
	if err != nil {
		b.metrics.syncFailures.WithLabelValues(string(b.family)).Inc()
		// Stale chains are deleted in the sync's own transaction
		// (kube-proxy deletes them in a later one): when it fails, they
		// stay, and the cleanup failed with it.
		if res.ChainsDeleted > 0 {
			b.metrics.cleanupFailures.WithLabelValues(string(b.family)).Inc()
		}
	}
	return err
}

// RequestFullSync makes the next Sync rewrite the table, as an input with
// Full set does. It is safe to call from any goroutine.
func (b *Mode) RequestFullSync() { b.w.RequestFullSync() }

// Run is part of proxy.Backend. Every check interval it asks the kernel
// whether the table still exists, and calls lost when it does not: nft
// flush ruleset (a firewall service's reload) or nft delete table took it.
// A partial sync would fail on the missing table anyway, but with nothing
// changing no sync comes, and the services would stay down until the
// hourly full sync. A check waits for a sync in progress; a check that
// cannot tell is logged, and the next one tries again. It also checks
// for changes by other programs inside the table, when the watcher
// signals a commit to it and every drift check period, and asks for a
// sync that repairs them (WithDriftCheckPeriod). In a dry run Run
// returns at once.
func (b *Mode) Run(ctx context.Context, lost func()) {
	if b.lookup == nil {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { b.watchDrift(ctx, lost) })
	t := time.NewTicker(b.checkInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			b.checkTable(ctx, lost)
		}
	}
}

// checkTable calls lost if the table is gone.
func (b *Mode) checkTable(ctx context.Context, lost func()) {
	b.mu.Lock()
	ok, err := b.lookup(ctx)
	b.mu.Unlock()
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Checking that the nftables table exists; trying again later", "ipFamily", b.family, "table", b.w.Table())
		return
	}
	// Once per loss: until a sync has run, the full sync asked for is
	// still to come (or is being retried by the Proxier).
	if !ok && !b.tableLost.Swap(true) {
		logger.Info("The nftables table was deleted by another program; syncing everything", "ipFamily", b.family, "family", b.w.Family(), "table", b.w.Table())
		// A full sync, even if a repair was asked for before.
		b.repairOnly.Store(false)
		lost()
	}
}

// Close closes the netlink sockets of the table check, of the watcher of
// nf_tables' commits and of the generation reads of the writer's periodic
// resync, if NewMode opened them. The Mode must not be used after.
func (b *Mode) Close() error {
	var errs []error
	if b.closeLookup != nil {
		errs = append(errs, b.closeLookup())
		b.closeLookup = nil
	}
	if b.watcher != nil {
		errs = append(errs, b.watcher.Close())
		b.watcher = nil
	}
	if b.closeState != nil {
		errs = append(errs, b.closeState())
		b.closeState = nil
	}
	return errors.Join(errs...)
}

func syncKind(full bool) string {
	if full {
		return "full"
	}
	return "partial"
}
