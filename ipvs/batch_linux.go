package ipvs

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	// batchSize is how many messages go in one system call; batchRcvBuf
	// has room for an error answer to each (about 1 KiB of socket buffer
	// accounting apiece).
	batchSize   = 512
	batchRcvBuf = 4 << 20
)

// batchSocket sends netlink requests many to a system call. Only the last
// message of each send asks for an acknowledgement: the kernel handles a
// send's messages in order before the call returns and answers every
// failure whether asked or not, so that one acknowledgement closes the send
// and successful messages cost no answer. For tens of thousands of writes
// this is what makes the difference: on an emulated machine, an answer per
// write costs more than the write.
type batchSocket struct {
	mu   sync.Mutex
	sock *nl.NetlinkSocket
	seq  uint32
	buf  []byte
	rbuf []byte
}

// newBatchSocket opens a netlink socket of protocol proto in ns.
func newBatchSocket(ns netns.NsHandle, proto int) (*batchSocket, error) {
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), proto)
	if err != nil {
		return nil, err
	}
	// Forcing the size needs CAP_NET_ADMIN, which the writes need anyway.
	if err := unix.SetsockoptInt(sock.GetFd(), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, batchRcvBuf); err != nil {
		_ = unix.SetsockoptInt(sock.GetFd(), unix.SOL_SOCKET, unix.SO_RCVBUF, batchRcvBuf)
	}
	return &batchSocket{sock: sock}, nil
}

func (s *batchSocket) close() { s.sock.Close() }

// appendHeader appends a netlink message header with a zero length, for
// setLength to fill in once the message is complete.
func appendHeader(b []byte, typ, flags uint16, seq uint32, ack bool) []byte {
	flags |= unix.NLM_F_REQUEST
	if ack {
		flags |= unix.NLM_F_ACK
	}
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	return binary.NativeEndian.AppendUint32(b, 0)
}

// setLength sets the length of the message that starts at b[start:].
func setLength(b []byte, start int) {
	binary.NativeEndian.PutUint32(b[start:], uint32(len(b)-start))
}

// run sends n messages, the i-th appended to a buffer by build with its
// sequence number and whether it asks for an acknowledgement, and returns
// the kernel's errors by message index. An error of its own (a failed
// system call, lost answers) means the outcome of the messages not yet
// answered is unknown.
func (s *batchSocket) run(n int, build func(b []byte, seq uint32, i int, ack bool) []byte) (map[int]error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := map[int]error{}
	for start := 0; start < n; start += batchSize {
		end := min(start+batchSize, n)
		if s.seq > math.MaxUint32-batchSize {
			s.seq = 0 // so that first..last never wraps
		}
		first := s.seq + 1
		s.buf = s.buf[:0]
		for i := start; i < end; i++ {
			s.seq++
			s.buf = build(s.buf, s.seq, i, i == end-1)
		}
		got, err := s.exchange(first, s.seq)
		for seq, e := range got {
			errs[start+int(seq-first)] = e
		}
		if err != nil {
			return errs, fmt.Errorf("messages %d to %d: %w", start, end-1, err)
		}
	}
	return errs, nil
}

// exchange sends s.buf, whose messages are numbered first to last, and
// reads the answers up to the acknowledgement of the last. It returns the
// errors the kernel reported, by sequence number.
func (s *batchSocket) exchange(first, last uint32) (map[uint32]error, error) {
	fd := s.sock.GetFd()
	if err := unix.Sendto(fd, s.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sending: %w", err)
	}
	errs := map[uint32]error{}
	if s.rbuf == nil {
		s.rbuf = make([]byte, 1<<16)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		nr, _, err := unix.Recvfrom(fd, s.rbuf, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			// The kernel answers while handling the send, so this is rare;
			// wait for the socket rather than spin.
			if time.Now().After(deadline) {
				return errs, fmt.Errorf("no acknowledgement after 30s")
			}
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			_, _ = unix.Poll(fds, 1000)
			continue
		}
		if err != nil {
			// ENOBUFS: answers were dropped.
			return errs, fmt.Errorf("reading answers: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(s.rbuf[:nr])
		if err != nil {
			return errs, err
		}
		for _, m := range msgs {
			seq := m.Header.Seq
			if seq < first || seq > last || m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				errs[seq] = syscall.Errno(-code)
			}
			if seq == last {
				return errs, nil
			}
		}
	}
}

// appendAttr appends a netlink attribute, padded to four bytes. With a nil
// value it appends a header for a nested attribute, whose length the caller
// sets with setAttrLength once the children are appended.
func appendAttr(b []byte, typ uint16, val []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// setAttrLength sets the length of the nested attribute at b[start:].
func setAttrLength(b []byte, start int) {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
}

func u16(v uint16) []byte  { return binary.NativeEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte  { return binary.NativeEndian.AppendUint32(nil, v) }
func be16(v uint16) []byte { return []byte{byte(v >> 8), byte(v)} }
