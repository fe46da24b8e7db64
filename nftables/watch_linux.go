package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// watchWait bounds how long Untouched waits for the notifications of a
// batch whose generation it was asked about: the kernel bumps the
// generation before it sends them, within the same commit.
const watchWait = time.Second

// KernelWatcher is a KernelState (NewKernelState's) that also follows
// nf_tables' monitor group in its namespace, and so knows which tables
// each committed batch changed (TableWatcher): a periodic resync after
// another program's commit to another table then reads nothing of the
// writer's table. Every commit in the namespace then also costs the
// kernel a notification per object changed, which the watcher reads in a
// goroutine of its own until Close: a large share of the kernel's
// (system) time of a full load (BENCHMARKS.md), so run large transactions
// (a full sync's) inside Quiet. When
// notifications are lost (its socket overflows: a batch of tens of
// thousands of objects), it says so and the writer compares the table
// instead.
type KernelWatcher struct {
	netlinkState
	conn *netlink.Conn

	mu sync.Mutex
	// seen is the generation of the last batch whose notifications were
	// all read; notify is closed when it moves.
	seen   uint32
	notify chan struct{}
	// logs are, per table, what the batches changed.
	logs map[tableKey]*tableLog
	// unknownThrough: what batches up to this generation changed is not
	// known (before the watcher started, or notifications lost).
	unknownThrough uint32
	lostPending    bool
	batch          map[tableKey]*batchChanges
	closed         bool
	done           chan struct{}
	// subs are Notify's channels, by table.
	subs map[tableKey][]chan struct{}
}

type tableKey struct {
	family byte
	table  string
}

// maxLoggedKeys and maxLoggedBatches bound a table's log (element keys,
// batches); past them the log says "everything" for the batches up to
// then. A table nobody asks about (another program's) is never pruned
// otherwise.
const (
	maxLoggedKeys    = 1 << 14
	maxLoggedBatches = 1 << 10
)

// tableLog is what batches changed in one table.
type tableLog struct {
	// last is the last batch that changed the table.
	last uint32
	// allThrough: batches up to this generation changed more than the
	// log lists (valid if hasAll).
	allThrough uint32
	hasAll     bool
	batches    []*batchChanges
	keys       int
}

type batchChanges struct {
	gen      uint32
	all      bool
	chains   map[string]bool
	sets     map[string]bool
	elements map[string]map[string]bool
	keys     int
}

func (b *batchChanges) element(set, key string) {
	if b.elements == nil {
		b.elements = map[string]map[string]bool{}
	}
	if b.elements[set] == nil {
		b.elements[set] = map[string]bool{}
	}
	b.elements[set][key] = true
	b.keys++
}

