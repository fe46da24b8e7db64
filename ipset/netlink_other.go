//go:build !linux

package ipset

import (
	"context"
	"fmt"
	"runtime"
)

// Netlink is the kernel implementation of [Interface]. On this platform it
// cannot be made: [New] returns an error wrapping [ErrNotSupported], and
// every method of a zero Netlink returns one too.
type Netlink struct{}

var _ Interface = (*Netlink)(nil)

func errNotSupported() error { return fmt.Errorf("%w on %s", ErrNotSupported, runtime.GOOS) }

// New returns an error wrapping [ErrNotSupported]: ipsets need Linux.
func New(opts ...Option) (*Netlink, error) { return nil, errNotSupported() }

// Close does nothing.
func (n *Netlink) Close() {}

// Create returns an error wrapping [ErrNotSupported].
func (n *Netlink) Create(ctx context.Context, set Set) error { return errNotSupported() }

// Destroy returns an error wrapping [ErrNotSupported].
func (n *Netlink) Destroy(ctx context.Context, name string) error { return errNotSupported() }

// Flush returns an error wrapping [ErrNotSupported].
func (n *Netlink) Flush(ctx context.Context, name string) error { return errNotSupported() }

// Swap returns an error wrapping [ErrNotSupported].
func (n *Netlink) Swap(ctx context.Context, a, b string) error { return errNotSupported() }

// Add returns an error wrapping [ErrNotSupported].
func (n *Netlink) Add(ctx context.Context, name string, entry Entry) error { return errNotSupported() }

// Del returns an error wrapping [ErrNotSupported].
func (n *Netlink) Del(ctx context.Context, name string, entry Entry) error { return errNotSupported() }

// Test returns an error wrapping [ErrNotSupported].
func (n *Netlink) Test(ctx context.Context, name string, entry Entry) (bool, error) {
	return false, errNotSupported()
}

// ListEntries returns an error wrapping [ErrNotSupported].
func (n *Netlink) ListEntries(ctx context.Context, name string) ([]Entry, error) {
	return nil, errNotSupported()
}

// ListSets returns an error wrapping [ErrNotSupported].
func (n *Netlink) ListSets(ctx context.Context) ([]SetInfo, error) { return nil, errNotSupported() }

// Version returns an error wrapping [ErrNotSupported].
func (n *Netlink) Version(ctx context.Context) (Version, error) { return Version{}, errNotSupported() }
