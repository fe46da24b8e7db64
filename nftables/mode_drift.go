package nftables

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// WithDriftCheckPeriod sets how often Run asks whether another program
// may have changed the table (Writer.Drifted: the nf_tables
// generation and, if it moved, what the watcher saw), and, when it may
// have, asks for a sync that compares the table and repairs what differs
// (Writer.RequestResync), as iptables mode's drift check does.
// The default is proxy.DefaultSyncPeriod; zero turns the periodic check
// off, leaving the watcher's signals and the hourly resync. A check with
// nothing changed reads the generation alone. Ignored in a dry run.
//
// How fast drift is found (the repair is the next sync's, which the
// Proxier runs no sooner than its minimum sync period):
//   - with the watcher of nf_tables' monitor group (the default where the
//     group can be joined), another program's commit to the table is
//     seen as it happens, and what it changed (elements, chains, rules,
//     sets, maps, added or deleted) is compared and repaired in the next
//     sync;
//   - what the watcher missed (a commit while it was out of the group for
//     one of the Mode's full syncs, or notifications lost) and, without
//     the watcher, any commit by another program in the namespace, at the
//     next periodic check: then the chains (and their rule counts), the
//     sets and maps, and the elements of all but the endpoints maps are
//     listed, and what is missing or added is repaired;
//   - without the watcher, an element of the endpoints maps deleted or
//     added and an element whose value was changed in place, at the
//     first check a full sync period after the last thorough comparison,
//     which looks every element up by key (Writer's resync);
//   - a rule changed in place, with the same number of rules in its
//     chain, and the elements of the interval sets (firewall-allow,
//     nodeport-ips), only when the watcher names the chain or set, or
//     at a full sync;
//   - the table deleted: at the next table check (WithCheckPeriod), by
//     a full sync.
func WithDriftCheckPeriod(d time.Duration) ModeOption {
	return func(b *Mode) {
		if d >= 0 {
			b.driftCheckPeriod = d
		}
	}
}

// watchDrift runs the drift checks until ctx is done: at every signal of
// the watcher and every drift check period.
func (b *Mode) watchDrift(ctx context.Context, lost func()) {
	var ticks <-chan time.Time
	if b.driftCheckPeriod > 0 {
		t := time.NewTicker(b.driftCheckPeriod)
		defer t.Stop()
		ticks = t.C
	}
	var signals <-chan struct{}
	if b.watcher != nil {
		signals = b.watcher.Notify(b.w.Family(), b.w.Table())
	}
	if ticks == nil && signals == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		case <-signals:
		}
		b.checkDrift(ctx, lost)
	}
}

// checkDrift asks the writer whether others may have changed the table
// since its last transaction and, if so, asks for a repair. It waits for
// a sync in progress, whose own commits are then known to the writer.
func (b *Mode) checkDrift(ctx context.Context, lost func()) {
	b.mu.Lock()
	drifted, err := b.w.Drifted()
	b.mu.Unlock()
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Checking the nftables table for changes by others; trying again later", "ipFamily", b.family, "table", b.w.Table())
		return
	}
	// Once until the next sync, which is the repair; a lost table is
	// being repaired by a full sync.
	if !drifted || b.tableLost.Load() || b.repairPending.Swap(true) {
		return
	}
	logger.V(2).Info("Another program may have changed the nftables table; comparing it in the next sync", "ipFamily", b.family, "table", b.w.Table())
	b.requestRepair(lost)
}

// requestRepair asks, through lost, for a sync that compares the table
// and repairs it (RequestResync) instead of rewriting it. lost is how a
// Mode asks the composition for a sync, which then comes with Full
// set: while repairOnly is set, Sync takes that Full for the repair it
// asked for.
func (b *Mode) requestRepair(lost func()) {
	b.w.RequestResync()
	b.repairOnly.Store(true)
	lost()
}