// record adds to b what the notification m says changed.
func (b *batchChanges) record(m netlink.Message) {
	switch m.Header.Type & 0xff {
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		if b.chains == nil {
			b.chains = map[string]bool{}
		}
		b.chains[attrString(m.Data, unix.NFTA_CHAIN_NAME)] = true
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		if b.chains == nil {
			b.chains = map[string]bool{}
		}
		b.chains[attrString(m.Data, unix.NFTA_RULE_CHAIN)] = true
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		// Anonymous sets come and go with the rules that hold them,
		// whose chains are recorded.
		if flags, ok := attr(m.Data, unix.NFTA_SET_FLAGS); ok && len(flags) == 4 && binary.BigEndian.Uint32(flags)&unix.NFT_SET_ANONYMOUS != 0 {
			return
		}
		if b.sets == nil {
			b.sets = map[string]bool{}
		}
		b.sets[attrString(m.Data, unix.NFTA_SET_NAME)] = true
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		set := attrString(m.Data, unix.NFTA_SET_ELEM_LIST_SET)
		spec, ok := checkSets[set]
		if !ok {
			// Sets the writer does not compare (interval sets).
			return
		}
		list, _ := attr(m.Data, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		keys, ok := elementKeys(list, spec.key, m.Data[0] == unix.NFPROTO_IPV6)
		// No key (a flush of the set, as the kernel may announce it) is
		// everything.
		if !ok || len(keys) == 0 {
			b.all = true
			return
		}
		for _, k := range keys {
			b.element(set, k)
		}
	default:
		// The table, an object: more than can be listed.
		b.all = true
	}
}

// elementKeys decodes the keys of a NFTA_SET_ELEM_LIST_ELEMENTS list as nft
// writes them, or fails on one it cannot read.
func elementKeys(list []byte, fields []field, v6 bool) ([]string, bool) {
	ad, err := netlink.NewAttributeDecoder(list)
	if err != nil {
		return nil, false
	}
	var keys []string
	for ad.Next() {
		k, found, err := nestedAttr(ad.Bytes(), unix.NFTA_SET_ELEM_KEY, unix.NFTA_DATA_VALUE)
		if err != nil {
			return nil, false
		}
		if !found {
			continue
		}
		key, ok := decodeFields(fields, k, v6)
		if !ok {
			return nil, false
		}
		keys = append(keys, key)
	}
	return keys, ad.Err() == nil
}

// protocolNames is protocolNumbers the other way round.
var protocolNames = func() map[byte]string {
	m := make(map[byte]string, len(protocolNumbers))
	for name, n := range protocolNumbers {
		m[n] = name
	}
	return m
}()

// size is how many bytes f takes in a concatenation as encodeFields writes
// it: a whole 32-bit register for each field but an IPv6 address, which
// takes four.
func (f field) size(v6 bool) int {
	if f == fAddr && v6 {
		return 16
	}
	return 4
}

// decodeFields is encodeFields' inverse: the parts joined by " . ".
func decodeFields(fields []field, b []byte, v6 bool) (string, bool) {
	parts := make([]string, 0, len(fields))
	for _, f := range fields {
		n := f.size(v6)
		if len(b) < n {
			return "", false
		}
		v := b[:n]
		b = b[n:]
		switch f {
		case fAddr:
			a, _ := netip.AddrFromSlice(v)
			parts = append(parts, a.String())
		case fProto:
			name, ok := protocolNames[v[0]]
			if !ok {
				return "", false
			}
			parts = append(parts, name)
		case fPort:
			parts = append(parts, strconv.Itoa(int(binary.BigEndian.Uint16(v))))
		case fIndex:
			parts = append(parts, strconv.FormatUint(uint64(binary.NativeEndian.Uint32(v)), 10))
		}
	}
	return strings.Join(parts, " . "), len(b) == 0
}

// WatchKernel starts a KernelWatcher on the network namespace at
// netnsPath ("" for the calling thread's; see NewKernelState). It fails if the monitor group cannot be
// joined. Close stops it.
func WatchKernel(netnsPath string) (*KernelWatcher, error) {
	w := &KernelWatcher{netlinkState: netlinkState{netns: netnsPath}, notify: make(chan struct{}),
		logs: map[tableKey]*tableLog{}, batch: map[tableKey]*batchChanges{}, done: make(chan struct{}),
		subs: map[tableKey][]chan struct{}{}}
	conn, err := w.dial()
	if err != nil {
		return nil, err
	}
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		conn.Close()
		return nil, fmt.Errorf("nftables netlink: joining the nf_tables monitor group: %w", err)
	}
	// Room for the notifications of batches of a few thousand objects
	// (about 1 KB each in the buffer's accounting).
	if err := forceReadBuffer(conn, 16<<20); err != nil {
		conn.Close()
		return nil, err
	}
	// Read after joining: every batch after this generation is seen.
	g, err := w.Generation()
	if err != nil {
		conn.Close()
		return nil, err
	}
	w.conn, w.seen, w.unknownThrough = conn, g, g
	go w.read()
	return w, nil
}

// Quiet runs fn, typically the run of a full sync's transaction, with the
// watcher out of the monitor group, so that the kernel does not build a
// notification for each object fn's batches change. What anyone committed
// meanwhile is unknown to the watcher: Untouched reports false for a range
// that starts before the generation read after fn. Quiet returns fn's
// error, or the error of joining the group again (the watcher then knows
// nothing until Close).
func (w *KernelWatcher) Quiet(fn func() error) error {
	if err := w.conn.LeaveGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("nftables netlink: leaving the nf_tables monitor group: %w", err)
	}
	ferr := fn()
	jerr := w.conn.JoinGroup(unix.NFNLGRP_NFTABLES)
	var g uint32
	if jerr == nil {
		g, jerr = w.Generation()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if jerr != nil {
		w.closed = true
		w.wake()
		return fmt.Errorf("nftables netlink: joining the nf_tables monitor group again: %w", jerr)
	}
	// Batches up to g may never announce their generation; those after
	// it are all seen.
	if genLE(w.unknownThrough, g) {
		w.unknownThrough = g
	}
	if genLE(w.seen, g) {
		w.seen = g
		w.wake()
	}
	return ferr
}

// Close stops the watcher, and closes the socket its Generation keeps
// (see NewKernelState); Untouched then reports false.
func (w *KernelWatcher) Close() error {
	err := w.conn.Close()
	<-w.done
	return errors.Join(err, w.netlinkState.Close())
}

