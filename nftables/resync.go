package nftables

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"
)

// KernelState reads from the kernel what a Writer's periodic resync needs
// to find out, without listing its table through nft, whether the table
// still holds what the writer wrote. NewKernelState returns the nf_tables
// netlink implementation and WatchKernel one that is also a TableWatcher;
// tests may give a fake that reads a knftables.Fake.
type KernelState interface {
	// Generation returns the nf_tables generation of the namespace the
	// writer's table is in: a counter the kernel bumps once for every
	// committed batch (transaction) of any table, and never for a batch
	// it refused. It is read before and after every sync's transaction
	// or batch: an implementation that closes a netfilter socket after
	// each read waits, on the close after a batch that deleted elements,
	// for the kernel to free them (an RCU grace period; see the package
	// doc's Transport).
	Generation() (uint32, error)
	// RuleCounts returns the chains of the table and the number of rules
	// each holds. It fails with an error wrapping ErrTableNotFound when
	// the table does not exist.
	RuleCounts(family knftables.Family, table string) (map[string]int, error)
	// CheckElements reports, for each element, whether its set or map
	// holds its key (ElementMissing if not) and, for a map, with its
	// value (ElementDiffers if not). Comments are not compared. It fails
	// if a set cannot be read or an element is of a set it cannot check.
	CheckElements(elements []*knftables.Element) ([]ElementState, error)
}

// TableWatcher is implemented by a KernelState that follows the batches
// committed in the namespace (KernelWatcher). A writer whose KernelState
// implements it asks, when the generation moved, what the batches of
// others changed in its table, and compares only that.
type TableWatcher interface {
	// Changes returns what the batches committed after generation after,
	// up to and including upTo, changed in the table, and false if that
	// is not known (notifications lost, or the watcher stopped).
	Changes(family knftables.Family, table string, after, upTo uint32) (TableChanges, bool)
}

// TableLister is implemented by a KernelState that can also list a
// table's sets and the keys of a set's elements (NewKernelState's and
// KernelWatcher do). A writer whose KernelState implements it finds, in a
// comparison of the whole table, the sets, maps and elements that others
// added to its table, and deletes them; without it, only the chains
// others added are found (from RuleCounts).
type TableLister interface {
	// Sets returns the table's named sets and maps, true for a map (not
	// the anonymous sets nft makes for a rule's literal set or verdict
	// map). It fails with an error wrapping ErrTableNotFound when the
	// table does not exist.
	Sets(family knftables.Family, table string) (map[string]bool, error)
	// ElementKeys returns the keys of the elements of one of the sets or
	// maps CheckElements checks, their parts joined by " . " as nft
	// writes them. Listing a set costs the kernel more than looking up as
	// many keys, and more than linearly in the set's size.
	ElementKeys(family knftables.Family, table, set string) ([]string, error)
}

// TableChanges is what batches changed in a table, as a TableWatcher
// saw them.
type TableChanges struct {
	// Touched is false when no batch changed anything in the table; the
	// other fields are then empty.
	Touched bool
	// All says the batches changed more than Chains, Sets and Elements
	// list (the table was added or deleted, a set flushed, or there was
	// too much to keep): the whole table must be compared.
	All bool
	// Chains are the chains added, deleted, or whose rules changed.
	Chains map[string]bool
	// Sets are the named sets and maps added or deleted (not the
	// anonymous ones of rules, which go with their chains). A
	// TableWatcher that does not tell them apart says All instead.
	Sets map[string]bool
	// Elements are, by set or map name, the keys of the elements added
	// or deleted, their parts joined by " . " as nft writes them.
	// Elements of sets whose elements the writer does not compare
	// (firewall-allow, nodeport-ips) may be left out.
	Elements map[string]map[string]bool
}

// ErrTableNotFound is wrapped by KernelState.RuleCounts's error when the
// table does not exist. Test for it with [IsNotFound].
var ErrTableNotFound = errors.New("nftables table not found")

// ElementState is what KernelState.CheckElements found for one element.
type ElementState uint8

const (
	// ElementPresent: the kernel holds the element, with its value.
	ElementPresent ElementState = iota
	// ElementMissing: the kernel does not hold the element's key.
	ElementMissing
	// ElementDiffers: the kernel holds the key with another value.
	ElementDiffers
)

// Resync says what a sync did about the periodic resync
// (WriterConfig.FullSyncPeriod).
type Resync uint8

