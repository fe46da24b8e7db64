package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
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
// goroutine of its own until Close: measured, that more than doubles the
// kernel's (system) time of a full load of 10,000 services × 10 endpoints,
// so run large transactions (a full sync's) inside Quiet. When
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
	// lastTouch is, per table, the last batch that changed it.
	lastTouch map[tableKey]uint32
	// unknownThrough: what batches up to this generation changed is not
	// known (before the watcher started, or notifications lost).
	unknownThrough uint32
	lostPending    bool
	batch          map[tableKey]bool
	closed         bool
	done           chan struct{}
}

type tableKey struct {
	family byte
	table  string
}

// WatchKernel starts a KernelWatcher on the network namespace netnsFD
// names (see NewKernelState). It fails if the monitor group cannot be
// joined. Close stops it.
func WatchKernel(netnsFD int) (*KernelWatcher, error) {
	w := &KernelWatcher{netlinkState: netlinkState{netns: netnsFD}, notify: make(chan struct{}),
		lastTouch: map[tableKey]uint32{}, batch: map[tableKey]bool{}, done: make(chan struct{})}
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
		close(w.notify)
		w.notify = make(chan struct{})
		return fmt.Errorf("nftables netlink: joining the nf_tables monitor group again: %w", jerr)
	}
	// Batches up to g may never announce their generation; those after
	// it are all seen.
	if genLE(w.unknownThrough, g) {
		w.unknownThrough = g
	}
	if genLE(w.seen, g) {
		w.seen = g
		close(w.notify)
		w.notify = make(chan struct{})
	}
	return ferr
}

// Close stops the watcher; Untouched then reports false.
func (w *KernelWatcher) Close() error {
	err := w.conn.Close()
	<-w.done
	return err
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
				w.mu.Unlock()
				continue
			}
			w.mu.Lock()
			w.closed = true
			close(w.notify)
			w.notify = make(chan struct{})
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
				w.batch[tableKey{m.Data[0], attrString(m.Data, 1)}] = true
				continue
			}
			v, ok := attr(m.Data, unix.NFTA_GEN_ID)
			if !ok || len(v) != 4 {
				w.lostPending = true
				continue
			}
			g := binary.BigEndian.Uint32(v)
			for k := range w.batch {
				w.lastTouch[k] = g
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
			close(w.notify)
			w.notify = make(chan struct{})
		}
		w.mu.Unlock()
	}
}

// genLE reports whether generation a is not after b, in serial-number
// arithmetic, so that the comparison survives the counter's wrap.
func genLE(a, b uint32) bool { return int32(a-b) <= 0 }

// Untouched reports whether the watcher read the notifications of every
// batch committed after generation after, up to upTo, and none changed
// anything in the table. It waits up to a second for upTo's
// notifications, and reports false when they do not come, when
// notifications were lost in that range, or when it is closed.
func (w *KernelWatcher) Untouched(family knftables.Family, table string, after, upTo uint32) bool {
	fam, err := nfproto(family)
	if err != nil {
		return false
	}
	timeout := time.NewTimer(watchWait)
	defer timeout.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for !genLE(upTo, w.seen) {
		if w.closed {
			return false
		}
		ch := w.notify
		w.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			w.mu.Lock()
			return false
		}
		w.mu.Lock()
	}
	if w.closed || !genLE(w.unknownThrough, after) {
		return false
	}
	last, ok := w.lastTouch[tableKey{fam, table}]
	return !ok || genLE(last, after)
}