func (w *KernelWatcher) read() {
	defer close(w.done)
	for {
		msgs, err := w.conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				w.mu.Lock()
				w.lostPending = true
				clear(w.batch)
				w.tellAll()
				w.mu.Unlock()
				continue
			}
			w.mu.Lock()
			w.closed = true
			w.wake()
			w.tellAll()
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		for _, m := range msgs {
			if len(m.Data) < 4 || m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
				continue
			}
			if m.Header.Type&0xff != unix.NFT_MSG_NEWGEN {
				// Every object's notification names its table in
				// attribute 1 (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE,
				// NFTA_RULE_TABLE, NFTA_SET_TABLE, ...).
				k := tableKey{m.Data[0], attrString(m.Data, 1)}
				b := w.batch[k]
				if b == nil {
					b = &batchChanges{}
					w.batch[k] = b
				}
				b.record(m)
				continue
			}
			v, ok := attr(m.Data, unix.NFTA_GEN_ID)
			if !ok || len(v) != 4 {
				w.lostPending = true
				continue
			}
			g := binary.BigEndian.Uint32(v)
			for k, b := range w.batch {
				w.logBatch(k, g, b)
				tell(w.subs[k])
			}
			clear(w.batch)
			if w.lostPending {
				w.unknownThrough, w.lostPending = g, false
			}
			// A notification queued before Quiet may come after it
			// moved seen on.
			if genLE(w.seen, g) {
				w.seen = g
			}
			w.wake()
		}
		w.mu.Unlock()
	}
}

func (w *KernelWatcher) logBatch(k tableKey, g uint32, b *batchChanges) {
	l := w.logs[k]
	if l == nil {
		l = &tableLog{}
		w.logs[k] = l
	}
	l.last = g
	b.gen = g
	if b.all || l.keys+b.keys > maxLoggedKeys || len(l.batches) >= maxLoggedBatches {
		l.allThrough, l.hasAll = g, true
		clear(l.batches)
		l.batches, l.keys = l.batches[:0], 0
		return
	}
	l.batches = append(l.batches, b)
	l.keys += b.keys
}

// Notify returns a channel on which the watcher signals, from its own
// goroutine, that a batch committed a change to the table, that it lost
// notifications (the table may have been changed), or that it stopped.
// A signal not yet received is kept, and later ones merge into it: it
// says "look", not how many batches. The watcher signals every batch,
// the caller's own included (except those run inside Quiet); a writer's
// Drifted tells them from others'. The channel is never closed.
func (w *KernelWatcher) Notify(family knftables.Family, table string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	fam, err := nfproto(family)
	if err != nil {
		return ch
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := tableKey{fam, table}
	w.subs[k] = append(w.subs[k], ch)
	return ch
}

// tellAll signals every Notify channel. w.mu is held.
func (w *KernelWatcher) tellAll() {
	for _, chs := range w.subs {
		tell(chs)
	}
}

func tell(chs []chan struct{}) {
	for _, ch := range chs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wake tells the callers of Changes waiting on notify that seen or closed
// moved. w.mu is held.
func (w *KernelWatcher) wake() {
	close(w.notify)
	w.notify = make(chan struct{})
}

// genLE reports whether generation a is not after b, in serial-number
// arithmetic, so that the comparison survives the counter's wrap.
func genLE(a, b uint32) bool { return int32(a-b) <= 0 }

// Changes returns what the batches committed after generation after, up
// to upTo, changed in the table (TableWatcher). It waits up to a second
// for upTo's notifications, and reports false when they do not come, when
// notifications were lost in that range, or when it is closed. It forgets
// what the batches up to after changed: a writer asks with a growing
// after.
func (w *KernelWatcher) Changes(family knftables.Family, table string, after, upTo uint32) (TableChanges, bool) {
	fam, err := nfproto(family)
	if err != nil {
		return TableChanges{}, false
	}
	timeout := time.NewTimer(watchWait)
	defer timeout.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for !genLE(upTo, w.seen) {
		if w.closed {
			return TableChanges{}, false
		}
		ch := w.notify
		w.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			w.mu.Lock()
			return TableChanges{}, false
		}
		w.mu.Lock()
	}
	if w.closed || !genLE(w.unknownThrough, after) {
		return TableChanges{}, false
	}
	l := w.logs[tableKey{fam, table}]
	if l == nil || genLE(l.last, after) {
		return TableChanges{}, true
	}
	kept := l.batches[:0]
	for _, b := range l.batches {
		if genLE(b.gen, after) {
			l.keys -= b.keys
		} else {
			kept = append(kept, b)
		}
	}
	clear(l.batches[len(kept):])
	l.batches = kept
	out := TableChanges{Touched: true}
	if l.hasAll && !genLE(l.allThrough, after) {
		out.All = true
		return out, true
	}
	out.Chains, out.Sets, out.Elements = map[string]bool{}, map[string]bool{}, map[string]map[string]bool{}
	for _, b := range l.batches {
		if !genLE(b.gen, upTo) {
			continue
		}
		out.All = out.All || b.all
		for c := range b.chains {
			out.Chains[c] = true
		}
		for set := range b.sets {
			out.Sets[set] = true
		}
		for set, keys := range b.elements {
			if out.Elements[set] == nil {
				out.Elements[set] = map[string]bool{}
			}
			for k := range keys {
				out.Elements[set][k] = true
			}
		}
	}
	return out, true
}
