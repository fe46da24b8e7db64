package netlinkbuf

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// TestForce checks that each size lands on its own buffer, past the
// rmem_max and wmem_max caps (a few hundred KB by default), and that a
// size of 0 leaves its buffer as it was.
func TestForce(t *testing.T) {
	kerneltest.Require(t)
	ns := kerneltest.NewNS(t)
	const big = 8 << 20
	for _, tc := range []struct {
		name          string
		send, receive int
	}{
		{"both", big, big},
		{"receive only", 0, big},
		{"send only", big, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns.Handle())})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			before := buffers(t, c)
			if err := Force(c, tc.send, tc.receive); err != nil {
				t.Fatal(err)
			}
			// The kernel stores twice the size asked for.
			want := before
			if tc.send != 0 {
				want[0] = 2 * tc.send
			}
			if tc.receive != 0 {
				want[1] = 2 * tc.receive
			}
			if diff := cmp.Diff(want, buffers(t, c)); diff != "" {
				t.Errorf("[send, receive] buffers (-want +got):\n%s", diff)
			}
		})
	}
}

func buffers(t *testing.T, c *netlink.Conn) [2]int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var out [2]int
	var errs [2]error
	if err := raw.Control(func(fd uintptr) {
		out[0], errs[0] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		out[1], errs[1] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	}); err != nil {
		t.Fatal(err)
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}
