package iptables

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The nfnetlink_acct protocol (linux/netfilter/nfnetlink_acct.h).
const (
	nfnlSubsysAcct = 7
	nfacctMsgNew   = 0
	nfacctMsgGet   = 1

	nfacctAttrName    = 1
	nfacctAttrPackets = 2
	nfacctAttrBytes   = 3
)

// nfacctTimeout bounds one request; the kernel answers at once.
const nfacctTimeout = 5 * time.Second

// netlinkNFAcct is NFAcct over an nfnetlink socket made per request.
type netlinkNFAcct struct {
	netns string
}

var _ NFAcct = (*netlinkNFAcct)(nil)

// NewNFAcct returns the nfacct counters of the network namespace at the
// path netns ("" for the caller's), after checking that the kernel
// has them: it fails, wrapping ErrNotSupported, without nfnetlink_acct
// (CONFIG_NETFILTER_NETLINK_ACCT). Rules that count in them also need the
// xt_nfacct match.
func NewNFAcct(netns string) (NFAcct, error) {
	n := &netlinkNFAcct{netns: netns}
	// A probe: a kernel with nfacct says a counter is missing.
	_, err := n.Get(context.Background(), "proxykit-probe")
	if err != nil && !errors.Is(err, ErrNFAcctNotFound) {
		return nil, fmt.Errorf("%w: nfacct: %w", ErrNotSupported, err)
	}
	return n, nil
}

func (n *netlinkNFAcct) dial() (*netlink.Conn, error) {
	var cfg netlink.Config
	if n.netns != "" {
		fd, err := unix.Open(n.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("nfacct: opening network namespace %s: %w", n.netns, err)
		}
		defer unix.Close(fd)
		cfg.NetNS = fd
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &cfg)
	if err != nil {
		return nil, fmt.Errorf("nfacct: dialing nfnetlink: %w", err)
	}
	return c, nil
}

// request sends one request about the counter name and returns the
// replies.
func (n *netlinkNFAcct) request(ctx context.Context, msg uint16, flags netlink.HeaderFlags, name string) ([][]byte, error) {
	if err := checkNFAcctName(name); err != nil {
		return nil, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.String(nfacctAttrName, name)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	c, err := n.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline := time.Now().Add(nfacctTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("nfacct: %w", err)
	}
	// nfgenmsg: AF_UNSPEC, NFNETLINK_V0, resource id 0.
	data := append([]byte{unix.AF_UNSPEC, 0, 0, 0}, attrs...)
	req, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysAcct<<8 | msg), Flags: netlink.Request | netlink.Acknowledge | flags},
		Data:   data,
	})
	if err != nil {
		return nil, fmt.Errorf("nfacct: %w", err)
	}
	return receiveUntilAck(c, req.Header.Sequence)
}

// receiveUntilAck reads the answers to the request seq up to the
// acknowledgement (or error) that ends them. The kernel flags a counter it
// sends as part of a multi-part answer that no NLMSG_DONE ends, which
// netlink.Conn's Receive would wait for, so the datagrams are read here.
func receiveUntilAck(c *netlink.Conn, seq uint32) ([][]byte, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("nfacct: %w", err)
	}
	buf := make([]byte, 16384)
	var answers [][]byte
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK
		}); err != nil {
			return nil, fmt.Errorf("nfacct: receiving: %w", err)
		}
		if rerr != nil {
			return nil, fmt.Errorf("nfacct: receiving: %w", rerr)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("nfacct: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			if m.Header.Type != unix.NLMSG_ERROR {
				// m.Data is in buf, which the next read overwrites.
				answers = append(answers, bytes.Clone(m.Data))
				continue
			}
			if len(m.Data) < 4 {
				return nil, errors.New("nfacct: short netlink error message")
			}
			if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
				return nil, syscall.Errno(errno)
			}
			return answers, nil
		}
	}
}

// Ensure is part of NFAcct.
func (n *netlinkNFAcct) Ensure(ctx context.Context, name string) error {
	_, err := n.Get(ctx, name)
	if !errors.Is(err, ErrNFAcctNotFound) {
		return err
	}
	// Without NLM_F_EXCL or NLM_F_REPLACE the kernel says EBUSY when the
	// counter was made in between, which is as good.
	_, err = n.request(ctx, nfacctMsgNew, netlink.Create, name)
	if err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("nfacct: creating counter %s: %w", name, err)
	}
	return nil
}

// Get is part of NFAcct.
func (n *netlinkNFAcct) Get(ctx context.Context, name string) (NFAcctCounter, error) {
	answers, err := n.request(ctx, nfacctMsgGet, 0, name)
	if errors.Is(err, unix.ENOENT) {
		return NFAcctCounter{}, fmt.Errorf("nfacct: counter %s: %w", name, ErrNFAcctNotFound)
	}
	if err != nil {
		return NFAcctCounter{}, fmt.Errorf("nfacct: reading counter %s: %w", name, err)
	}
	for _, a := range answers {
		if c, ok := decodeNFAcct(a); ok && c.Name == name {
			return c, nil
		}
	}
	return NFAcctCounter{}, fmt.Errorf("nfacct: counter %s: no answer from the kernel", name)
}

// decodeNFAcct reads a counter from a message's data (an nfgenmsg and
// attributes); ok is false when a value is missing or malformed.
func decodeNFAcct(data []byte) (c NFAcctCounter, ok bool) {
	if len(data) < 4 {
		return c, false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return c, false
	}
	seen := 0
	for ad.Next() {
		switch ad.Type() {
		case nfacctAttrName:
			c.Name = ad.String()
			seen |= 1
		case nfacctAttrPackets, nfacctAttrBytes:
			b := ad.Bytes()
			if len(b) != 8 {
				return c, false
			}
			// The kernel sends both in network byte order.
			if ad.Type() == nfacctAttrPackets {
				c.Packets, seen = binary.BigEndian.Uint64(b), seen|2
			} else {
				c.Bytes, seen = binary.BigEndian.Uint64(b), seen|4
			}
		}
	}
	return c, ad.Err() == nil && seen == 7
}