const (
	// ResyncNone: no periodic resync was due, or the sync was full for
	// another reason.
	ResyncNone Resync = iota
	// ResyncSkipped: the namespace's nf_tables generation was still the
	// one after the writer's last transaction, or a TableWatcher saw that
	// the batches since did not touch the table, so nothing can have
	// changed it: the sync is partial.
	ResyncSkipped
	// ResyncChecked: others committed since, so the writer compared the
	// table with its memory (WriterConfig.KernelState) and the partial
	// sync's transaction repairs what differed (SyncResult.Drifted, maybe
	// nothing).
	ResyncChecked
	// ResyncRewrite: the resync is a full sync, because the writer has no
	// KernelState, the comparison failed, the table is missing, or a
	// per-service chain drifted.
	ResyncRewrite
)

// String returns the outcome's name, for logs and metrics.
func (r Resync) String() string {
	switch r {
	case ResyncSkipped:
		return "skipped"
	case ResyncChecked:
		return "checked"
	case ResyncRewrite:
		return "rewrite"
	}
	return "none"
}

// genTrack is the writer's knowledge of the nf_tables generation.
//
// base, when valid, is a generation at which the kernel held exactly what
// the writer's memory says. A sync reads the generation g0 before its
// transaction is run (in Sync) and g1 after (in Applied). The kernel bumps
// the generation once per committed batch, so g1 == g0 + the number of
// batches the caller ran (one: the transaction, or the netlink batch of a
// partial sync that NetlinkElementSyncs sends; two for a split load; none
// for an empty transaction) means no one else committed between the two reads, and
// then the kernel at g1 is the kernel at g0 plus our transaction: if the
// kernel at g0 was what memory said (g0 == base, or a full sync that
// rewrote everything, or a drift check that read the kernel after g0 and
// whose repair is in the transaction), so is the kernel at g1, which
// becomes base. Any other commit, before or after ours, makes the gap
// larger (or g0 differ from base) and leaves base invalid, so it is never
// mistaken for ours; a commit by another between g0 and the run of our
// transaction is counted the same way. An invalid base makes the next
// periodic resync compare the table instead of skipping it.
type genTrack struct {
	base  uint32
	valid bool
	// The sync awaiting Applied: its g0 (if read), whether the kernel at
	// g0 plus its transaction is known to be what memory says, and how
	// many batches running it commits.
	g0      uint32
	g0ok    bool
	vouch   bool
	batches uint32
}

// nextGen returns the generation n batches after g: the kernel skips 0
// when the counter wraps.
func nextGen(g, n uint32) uint32 {
	for range n {
		g++
		if g == 0 {
			g = 1
		}
	}
	return g
}

// readGen reads g0 for the sync being rendered and reports whether the
// kernel is known to be unchanged since the writer's last transaction;
// if not, scope is what a TableWatcher saw others change in the table
// (nil: unknown, compare everything).
func (w *Writer) readGen(logger klog.Logger) (unchanged bool, scope *TableChanges) {
	w.gt.g0ok, w.gt.vouch = false, false
	if w.kernel == nil {
		return false, nil
	}
	g, err := w.kernel.Generation()
	if err != nil {
		logger.Error(err, "Reading the nf_tables generation failed; the next periodic resync compares the table", "table", w.table, "ipFamily", w.cfg.Family)
		w.gt.valid = false
		return false, nil
	}
	w.gt.g0, w.gt.g0ok = g, true
	if !w.gt.valid {
		return false, nil
	}
	if g == w.gt.base {
		return !w.thoroughPending(), nil
	}
	// While base is valid, every batch after it is another's (the
	// writer's own vouched ones moved base): if none touched the table,
	// the table at g is still what memory says; if some did, what they
	// touched is all that can differ.
	tw, ok := w.kernel.(TableWatcher)
	if !ok {
		return false, nil
	}
	ch, known := tw.Changes(w.family, w.table, w.gt.base, g)
	// What others did to the table is known to be there: compare now,
	// whether or not a periodic resync is due (see resyncDue).
	w.drift.touched = known && ch.Touched
	switch {
	case !known:
		return false, nil
	case !ch.Touched:
		return true, nil
	case ch.All:
		return false, nil
	}
	// One of the writer's own sets deleted (and maybe added again)
	// took its elements with it: compare them all.
	for set := range ch.Sets {
		if w.drift.sets[set] {
			return false, nil
		}
	}
	return false, &ch
}

