package nftables

import (
	"iter"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// silentSocket is a netlink.Socket over one end of a socket pair whose
// other end, the test's, answers the first answers generation requests
// and then nothing: what it is sent is left unread, and reads wait until
// their deadline, as on a netlink socket whose kernel side hangs.
type silentSocket struct {
	end, peer *os.File
	answers   int
	closed    *atomic.Int32
}

func newSilentSocket(t *testing.T, answers int, closed *atomic.Int32) *silentSocket {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Non-blocking descriptors make Files whose deadlines work.
	return &silentSocket{end: os.NewFile(uintptr(fds[0]), "end"), peer: os.NewFile(uintptr(fds[1]), "peer"), answers: answers, closed: closed}
}

func (s *silentSocket) Close() error {
	s.closed.Add(1)
	s.peer.Close()
	return s.end.Close()
}

func (s *silentSocket) Send(m netlink.Message) error { return s.SendMessages([]netlink.Message{m}) }

func (s *silentSocket) SendMessages(ms []netlink.Message) error {
	for _, m := range ms {
		if s.answers == 0 {
			continue
		}
		s.answers--
		ae := netlink.NewAttributeEncoder()
		ae.Uint32(unix.NFTA_GEN_ID, 7)
		attrs, err := ae.Encode()
		if err != nil {
			return err
		}
		reply := netlink.Message{Header: m.Header, Data: append([]byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, attrs...)}
		reply.Header.Type = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN)
		reply.Header.Length = uint32(unix.NLMSG_HDRLEN + len(reply.Data))
		b, err := reply.MarshalBinary()
		if err != nil {
			return err
		}
		if _, err := s.peer.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func (s *silentSocket) Receive() ([]netlink.Message, error) {
	b := make([]byte, os.Getpagesize())
	n, err := s.end.Read(b)
	if err != nil {
		return nil, err
	}
	var m netlink.Message
	if err := m.UnmarshalBinary(b[:n]); err != nil {
		return nil, err
	}
	return []netlink.Message{m}, nil
}

func (s *silentSocket) ReceiveIter() iter.Seq2[netlink.Message, error] {
	return func(yield func(netlink.Message, error) bool) {
		ms, err := s.Receive()
		if err != nil {
			yield(netlink.Message{}, err)
			return
		}
		for _, m := range ms {
			if !yield(m, nil) {
				return
			}
		}
	}
}

// SyscallConn lets the KernelState size the buffers.
func (s *silentSocket) SyscallConn() (syscall.RawConn, error) { return s.end.SyscallConn() }

func (s *silentSocket) SetDeadline(t time.Time) error      { return s.end.SetDeadline(t) }
func (s *silentSocket) SetReadDeadline(t time.Time) error  { return s.end.SetReadDeadline(t) }
func (s *silentSocket) SetWriteDeadline(t time.Time) error { return s.end.SetWriteDeadline(t) }

// TestKernelStateTimeout checks that each read of a KernelState whose
// requests are never answered gives up at its bound with an error
// IsCommandTimeout recognises, and closes its socket. Generation's kept
// socket, once answered, then silent, is not replaced by a new one for
// the same call (the kernel that did not answer would not answer that
// either), but the next call dials one.
func TestKernelStateTimeout(t *testing.T) {
	const bound = 50 * time.Millisecond
	el := &knftables.Element{Family: knftables.IPv4Family, Table: DefaultTableName, Set: clusterIPsSet, Key: []string{"10.96.0.1"}}
	type counts struct{ Dialled, Closed int32 }
	for _, tc := range []struct {
		name string
		// answers is how many requests the first socket answers.
		answers int
		read    func(KernelState) error
		// want is, after each read, whether it timed out and the
		// sockets dialled and closed so far.
		want []counts
	}{
		{
			name: "Generation", answers: 1,
			read: func(s KernelState) error { _, err := s.Generation(); return err },
			want: []counts{{1, 0}, {1, 1}, {2, 2}},
		},
		{
			name: "RuleCounts",
			read: func(s KernelState) error {
				_, err := s.RuleCounts(knftables.IPv4Family, DefaultTableName)
				return err
			},
			want: []counts{{1, 1}, {2, 2}},
		},
		{
			name: "Sets",
			read: func(s KernelState) error {
				_, err := s.(TableLister).Sets(knftables.IPv4Family, DefaultTableName)
				return err
			},
			want: []counts{{1, 1}, {2, 2}},
		},
		{
			name: "ElementKeys",
			read: func(s KernelState) error {
				_, err := s.(TableLister).ElementKeys(knftables.IPv4Family, DefaultTableName, clusterIPsSet)
				return err
			},
			want: []counts{{1, 1}, {2, 2}},
		},
		{
			name: "CheckElements",
			read: func(s KernelState) error {
				_, err := s.CheckElements([]*knftables.Element{el})
				return err
			},
			want: []counts{{1, 1}, {2, 2}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dialled, closed atomic.Int32
			s := Netlink{Timeout: bound}.KernelState("").(*netlinkState)
			s.dialConn = func() (*netlink.Conn, error) {
				answers := 0
				if dialled.Add(1) == 1 {
					answers = tc.answers
				}
				return netlink.NewConn(newSilentSocket(t, answers, &closed), 1), nil
			}
			t.Cleanup(func() { s.Close() })
			var got []counts
			for call := range tc.want {
				done := make(chan error, 1)
				go func() { done <- tc.read(s) }()
				var err error
				select {
				case err = <-done:
				case <-time.After(time.Minute):
					t.Fatalf("call %d still waits for an answer that never comes", call+1)
				}
				if answered := call < tc.answers; answered != (err == nil) || !answered && !IsCommandTimeout(err) {
					t.Fatalf("call %d: error %v; want a timeout unless the peer answers", call+1, err)
				}
				got = append(got, counts{dialled.Load(), closed.Load()})
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sockets dialled and closed after each call (-want +got):\n%s", diff)
			}
		})
	}
}
