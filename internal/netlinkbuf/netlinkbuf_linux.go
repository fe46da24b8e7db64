package netlinkbuf

import (
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Force sets c's send buffer to send bytes and its receive buffer to
// receive bytes, leaving a size of 0 as it is. It uses SO_SNDBUFFORCE and
// SO_RCVBUFFORCE, which pass the wmem_max and rmem_max caps for a process
// with CAP_NET_ADMIN (which changing nf_tables needs anyway) and fail with
// EPERM for another. The kernel doubles the size for its bookkeeping and
// accounts buffers as used, not reserved, so a large size costs nothing
// until the socket queues that much. It stops at the first option that
// fails and returns its error.
func Force(c *netlink.Conn, send, receive int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		for _, o := range []struct{ opt, size int }{{unix.SO_SNDBUFFORCE, send}, {unix.SO_RCVBUFFORCE, receive}} {
			if sockErr == nil && o.size != 0 {
				sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o.opt, o.size)
			}
		}
	}); err != nil {
		return err
	}
	if sockErr != nil {
		return fmt.Errorf("netlink socket buffers: %w", sockErr)
	}
	return nil
}