// driftState is what the writer keeps, beside genTrack and ruleCounts, to
// find and repair drift between full syncs.
type driftState struct {
	// asked is set by RequestResync and taken by the next Sync.
	asked atomic.Bool
	// touched: readGen learned from a TableWatcher that others' batches
	// changed the table since the writer's last transaction.
	touched bool
	// listed is when a comparison last looked up every element and
	// listed the endpoints maps, or a full sync flushed them; unlisted,
	// that a comparison since did not.
	listed   time.Time
	unlisted bool
	// sets are the sets and maps the writer left in the table.
	sets map[string]bool
}

// resyncDue reports whether the sync being rendered, unless full, is a
// resync: FullSyncPeriod has passed since the last one, RequestResync
// asked for one, or (with a KernelState) readGen found that others
// changed the table. It takes RequestResync's request, which a full sync
// fulfils too.
func (w *Writer) resyncDue(now time.Time, full bool) bool {
	asked := w.drift.asked.Swap(false)
	touched := w.drift.touched
	w.drift.touched = false
	if full {
		return false
	}
	periodic := w.cfg.FullSyncPeriod > 0 && now.Sub(w.lastFull) >= w.cfg.FullSyncPeriod
	return periodic || asked || touched && w.kernel != nil
}

// RequestResync makes the next Sync a resync, as when FullSyncPeriod has
// passed: with a KernelState it compares the table with the writer's
// memory (skipped if the kernel is known to be unchanged since the
// writer's last transaction) and repairs what differs in a partial sync,
// and without one it is full. Call it when Drifted says so. It is safe to
// call from any goroutine. Like every resync, it counts as the periodic
// one: the next is FullSyncPeriod after it.
func (w *Writer) RequestResync() { w.drift.asked.Store(true) }

// Drifted reports whether the table may hold other than what the
// writer's last transaction left: another program committed to it since
// (to any table, for a KernelState that is not a TableWatcher), or that
// transaction's outcome left the writer unsure. It reads the nf_tables
// generation and, if that moved, asks the TableWatcher; it runs no nft
// and reads no element. It reports false when the writer has no
// KernelState (it cannot tell; its periodic resync rewrites the table) or
// its next Sync is full anyway. It also reports true, once a
// FullSyncPeriod has passed, when a comparison since left the endpoints
// maps unlisted (see checkDrift). It must not be called concurrently with
// Sync or Applied, and reads what Applied recorded: call it after the
// outcome of the last Sync was reported. An error is the generation's
// read's.
func (w *Writer) Drifted() (bool, error) {
	if w.kernel == nil || w.needFull || w.unapplied || w.requestFull.Load() {
		return false, nil
	}
	if !w.gt.valid {
		return true, nil
	}
	g, err := w.kernel.Generation()
	if err != nil {
		return false, err
	}
	if g == w.gt.base {
		return w.thoroughPending(), nil
	}
	tw, ok := w.kernel.(TableWatcher)
	if !ok {
		return true, nil
	}
	ch, known := tw.Changes(w.family, w.table, w.gt.base, g)
	return !known || ch.Touched, nil
}

// appliedGen records the generation after a transaction applied without
// error (see genTrack).
func (w *Writer) appliedGen(err error) {
	if w.kernel == nil {
		return
	}
	ok := err == nil && w.gt.g0ok && w.gt.vouch
	if ok {
		g1, gerr := w.kernel.Generation()
		ok = gerr == nil && g1 == nextGen(w.gt.g0, w.gt.batches)
		w.gt.base = g1
	}
	w.gt.valid = ok
	w.gt.g0ok = false
}

// errCheckCount is checkDrift's error when a KernelState answers for
// another number of elements than it was asked about.
var errCheckCount = errors.New("nftables: KernelState.CheckElements answered for another number of elements")

// staticChains are the chains writeStatic writes, whatever the services.
var staticChains = func() map[string]bool {
	m := map[string]bool{servicesChain: true, serviceEndpointsCheckChain: true, nodePortEndpointsCheckChain: true,
		firewallCheckChain: true, clusterIPsCheckChain: true, rejectChain: true, markMasqChain: true, masqueradingChain: true}
	for _, bc := range baseChains {
		m[bc.name] = true
	}
	return m
}()

