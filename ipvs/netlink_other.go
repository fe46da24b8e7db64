//go:build !linux

package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
)

func errNotSupported() error { return fmt.Errorf("%w on %s", ErrNotSupported, runtime.GOOS) }

// Netlink is the kernel implementation of [Interface] and [Batcher]. On
// this platform it cannot be made: [New] returns an error wrapping
// [ErrNotSupported], and every method of a zero Netlink returns one too.
type Netlink struct{}

var (
	_ Interface = (*Netlink)(nil)
	_ Batcher   = (*Netlink)(nil)
)

// New returns an error wrapping [ErrNotSupported]: IPVS needs Linux.
func New(ctx context.Context, opts ...Option) (*Netlink, error) { return nil, errNotSupported() }

// Close does nothing.
func (n *Netlink) Close() {}

// AddVirtualServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) AddVirtualServer(ctx context.Context, vs VirtualServer) error {
	return errNotSupported()
}

// UpdateVirtualServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) UpdateVirtualServer(ctx context.Context, vs VirtualServer) error {
	return errNotSupported()
}

// DeleteVirtualServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) DeleteVirtualServer(ctx context.Context, vs VirtualServer) error {
	return errNotSupported()
}

// GetVirtualServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) GetVirtualServer(ctx context.Context, vs VirtualServer) (VirtualServer, error) {
	return VirtualServer{}, errNotSupported()
}

// ListVirtualServers returns an error wrapping [ErrNotSupported].
func (n *Netlink) ListVirtualServers(ctx context.Context) ([]VirtualServer, error) {
	return nil, errNotSupported()
}

// Flush returns an error wrapping [ErrNotSupported].
func (n *Netlink) Flush(ctx context.Context) error { return errNotSupported() }

// AddRealServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) AddRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	return errNotSupported()
}

// UpdateRealServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) UpdateRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	return errNotSupported()
}

// DeleteRealServer returns an error wrapping [ErrNotSupported].
func (n *Netlink) DeleteRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	return errNotSupported()
}

// ListRealServers returns an error wrapping [ErrNotSupported].
func (n *Netlink) ListRealServers(ctx context.Context, vs VirtualServer) ([]RealServer, error) {
	return nil, errNotSupported()
}

// SetTimeouts returns an error wrapping [ErrNotSupported].
func (n *Netlink) SetTimeouts(ctx context.Context, t Timeouts) error { return errNotSupported() }

// Timeouts returns an error wrapping [ErrNotSupported].
func (n *Netlink) Timeouts(ctx context.Context) (Timeouts, error) {
	return Timeouts{}, errNotSupported()
}

// ApplyBatch returns an error wrapping [ErrNotSupported].
func (n *Netlink) ApplyBatch(ctx context.Context, ops []Op) error { return errNotSupported() }

// DummyBinder is the kernel implementation of [AddressBinder]. On this
// platform it cannot be made: [NewDummyBinder] returns an error wrapping
// [ErrNotSupported].
type DummyBinder struct{}

var _ AddressBinder = (*DummyBinder)(nil)

// NewDummyBinder returns an error wrapping [ErrNotSupported]: dummy
// interfaces need Linux.
func NewDummyBinder(opts ...Option) (*DummyBinder, error) { return nil, errNotSupported() }

// Close does nothing.
func (d *DummyBinder) Close() {}

// EnsureDevice returns an error wrapping [ErrNotSupported].
func (d *DummyBinder) EnsureDevice(ctx context.Context, name string) (bool, error) {
	return false, errNotSupported()
}

// DeleteDevice returns an error wrapping [ErrNotSupported].
func (d *DummyBinder) DeleteDevice(ctx context.Context, name string) error { return errNotSupported() }

// Addresses returns an error wrapping [ErrNotSupported].
func (d *DummyBinder) Addresses(ctx context.Context, name string) ([]netip.Addr, error) {
	return nil, errNotSupported()
}

// Bind returns an error wrapping [ErrNotSupported].
func (d *DummyBinder) Bind(ctx context.Context, name string, addrs ...netip.Addr) error {
	return errNotSupported()
}

// Unbind returns an error wrapping [ErrNotSupported].
func (d *DummyBinder) Unbind(ctx context.Context, name string, addrs ...netip.Addr) error {
	return errNotSupported()
}

// HostAddresses returns an error wrapping [ErrNotSupported].
func (d *DummyBinder) HostAddresses(ctx context.Context, dummy string) ([]netip.Addr, error) {
	return nil, errNotSupported()
}
