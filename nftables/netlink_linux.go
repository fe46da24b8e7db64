package nftables

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netlinkbuf"
)

// ApplyElementBatch sends b to the kernel through nf_tables netlink as one
// batch, which the kernel commits whole or not at all: first every
// deletion (by key), then every addition, in that order, as a Writer's
// transaction orders them. It talks to the network namespace of the
// calling thread, and commits one batch (one nf_tables generation) when it
// succeeds. Each element must name its family and table, as the Writer's
// do, and be one netlinkElement takes (a set or map of the Writer's bulk,
// no comment). It fails before sending anything if one is not, and with
// the kernel's error, having changed nothing, if the kernel refuses the
// batch: a deletion of an element that is not there, an addition whose
// key is there with another value, a set, table or chain that does not
// exist. An empty batch is not sent and is no error. It waits for the
// kernel's acknowledgements at most DefaultCommandTimeout (Netlink sets
// another bound), then fails with an error for which IsCommandTimeout is
// true, not knowing whether the batch was committed.
func ApplyElementBatch(b ElementBatch) error {
	return Netlink{}.ApplyElementBatch(b)
}

// applyElementBatch is ApplyElementBatch bounded by timeout (zero: no
// bound); tests add socket options after the package's own.
//
// The batch is encoded into one buffer (encodeBatch) and sent with one
// sendmsg, without google/nftables' per-element attribute values: a first
// load sends an element per endpoint.
func applyElementBatch(b ElementBatch, timeout time.Duration, testOpts ...func(*netlink.Conn) error) error {
	if b.Len() == 0 {
		return nil
	}
	wb, err := encodeBatch(b)
	if err != nil {
		return err
	}
	msgs := make([]netlink.Message, 0, len(wb.msgs)+2)
	control := func(typ uint16) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request}, Data: batchControlData[:]}
	}
	msgs = append(msgs, control(nfnlMsgBatchBegin))
	for _, m := range wb.msgs {
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(m.typ), Flags: netlink.HeaderFlags(m.flags)}, Data: wb.buf[m.start+nlmsgHeaderLen : m.end]})
	}
	msgs = append(msgs, control(nfnlMsgBatchEnd))
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	defer closeInBackground(conn)
	// The deadline bounds the sending and the acknowledgements: a batch
	// takes no longer to queue than to send.
	for _, opt := range append([]func(*netlink.Conn) error{bigBuffers, deadline(timeout)}, testOpts...) {
		if err := opt(conn); err != nil {
			return err
		}
	}
	what := func() string { return fmt.Sprintf("deleting %d and adding %d elements", len(b.Delete), len(b.Add)) }
	if _, err := conn.SendMessages(msgs); err != nil {
		return requestError(what(), err, timeout)
	}
	// The kernel answers every message that asks for an acknowledgement,
	// each on its own: with an error for one it refused (and the batch
	// is then aborted whole), zero otherwise. Anything else the socket
	// reads is no answer to the batch.
	var errs error
	for answered := 0; answered < len(wb.msgs); {
		msgs, err := conn.Receive()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return requestError(what(), os.ErrDeadlineExceeded, timeout)
			}
			if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOBUFS) {
				// The kernel sends no more after these.
				return fmt.Errorf("nftables netlink: %s: %w", what(), err)
			}
			errs = errors.Join(errs, err)
			answered++
			continue
		}
		for _, m := range msgs {
			if m.Header.Type == netlink.Error {
				answered++
			}
		}
	}
	if errs != nil {
		return fmt.Errorf("nftables netlink: %s: %w", what(), errs)
	}
	return nil
}

// deadline sets a socket's deadline timeout from now; zero sets none.
func deadline(timeout time.Duration) func(*netlink.Conn) error {
	return func(c *netlink.Conn) error {
		if timeout <= 0 {
			return nil
		}
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return fmt.Errorf("nftables netlink: %w", err)
		}
		return nil
	}
}

// closeInBackground closes conn's socket without waiting for the close.
// Releasing a netfilter netlink socket makes the kernel wait for
// nf_tables' release of what earlier batches deleted, an RCU grace period
// (nft_rcv_nl_event flushes the destroy work on every release), which
// lasts many times longer than the batch takes to commit, and is the
// whole cost of nft -f's deletions beyond its exec. The batch is
// committed once its acknowledgements have been read, so nothing waits for the close but the next batch of the namespace,
// should it come within the grace period (the kernel holds nf_tables'
// commit lock meanwhile).
func closeInBackground(conn *netlink.Conn) {
	go func() { _ = conn.Close() }()
}

// bigBuffers lets one batch carry a whole table's elements: a batch goes
// in one sendmsg, which the kernel refuses (EMSGSIZE) beyond
// the socket's send buffer, and reads an acknowledgement per message, which
// the kernel queues at once and drops (ENOBUFS) beyond the receive buffer.
func bigBuffers(c *netlink.Conn) error {
	if err := netlinkbuf.Force(c, 1<<30, 1<<30); err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	return nil
}