// checkDrift compares the table with the writer's memory and queues, in
// the phases of the sync being rendered, what repairs the difference:
//   - the elements that are missing or hold another value (deleted first,
//     then added again by the tables' diff);
//   - the static and shared chains that are missing or hold another
//     number of rules (added, flushed and filled again);
//   - what others added to the table: chains (flushed and deleted), sets
//     and maps (deleted, with a TableLister), and elements of the sets it
//     compares (deleted).
//
// It returns false when the comparison is not possible or not enough: the
// table is missing, reading failed, or a per-service chain drifted; the
// sync must then be full, and the deletions of what others added, if
// queued already, stay in it.
//
// With a scope, only the elements in it are compared, and an element in
// it that the writer does not hold is looked up and deleted if present
// (the chains are always compared: they are few). Without one, the
// comparison is thorough at most once a FullSyncPeriod (every time
// without a period, or without a TableLister): every element the writer
// holds is looked up by key and every set listed; in between, with a
// TableLister, the sets are listed but the endpoints and
// nodeport-endpoints maps, whose size is the number of endpoints, and
// elements missing from or added to them are found by key, not their
// values (a verdict changed in place waits for the thorough one, as do
// the endpoints maps). Their keys carry an index below the service's
// endpoint count, so an element another added to them that the writer
// does not hold is never looked up by its rules; looking up every
// element and listing those maps is the costly part of a comparison at
// scale (BENCHMARKS.md).
//
// It does not see a rule changed in place (same count) unless a scope
// names its chain, or the elements of the interval sets (firewall-allow,
// nodeport-ips): neither can be told from the counts and keys it reads.
func (w *Writer) checkDrift(ctx context.Context, logger klog.Logger, scope *TableChanges) (drifted int, ok bool) {
	counts, err := w.kernel.RuleCounts(w.family, w.table)
	if err != nil {
		if errors.Is(err, ErrTableNotFound) {
			logger.Info("The nftables table is missing; rewriting it", "table", w.table, "ipFamily", w.cfg.Family)
			w.needList = true
		} else {
			logger.Error(err, "Reading the nftables table's chains failed; rewriting it", "table", w.table, "ipFamily", w.cfg.Family)
		}
		return 0, false
	}
	foreign, ok := w.dropForeign(logger, counts, scope)
	if !ok {
		return 0, false
	}
	var chains []string
	for _, name := range slices.Sorted(maps.Keys(w.ruleCounts)) {
		if n, found := counts[name]; found && n == w.ruleCounts[name] && (scope == nil || !scope.Chains[name]) {
			continue
		}
		if !staticChains[name] && !isSharedChain(name) {
			logger.Info("A per-service nftables chain drifted; rewriting the table", "table", w.table, "chain", name)
			return 0, false
		}
		chains = append(chains, name)
	}

	// Without a scope, every element is looked up by key only once a
	// FullSyncPeriod (thorough, which costs the kernel most of a
	// comparison); the comparisons between list the sets instead, but
	// the endpoints maps.
	lister, _ := w.kernel.(TableLister)
	thorough := lister == nil || w.thoroughDue()
	var elems []*knftables.Element
	var entries []*elemEntry
	var tabs []*elemTable
	// Keys in the scope that the writer does not hold: looked up with a
	// value of the right shape, which any value the kernel holds differs
	// from or equals.
	var strays []*knftables.Element
	for _, t := range w.tables {
		if t.name == firewallAllowSet {
			continue
		}
		if scope != nil {
			for key := range scope.Elements[t.name] {
				e := t.entries[key]
				switch {
				case e != nil && e.inKernel:
					elems = append(elems, t.element(w, e, &e.written))
					entries = append(entries, e)
					tabs = append(tabs, t)
				case e == nil || !e.isDirty:
					strays = append(strays, w.strayElement(t, key, true))
				}
			}
			continue
		}
		if !thorough {
			continue
		}
		for _, e := range t.entries {
			if e.inKernel {
				elems = append(elems, t.element(w, e, &e.written))
				entries = append(entries, e)
				tabs = append(tabs, t)
			}
		}
	}
	states, err := w.kernel.CheckElements(append(elems, strays...))
	if err == nil && len(states) != len(elems)+len(strays) {
		err = errCheckCount
	}
	if err != nil {
		logger.Error(err, "Comparing the nftables table's elements failed; rewriting it", "table", w.table, "ipFamily", w.cfg.Family)
		return 0, false
	}
	if ctx.Err() != nil {
		return 0, false
	}
	for i, st := range states[len(elems):] {
		if st != ElementMissing {
			w.elemDels = append(w.elemDels, op{opDelete, strays[i]})
			foreign++
		}
	}
	states = states[:len(elems)]

	for i, st := range states {
		if st == ElementPresent {
			continue
		}
		t, e := tabs[i], entries[i]
		if st == ElementDiffers {
			w.elemDels = append(w.elemDels, op{opDelete, elems[i]})
		}
		// Not in the kernel: the tables' diff adds the first claim again.
		e.inKernel = false
		t.count(e.written.value, -1)
		t.markDirty(e)
		drifted++
	}
	if scope == nil && lister != nil {
		missing, stray, ok := w.listElements(logger, lister, thorough)
		if !ok {
			return 0, false
		}
		drifted += missing
		foreign += stray
	}
	if len(chains) > 0 {
		w.rewriteChains(chains)
		drifted += len(chains)
	}
	drifted += foreign
	if drifted > 0 {
		logger.Info("Repairing nftables objects that changed behind the writer", "table", w.table, "ipFamily", w.cfg.Family,
			"objects", drifted, "foreign", foreign, "chains", chains)
	}
	return drifted, true
}

