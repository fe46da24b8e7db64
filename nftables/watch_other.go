//go:build !linux

package nftables

import "sigs.k8s.io/knftables"

// KernelWatcher follows nf_tables' monitor group, which exists on Linux
// only.
type KernelWatcher struct{ unsupportedState }

// WatchKernel fails with an error wrapping [ErrNotSupported]: nf_tables
// exists on Linux only.
func WatchKernel(netnsPath string) (*KernelWatcher, error) { return nil, errUnsupported }

// Quiet returns fn's error.
func (*KernelWatcher) Quiet(fn func() error) error { return fn() }

// Close does nothing.
func (*KernelWatcher) Close() error { return nil }

// Changes reports false: nothing is known.
func (*KernelWatcher) Changes(knftables.Family, string, uint32, uint32) (TableChanges, bool) {
	return TableChanges{}, false
}

// Notify returns a channel that is never signalled.
func (*KernelWatcher) Notify(knftables.Family, string) <-chan struct{} { return make(chan struct{}) }
