//go:build !linux

package nftables

import (
	"fmt"
	"runtime"

	"sigs.k8s.io/knftables"
)

// NewKernelState returns a KernelState whose methods fail with an error
// wrapping [ErrNotSupported]: nf_tables exists on Linux only. A Writer
// given it rewrites its table at every periodic resync, as without one. It
// is an io.Closer, as on Linux, whose Close does nothing.
func NewKernelState(netnsPath string) KernelState { return unsupportedState{} }

// KernelState is NewKernelState: a KernelState whose methods fail.
func (Netlink) KernelState(netnsPath string) KernelState { return unsupportedState{} }

// WatchKernel fails, as the package's WatchKernel does.
func (Netlink) WatchKernel(netnsPath string) (*KernelWatcher, error) { return WatchKernel(netnsPath) }

type unsupportedState struct{}

// errUnsupported is what needs nf_tables' netlink fails with here.
var errUnsupported = fmt.Errorf("%w on %s", ErrNotSupported, runtime.GOOS)

// Close does nothing.
func (unsupportedState) Close() error { return nil }

func (unsupportedState) Generation() (uint32, error) { return 0, errUnsupported }

func (unsupportedState) RuleCounts(knftables.Family, string) (map[string]int, error) {
	return nil, errUnsupported
}

func (unsupportedState) CheckElements([]*knftables.Element) ([]ElementState, error) {
	return nil, errUnsupported
}

func (unsupportedState) Sets(knftables.Family, string) (map[string]bool, error) {
	return nil, errUnsupported
}

func (unsupportedState) ElementKeys(knftables.Family, string, string) ([]string, error) {
	return nil, errUnsupported
}