// dropForeign queues the deletion of the chains (from counts) and, with a
// TableLister and without a scope that leaves sets out, of the sets and
// maps that the table holds and the writer did not write. It returns how
// many, and false if the sets could not be listed.
func (w *Writer) dropForeign(logger klog.Logger, counts map[string]int, scope *TableChanges) (int, bool) {
	n := 0
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		if _, ours := w.ruleCounts[name]; !ours {
			logger.Info("Deleting a chain another program added to the nftables table", "table", w.table, "ipFamily", w.cfg.Family, "chain", name)
			w.deleteChain(name)
			n++
		}
	}
	// With a scope, only if it names a set added or deleted (none of
	// the writer's: see readGen).
	lister, ok := w.kernel.(TableLister)
	if !ok || scope != nil && len(scope.Sets) == 0 {
		return n, true
	}
	sets, err := lister.Sets(w.family, w.table)
	if err != nil {
		logger.Error(err, "Listing the nftables table's sets failed; rewriting it", "table", w.table, "ipFamily", w.cfg.Family)
		return 0, false
	}
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		if _, ours := w.drift.sets[name]; ours {
			continue
		}
		logger.Info("Deleting a set another program added to the nftables table", "table", w.table, "ipFamily", w.cfg.Family, "set", name)
		var obj knftables.Object = &knftables.Set{Family: w.family, Table: w.table, Name: name}
		if sets[name] {
			obj = &knftables.Map{Family: w.family, Table: w.table, Name: name}
		}
		w.finalDels = append(w.finalDels, op{opDelete, obj})
		n++
	}
	return n, true
}

// listElements lists the sets and maps the writer compares, and queues
// the addition of the elements it holds that are missing (marked for the
// tables' diff) and the deletion of those it does not hold. It returns
// how many of each. The endpoints and nodeport-endpoints maps are listed
// only when thorough (see checkDrift); otherwise the comparison is
// remembered as partial (thoroughPending).
func (w *Writer) listElements(logger klog.Logger, lister TableLister, thorough bool) (missing, stray int, ok bool) {
	for _, t := range w.tables {
		if t.name == firewallAllowSet {
			continue
		}
		if (t.name == endpointsMap || t.name == nodePortEndpointsMap) && !thorough {
			w.drift.unlisted = true
			continue
		}
		keys, err := lister.ElementKeys(w.family, w.table, t.name)
		if err != nil {
			logger.Error(err, "Listing an nftables set failed; rewriting the table", "table", w.table, "ipFamily", w.cfg.Family, "set", t.name)
			return 0, 0, false
		}
		listed := make(map[string]bool, len(keys))
		for _, key := range keys {
			listed[key] = true
			// An entry not in the kernel and dirty was found to hold
			// another value: its deletion is queued already.
			if e := t.entries[key]; e == nil || !e.inKernel && !e.isDirty {
				w.elemDels = append(w.elemDels, op{opDelete, w.strayElement(t, key, false)})
				stray++
			}
		}
		for key, e := range t.entries {
			if e.inKernel && !listed[key] {
				e.inKernel = false
				t.count(e.written.value, -1)
				t.markDirty(e)
				missing++
			}
		}
	}
	if thorough {
		w.drift.listed, w.drift.unlisted = w.clock.Now(), false
	}
	return missing, stray, true
}

// thoroughDue reports whether a comparison without a scope must look up
// every element and list the endpoints maps: FullSyncPeriod has passed
// since the last that did (or the last full sync), or there is none.
func (w *Writer) thoroughDue() bool {
	return w.cfg.FullSyncPeriod <= 0 || w.clock.Now().Sub(w.drift.listed) >= w.cfg.FullSyncPeriod
}

// thoroughPending reports whether a comparison since the last thorough
// one was not, and a thorough one is due: the next resync must then
// compare even if no one committed since.
func (w *Writer) thoroughPending() bool { return w.drift.unlisted && w.thoroughDue() }

// strayElement returns an element of t with key, as split by nft's " . ",
// that the writer does not hold. With lookup, a map's element gets a
// value of the map's type, for CheckElements (a deletion needs none): a
// verdict, or the loopback address and port 1.
func (w *Writer) strayElement(t *elemTable, key string, lookup bool) *knftables.Element {
	el := &knftables.Element{Family: w.family, Table: w.table, Key: strings.Split(key, " . ")}
	if !t.isMap {
		el.Set = t.name
		return el
	}
	el.Map = t.name
	if !lookup {
		return el
	}
	spec := netlinkSets[t.name]
	if spec.verdict || spec.key == nil {
		el.Value = []string{"drop"}
		return el
	}
	for _, f := range spec.value {
		switch f {
		case fAddr:
			el.Value = append(el.Value, strings.TrimSuffix(w.loopback, "/8"))
		default:
			el.Value = append(el.Value, "1")
		}
	}
	return el
}

// rewriteChains queues the static and shared chains named (added,
// flushed, and their rules added again). writeStatic is rendered aside and
// only those chains' objects are kept, so that the static chains' rules
// have one source.
func (w *Writer) rewriteChains(chains []string) {
	want := make(map[string]bool, len(chains))
	for _, c := range chains {
		want[c] = true
	}
	nChain, nRules, nAdds := len(w.chainOps), len(w.rules), len(w.elemAdds)
	w.writeStatic()
	keep := func(ops []op, from int) []op {
		kept := ops[:from]
		for _, o := range ops[from:] {
			switch obj := o.obj.(type) {
			case *knftables.Chain:
				if want[obj.Name] && o.verb != opDelete {
					kept = append(kept, o)
				}
			case *knftables.Rule:
				if want[obj.Chain] {
					kept = append(kept, o)
				}
			}
		}
		clear(ops[len(kept):])
		return kept
	}
	w.chainOps = keep(w.chainOps, nChain)
	w.rules = keep(w.rules, nRules)
	clear(w.elemAdds[nAdds:])
	w.elemAdds = w.elemAdds[:nAdds]
	for _, c := range chains {
		if isSharedChain(c) {
			w.sharedChain(c, true)
		}
	}
}

// countRules updates the writer's count of the rules of each chain from
// the transaction being rendered: a chain added starts empty unless
// known, a flush empties it, a rule adds one, a deletion forgets it. A
// full sync starts from nothing, since it flushes every chain it writes.
//
// It also keeps the names of the sets and maps the writer left in the
// table, so that a comparison tells them from those others added.
func (w *Writer) countRules(full bool) {
	if full {
		clear(w.ruleCounts)
		clear(w.drift.sets)
		// A full sync flushes every set and map it fills.
		w.drift.listed, w.drift.unlisted = w.lastFull, false
	}
	if w.drift.sets == nil {
		w.drift.sets = map[string]bool{}
	}
	for _, phase := range [][]op{w.chainOps, w.setOps, w.rules, w.finalDels} {
		for _, o := range phase {
			var set string
			switch obj := o.obj.(type) {
			case *knftables.Set:
				set = obj.Name
			case *knftables.Map:
				set = obj.Name
			}
			if set != "" {
				if o.verb == opDelete {
					delete(w.drift.sets, set)
				} else {
					w.drift.sets[set] = true
				}
				continue
			}
			switch obj := o.obj.(type) {
			case *knftables.Chain:
				switch o.verb {
				case opAdd:
					if _, ok := w.ruleCounts[obj.Name]; !ok {
						w.ruleCounts[obj.Name] = 0
					}
				case opFlush:
					w.ruleCounts[obj.Name] = 0
				case opDelete:
					delete(w.ruleCounts, obj.Name)
				}
			case *knftables.Rule:
				w.ruleCounts[obj.Chain]++
			}
		}
	}
}
